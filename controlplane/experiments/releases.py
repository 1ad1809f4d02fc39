"""A service's release lifecycle (architecture §7): its stable version, and what each
moment of an experiment does to it. Pure: no I/O, no clock.

    start of a draft following the       → the draft takes the stable version as it is
      stable version                       now as its baseline, then as below
    start, no stable version            → seeded: the experiment's baseline becomes it
    start on another baseline           → rebased: the experiment's baseline becomes it
    start on the stable version         → nothing to record
    promoted                            → promoted: the canary becomes the stable version
    rolled back, aborted after a start  → recorded; the stable version stays

While an experiment is active its baseline is the stable version, so the route a
finished experiment leaves (routing.build: the stable version alone) and the stable
version in SQL always name the same upstream.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from controlplane.experiments.store import ExperimentRecord
from controlplane.kernel.errors import FieldError, ValidationFailed
from controlplane.kernel.routes import RouteState


class ReleaseKind(StrEnum):
    SEEDED = "seeded"
    REBASED = "rebased"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Version:
    """A version of a service: where it answers, and its label (None: unlabelled)."""

    upstream: str
    label: str | None = None

    def describe(self) -> str:
        return f"{self.label} ({self.upstream})" if self.label else self.upstream


@dataclass(frozen=True)
class StableRecord:
    """A service's stable version as stored, at `version` (grows with each write)."""

    service: str
    current: Version
    experiment_id: int | None
    since: datetime
    version: int


@dataclass(frozen=True)
class ReleaseChange:
    """One entry for the release history; `before` None: the service had no stable version."""

    kind: ReleaseKind
    before: Version | None
    after: Version
    reason: str

    @property
    def moves_stable(self) -> bool:
        return self.before != self.after


@dataclass(frozen=True)
class ReleaseRecord:
    id: int
    service: str
    at: datetime
    kind: ReleaseKind
    experiment_id: int | None
    before: Version | None
    after: Version
    actor: str
    reason: str


class NoStableVersion(ValidationFailed):
    """An experiment left out its baseline on a service with no stable version."""

    def __init__(self, service: str) -> None:
        super().__init__(
            f"service {service!r} has no stable version yet: give variants.baseline",
            [FieldError(("body", "variants", "baseline"),
                        f"required: service {service!r} has no stable version yet; its "
                        "first experiment names the baseline, which becomes the stable "
                        "version when it starts")],
        )


def baseline_of(experiment: ExperimentRecord) -> Version:
    return Version(experiment.baseline_upstream, experiment.baseline_version)


def canary_of(experiment: ExperimentRecord) -> Version:
    return Version(experiment.canary_upstream, experiment.canary_version)


def default_baseline(
    service: str, *, given: Version | None, stable: StableRecord | None
) -> Version:
    """The baseline of a new experiment: the one given, else the stable version.

    A baseline given with the stable version's upstream and no label takes the stable
    version's label, so the two read as the same version."""
    if given is None:
        if stable is None:
            raise NoStableVersion(service)
        return stable.current
    if stable is not None and given.label is None and given.upstream == stable.current.upstream:
        return stable.current
    return given


def baseline_at_start(
    experiment: ExperimentRecord, stable: StableRecord | None
) -> Version | None:
    """The baseline a starting experiment takes in place of its own: the stable version
    as it is now, for a draft that left its baseline out (the stable version may have
    moved since the draft was made); None: it keeps its own."""
    if not experiment.baseline_follows_stable or stable is None:
        return None
    return None if stable.current == baseline_of(experiment) else stable.current


def release_at_start(
    experiment: ExperimentRecord, stable: StableRecord | None
) -> ReleaseChange | None:
    """What starting `experiment` does to the stable version: its baseline becomes it."""
    baseline = baseline_of(experiment)
    if stable is None:
        return ReleaseChange(
            ReleaseKind.SEEDED, None, baseline,
            f"experiment {experiment.id} started on {baseline.describe()}, the service's "
            "first stable version",
        )
    if stable.current == baseline:
        return None
    return ReleaseChange(
        ReleaseKind.REBASED, stable.current, baseline,
        f"experiment {experiment.id} started on {baseline.describe()} in place of the "
        f"stable version {stable.current.describe()}",
    )


def release_at_end(
    experiment: ExperimentRecord, route_state: RouteState, *, aborted: bool,
    stable: StableRecord | None,
) -> ReleaseChange | None:
    """What an experiment's last route (`route_state`) does to the stable version;
    None for a route that does not end the experiment."""
    before = stable.current if stable is not None else None
    if route_state is RouteState.PROMOTED:
        canary = canary_of(experiment)
        return ReleaseChange(
            ReleaseKind.PROMOTED, before, canary,
            f"experiment {experiment.id} promoted {canary.describe()} to stable",
        )
    if route_state is RouteState.ROLLED_BACK:
        # an experiment started before stable versions were kept may find none: its
        # baseline is what the route leaves in force
        kept = before if before is not None else baseline_of(experiment)
        kind = ReleaseKind.ABORTED if aborted else ReleaseKind.ROLLED_BACK
        verb = "aborted" if aborted else "rolled back"
        return ReleaseChange(
            kind, before, kept,
            f"experiment {experiment.id} {verb}: {kept.describe()} stays stable",
        )
    return None
