"""Applying one decision: the experiment row, its desired route and the events, in one
transaction, and nothing else.

    load (version check) → write the row → the desired route (db.routes) → events
    → commit → wake the reconciler

The row's version check makes a concurrent API action (pause, promote…) win: the
commit fails and the next round decides again from fresh state. No route reaches
etcd from here: the leader's reconciler publishes the committed one (within
milliseconds, woken by the commit), so a failed commit leaves nothing behind.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from controlplane.controller.reconciler import fence_entry
from controlplane.db import experiments as records
from controlplane.db import routes as desired_routes
from controlplane.db.models import Experiment
from controlplane.decision.model import Decision, Promote, Rollback
from controlplane.kernel.clock import utc_now
from controlplane.kernel.errors import RevisionConflict
from controlplane.kernel.kv import Fence
from controlplane.kernel.routes import Route
from controlplane.kernel.rules import BreakerRule
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


def _commit_route(
    *, session: Session, experiment: Experiment, decision: Decision, at: Any
) -> Route | None:
    write = decision.route_write
    if write is None:
        return None
    return desired_routes.commit_route_of(
        session=session, experiment=experiment, canary_bp=write.canary_bp,
        state=write.route_state, now=at,
    )


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


async def apply_decision(
    backends: Backends,
    *,
    experiment_id: int,
    version: int,
    decision: Decision,
    rule: BreakerRule,
    fence: Fence | None,
) -> Route | None:
    """Commit the decision; return the desired route it committed, if any."""
    at = utc_now(backends.clock)
    async with backends.database.transaction() as tx:
        experiment = await tx.run(
            _write_row, experiment_id=experiment_id, version=version, decision=decision, at=at
        )
        route = await tx.run(_commit_route, experiment=experiment, decision=decision, at=at)
        await tx.run(
            _record, experiment=experiment, decision=decision, rule=rule, route=route,
            fence=fence, at=at,
        )
    if route is not None:
        backends.route_changes.notify(experiment.service)
    return route
