"""Recording a release in the unit of work that commits the route putting it in force
(architecture §7): the API's actions (experiments.actions) and the controller's
decisions (controller.apply) call `record_release_of` right after they commit an
experiment's first or last route, so the stable version, the release history and the
route never disagree, whichever of the two ended the experiment. The event of that
action or decision carries the release in its payload (`release`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from controlplane.experiments.releases import (
    ReleaseRecord,
    Version,
    baseline_at_start,
    release_at_end,
    release_at_start,
)
from controlplane.experiments.store import ExperimentRecord, StoreTransaction
from controlplane.kernel.routes import RouteState

ENDING_ROUTES = frozenset({RouteState.PROMOTED, RouteState.ROLLED_BACK})


async def follow_stable_version(
    tx: StoreTransaction, *, experiment: ExperimentRecord, now: datetime
) -> tuple[ExperimentRecord, Version | None]:
    """A starting draft that left its baseline out takes the stable version as it is
    now; returns the experiment and the baseline it took (None: it kept its own)."""
    if not experiment.baseline_follows_stable:
        return experiment, None
    stable = await tx.load_stable_version(service=experiment.service)
    baseline = baseline_at_start(experiment, stable)
    if baseline is None:
        return experiment, None
    spec = replace(experiment.spec, baseline_upstream=baseline.upstream,
                   baseline_version=baseline.label)
    return await tx.save_spec(experiment=experiment, spec=spec, now=now), baseline


def version_payload(version: Version | None) -> dict[str, str | None] | None:
    if version is None:
        return None
    return {"upstream": version.upstream, "version": version.label}


def release_payload(release: ReleaseRecord) -> dict[str, object]:
    """What the event of the action or decision behind a release says of it."""
    return {
        "id": release.id,
        "kind": release.kind.value,
        "stable_before": version_payload(release.before),
        "stable_after": version_payload(release.after),
        "reason": release.reason,
    }


async def record_release_of(
    tx: StoreTransaction,
    *,
    experiment: ExperimentRecord,
    route_state: RouteState,
    starting: bool,
    aborted: bool,
    actor: str,
    at: datetime,
) -> ReleaseRecord | None:
    """Record what the route just committed (`route_state`; `starting`: the
    experiment's first) does to its service's stable version; None when nothing."""
    if not starting and route_state not in ENDING_ROUTES:
        return None
    stable = await tx.load_stable_version(service=experiment.service)
    if starting:
        change = release_at_start(experiment, stable)
    else:
        change = release_at_end(experiment, route_state, aborted=aborted, stable=stable)
    if change is None:
        return None
    return await tx.record_release(
        service=experiment.service, experiment_id=experiment.id, change=change, actor=actor,
        at=at,
    )
