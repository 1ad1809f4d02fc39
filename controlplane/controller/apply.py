"""Applying one decision: the experiment row, the route and the events, all or nothing.

    load (version check) → write the row (flush) → publish the fenced route → events → commit

The row is flushed first so a concurrent API action (pause, promote…) wins: the
version check fails and nothing is published. The route goes out before the
commit; if etcd refuses (RevisionConflict, NotLeader) or is down, the transaction
rolls back, and the next round decides again from fresh state.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from controlplane.db import experiments as records
from controlplane.db.models import Experiment
from controlplane.decision.model import Decision, Promote, Rollback
from controlplane.experiments.actions import route_source, utc_now
from controlplane.kernel.errors import RevisionConflict
from controlplane.kernel.kv import Fence
from controlplane.kernel.routes import Route, RouteState
from controlplane.kernel.rules import BreakerRule
from controlplane.routing.publish import publish_route
from controlplane.runtime import Backends


def _write_row(
    *, session: Session, experiment_id: int, version: int, decision: Decision, at: Any
) -> Experiment:
    experiment = records.get_experiment(session=session, experiment_id=experiment_id)
    if experiment.version != version:
        raise RevisionConflict(
            f"experiment {experiment_id} changed (version {version} → {experiment.version})"
        )
    state = decision.new_state
    if any(isinstance(a, Promote) for a in decision.actions):
        experiment.state = "promoted"
    elif any(isinstance(a, Rollback) for a in decision.actions):
        experiment.state = "rolled_back"
    if experiment.breaker_state != state.breaker.value:
        experiment.breaker_changed_at = at
    experiment.breaker_state = state.breaker.value
    experiment.trips = state.trips
    if experiment.current_step != state.step_index:
        experiment.step_started_at = at
    experiment.current_step = state.step_index
    experiment.canary_weight_bp = state.canary_bp
    experiment.rollout_state = {
        **state.to_dict(),
        "next_check_at": decision.next_check_at,
        "last_reason": decision.reason,
    }
    experiment.updated_at = at
    session.flush()
    return experiment


def fence_entry(fence: Fence) -> dict[str, Any]:
    """Which leadership term decided (and fenced the route write), for an event's
    payload: the etcd create revision of the leader's election key, whose value
    names it."""
    return {"key": fence.key, "revision": fence.create_revision}


def _record(
    *, session: Session, experiment: Experiment, decision: Decision, rule: BreakerRule,
    route: Route | None, fence: Fence | None, at: Any,
) -> None:
    for event in decision.events:
        payload: dict[str, Any] = dict(event.payload)
        payload["rule"] = rule.model_dump(mode="json")
        if route is not None:
            payload["route_revision"] = route.revision
        if fence is not None:
            payload["leader_fence"] = fence_entry(fence)
        records.record_event(
            session=session,
            experiment_id=experiment.id,
            service=experiment.service,
            at=at,
            actor="controller",
            kind=event.kind.value,
            from_state=str(payload.get("from", "")) or None,
            to_state=str(payload.get("to", "")) or None,
            reason=event.reason,
            payload=payload,
        )


async def publish_for_row(
    backends: Backends,
    row: Experiment,
    *,
    canary_bp: int,
    state: RouteState,
    fence: Fence | None,
) -> Route:
    """Publish the route `row` owns and note its revision in the row, inside the
    transaction that holds the row (a route write between flush and commit)."""
    route = await publish_route(
        backends.kv,
        backends.keys,
        experiment=route_source(row),
        canary_bp=canary_bp,
        state=state,
        fence=fence,
    )
    row.route_revision = route.revision
    return route


async def apply_decision(
    backends: Backends,
    *,
    experiment_id: int,
    version: int,
    decision: Decision,
    rule: BreakerRule,
    fence: Fence | None,
) -> Route | None:
    at = utc_now(backends.clock)
    async with backends.database.transaction() as tx:
        experiment = await tx.run(
            _write_row, experiment_id=experiment_id, version=version, decision=decision, at=at
        )
        route: Route | None = None
        write = decision.route_write
        if write is not None:
            route = await publish_for_row(
                backends, experiment, canary_bp=write.canary_bp, state=write.route_state,
                fence=fence,
            )
        await tx.run(
            _record, experiment=experiment, decision=decision, rule=rule, route=route,
            fence=fence, at=at,
        )
    return route
