"""The release lifecycle's pure decisions (experiments.releases): which baseline a new
experiment takes, and what each start and end does to the service's stable version."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.experiments.releases import (
    NoStableVersion,
    ReleaseKind,
    StableRecord,
    Version,
    baseline_at_start,
    default_baseline,
    release_at_end,
    release_at_start,
)
from controlplane.experiments.store import ExperimentRecord, StepRecord
from controlplane.kernel.routes import RouteState

AT = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
V1 = Version("http://shop-v1:8080", "v1")
V2 = Version("http://shop-v2:8080", "v2")
V3 = Version("http://shop-v3:8080", None)


def experiment(
    baseline: Version = V1, canary: Version = V2, *, follows: bool = False
) -> ExperimentRecord:
    return ExperimentRecord(
        id=7, name="shop v2", service="shop", state=ExperimentState.RUNNING, salt="s",
        baseline_upstream=baseline.upstream, canary_upstream=canary.upstream,
        steps=(StepRecord(0, 1000, 10),), sticky_header="x-user-id", sticky_cookie=None,
        rule=None, current_step=0, canary_weight_bp=1000, breaker_state=BreakerState.CLOSED,
        trips=0, step_started_at=AT, breaker_changed_at=AT, route_revision=1,
        rollout_state=None, created_at=AT, updated_at=AT, version=1,
        baseline_version=baseline.label, canary_version=canary.label,
        baseline_follows_stable=follows,
    )  # fmt: skip


def stable(version: Version) -> StableRecord:
    return StableRecord(service="shop", current=version, experiment_id=3, since=AT, version=1)


# --- the baseline of a new experiment


@pytest.mark.parametrize(
    ("given", "current", "expected"),
    [
        (None, V1, V1),  # left out: the stable version
        (V2, V1, V2),  # given: as given, whatever the stable version
        (V2, None, V2),  # the first experiment names it
        # the stable version's upstream without a label reads as the stable version
        (Version(V1.upstream), V1, V1),
        (Version(V1.upstream, "v1-hotfix"), V1, Version(V1.upstream, "v1-hotfix")),
    ],
)
def test_a_new_experiment_takes_the_baseline_given_else_the_stable_version(
    given: Version | None, current: Version | None, expected: Version
) -> None:
    found = stable(current) if current is not None else None
    assert default_baseline("shop", given=given, stable=found) == expected


def test_leaving_the_baseline_out_without_a_stable_version_names_the_field() -> None:
    with pytest.raises(NoStableVersion) as caught:
        default_baseline("shop", given=None, stable=None)
    assert [e.loc for e in caught.value.errors] == [("body", "variants", "baseline")]
    assert "no stable version" in str(caught.value)


# --- the start


@pytest.mark.parametrize(
    ("follows", "current", "expected"),
    [
        (True, V2, V2),  # promoted since the draft was made: the draft takes it
        (True, V1, None),  # the same version: nothing to change
        (True, None, None),  # no stable version: the draft's own baseline seeds it
        (False, V2, None),  # a baseline given by hand is kept
    ],
)
def test_a_draft_that_left_its_baseline_out_takes_the_stable_version_at_its_start(
    follows: bool, current: Version | None, expected: Version | None
) -> None:
    found = stable(current) if current is not None else None
    assert baseline_at_start(experiment(V1, V3, follows=follows), found) == expected


def test_the_first_start_of_a_service_seeds_its_stable_version() -> None:
    change = release_at_start(experiment(V1, V2), None)
    assert change is not None
    assert (change.kind, change.before, change.after) == (ReleaseKind.SEEDED, None, V1)
    assert change.moves_stable
    assert "v1 (http://shop-v1:8080)" in change.reason


def test_a_start_on_the_stable_version_records_nothing() -> None:
    assert release_at_start(experiment(V1, V2), stable(V1)) is None


def test_a_start_on_another_baseline_rebases_the_stable_version() -> None:
    change = release_at_start(experiment(V3, V2), stable(V1))
    assert change is not None
    assert (change.kind, change.before, change.after) == (ReleaseKind.REBASED, V1, V3)


# --- the end


def test_promotion_makes_the_canary_the_stable_version() -> None:
    change = release_at_end(experiment(V1, V2), RouteState.PROMOTED, aborted=False,
                            stable=stable(V1))
    assert change is not None
    assert (change.kind, change.before, change.after) == (ReleaseKind.PROMOTED, V1, V2)
    assert change.moves_stable and "promoted v2" in change.reason


@pytest.mark.parametrize(
    ("aborted", "kind"), [(False, ReleaseKind.ROLLED_BACK), (True, ReleaseKind.ABORTED)]
)
def test_a_rollback_or_an_abort_keeps_the_stable_version(aborted: bool, kind: ReleaseKind) -> None:
    change = release_at_end(experiment(V1, V2), RouteState.ROLLED_BACK, aborted=aborted,
                            stable=stable(V1))
    assert change is not None
    assert (change.kind, change.before, change.after) == (kind, V1, V1)
    assert not change.moves_stable and "stays stable" in change.reason


def test_an_experiment_from_before_stable_versions_ends_on_its_baseline() -> None:
    """Started before the service had a stable version kept: its baseline is what the
    rollback's route leaves in force, so it becomes the stable version."""
    change = release_at_end(experiment(V1, V2), RouteState.ROLLED_BACK, aborted=False,
                            stable=None)
    assert change is not None and (change.before, change.after) == (None, V1)
    assert change.moves_stable
    promoted = release_at_end(experiment(V1, V2), RouteState.PROMOTED, aborted=False,
                              stable=None)
    assert promoted is not None and (promoted.before, promoted.after) == (None, V2)


@pytest.mark.parametrize(
    "state", [RouteState.RUNNING, RouteState.PAUSED, RouteState.TRIPPED, RouteState.HALF_OPEN]
)
def test_a_route_that_does_not_end_the_experiment_records_nothing(state: RouteState) -> None:
    assert release_at_end(experiment(), state, aborted=False, stable=stable(V1)) is None


def test_an_unlabelled_version_is_described_by_its_upstream() -> None:
    assert V3.describe() == "http://shop-v3:8080"
    assert replace(V3, label="v3").describe() == "v3 (http://shop-v3:8080)"
