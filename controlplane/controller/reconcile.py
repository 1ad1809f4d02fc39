"""Bringing a service's route in etcd back in line with the experiment row that owns it.

A route is written between the row's flush and the commit (controller.apply,
experiments.actions). If the commit, or anything else after the etcd write, fails,
etcd keeps a route the database never learned of: its revision is above the row's
`route_revision`, and the sidecars follow it while the row (what users see and what
the controller decides from) still describes the previous one. The row is the source
of truth, so the leader publishes the route the row describes again, with a higher
revision, and records `route_reconciled` in the transaction that stores it.

    drift? (pure) → lock the row (flush) → drift? again → publish, fenced → record → commit
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from controlplane.controller.apply import fence_entry, publish_for_row
from controlplane.db import experiments as records
from controlplane.db.models import Experiment
from controlplane.experiments.actions import utc_now
from controlplane.experiments.lifecycle import route_state_of
from controlplane.kernel.errors import RevisionConflict, ValidationFailed
from controlplane.kernel.kv import Fence, KeyValueStore
from controlplane.kernel.routes import CANARY, Route, RouteState, parse_route
from controlplane.runtime import Backends

ROUTE_RECONCILED = "route_reconciled"


@dataclass(frozen=True)
class RowRoute:
    """The route an experiment row describes (`state` None: it describes none)."""

    experiment: int
    route_revision: int
    canary_bp: int
    state: RouteState | None


@dataclass(frozen=True)
class RouteDrift:
    """A stored route newer than the row knows, and the route the row describes."""

    stored: Route
    known_revision: int
    canary_bp: int
    state: RouteState


def row_route(experiment: Experiment) -> RowRoute:
    return RowRoute(
        experiment=experiment.id,
        route_revision=experiment.route_revision,
        canary_bp=experiment.canary_weight_bp,
        state=route_state_of(experiment.state, experiment.breaker_state),
    )


def route_drift(row: RowRoute, stored: Route | None) -> RouteDrift | None:
    """The drift to repair, or None when etcd holds nothing newer than the row knows.

    Every committed route write stores its revision in the row, and revisions only
    grow (routing.publish), so a stored revision above the row's is a write whose
    transaction never committed. Whichever experiment that route names: a row that
    describes a route is the one its service's route belongs to (the database allows
    one active experiment per service). A missing, unreadable or older stored route
    is no uncommitted write, and not repaired here.
    """
    if row.state is None or stored is None or stored.revision <= row.route_revision:
        return None
    return RouteDrift(stored, row.route_revision, row.canary_bp, row.state)


async def stored_route(kv: KeyValueStore, key: str) -> Route | None:
    current = await kv.get(key)
    if current is None:
        return None
    try:
        return parse_route(current.value)
    except ValidationFailed:
        return None


def _lock_row(*, session: Session, experiment_id: int, version: int, at: datetime) -> Experiment:
    """The row as the round read it, written (flushed) so no action on it is in flight.

    An action publishes its route after flushing the row and commits after: the
    flush here waits for such a transaction to end, then fails (RevisionConflict) if
    it committed. So a drift seen after this flush is a transaction that rolled back,
    never one about to commit.
    """
    experiment = records.get_experiment(session=session, experiment_id=experiment_id)
    if experiment.version != version:
        raise RevisionConflict(
            f"experiment {experiment_id} changed (version {version} → {experiment.version})"
        )
    experiment.updated_at = at
    session.flush()
    return experiment


def route_fields(route: Route) -> dict[str, Any]:
    """A route as an event's payload names it."""
    return {
        "experiment": route.experiment,
        "revision": route.revision,
        "canary_weight_bp": route.weight_of(CANARY),
        "state": route.state.value,
    }


def _record(
    *,
    session: Session,
    experiment: Experiment,
    drift: RouteDrift,
    route: Route,
    fence: Fence | None,
    at: datetime,
) -> None:
    stored = drift.stored
    payload: dict[str, Any] = {
        "stored": route_fields(stored),
        "restored": route_fields(route),
        "row_route_revision": drift.known_revision,
        "route_revision": route.revision,
    }
    if fence is not None:
        payload["leader_fence"] = fence_entry(fence)
    records.record_event(
        session=session,
        experiment_id=experiment.id,
        service=experiment.service,
        at=at,
        actor="controller",
        kind=ROUTE_RECONCILED,
        reason=(
            f"route revision {stored.revision} in etcd (canary {stored.weight_of(CANARY)} bp, "
            f"{stored.state.value}) was never committed; the experiment knew revision "
            f"{drift.known_revision}: re-published canary {route.weight_of(CANARY)} bp, "
            f"{route.state.value} as revision {route.revision}"
        ),
        payload=payload,
    )


async def reconcile_route(
    backends: Backends, *, experiment: Experiment, fence: Fence | None
) -> Route | None:
    """Re-publish the route `experiment` describes if etcd holds a newer one.

    `experiment` is the row as the round read it (detached). Returns the route
    written, or None when the two agree (one etcd read, no SQL).
    """
    key = backends.keys.route(experiment.service)
    if route_drift(row_route(experiment), await stored_route(backends.kv, key)) is None:
        return None
    at = utc_now(backends.clock)
    async with backends.database.transaction() as tx:
        row = await tx.run(
            _lock_row, experiment_id=experiment.id, version=experiment.version, at=at
        )
        drift = route_drift(row_route(row), await stored_route(backends.kv, key))
        if drift is None:
            raise RevisionConflict(f"the route of {experiment.service!r} changed meanwhile")
        route = await publish_for_row(
            backends, row, canary_bp=drift.canary_bp, state=drift.state, fence=fence
        )
        await tx.run(_record, experiment=row, drift=drift, route=route, fence=fence, at=at)
    return route
