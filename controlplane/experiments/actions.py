"""What a user can do to an experiment, as named steps over one transaction each.

    load → check the lifecycle → write the state (flush) → the desired route
    (db.routes) → record the event → commit → wake the reconciler

An action writes SQL only. The service's desired route commits with the state, and
the leader's reconciler (controller.reconciler) makes etcd hold it, woken by the
commit: the answer comes after the commit, the route follows within milliseconds
(`route_applied` in the experiment's detail says when). A failed commit leaves
nothing anywhere.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from controlplane.db import experiments as records
from controlplane.db import routes as desired_routes
from controlplane.db.experiments import ExperimentSpec
from controlplane.db.models import Experiment
from controlplane.db.session import Database
from controlplane.experiments.lifecycle import (
    EDITABLE,
    Action,
    BreakerState,
    ExperimentState,
    RoutePlan,
    route_after,
    transition,
)
from controlplane.kernel.clock import Clock, utc_now
from controlplane.kernel.errors import Conflict
from controlplane.kernel.routes import Route
from controlplane.routing.changes import RouteChanges


def new_salt() -> str:
    return secrets.token_hex(8)


async def create_experiment(
    *, database: Database, clock: Clock, spec: ExperimentSpec, actor: str
) -> Experiment:
    now = utc_now(clock)

    def write(*, session: Session) -> Experiment:
        experiment = records.create_experiment(
            session=session, spec=spec, salt=new_salt(), now=now
        )
        records.record_event(
            session=session,
            experiment_id=experiment.id,
            service=spec.service,
            at=now,
            actor=actor,
            kind="created",
            to_state=ExperimentState.DRAFT,
            reason=f"created by {actor}",
        )
        return experiment

    async with database.transaction() as tx:
        return await tx.run(write)


class NotEditable(Conflict):
    """Only a draft can be edited or deleted; `current` names the state it is in."""

    def __init__(self, experiment_id: int, current: str, verb: str) -> None:
        self.current = current
        super().__init__(
            f"experiment {experiment_id} is '{current}': only a draft can be {verb}"
        )


def _require_editable(experiment: Experiment, verb: str) -> None:
    if experiment.state not in EDITABLE:
        raise NotEditable(experiment.id, experiment.state, verb)


async def update_experiment(
    *,
    database: Database,
    clock: Clock,
    experiment_id: int,
    change: Callable[[ExperimentSpec], ExperimentSpec],
    actor: str,
) -> Experiment:
    """Apply `change` (a pure merge that may raise ValidationFailed) to a draft."""
    now = utc_now(clock)

    def write(*, session: Session) -> Experiment:
        experiment = records.get_experiment(session=session, experiment_id=experiment_id)
        _require_editable(experiment, "edited")
        before = records.spec_of(experiment)
        after = change(before)
        if after == before:
            return experiment  # nothing to write, so no event either
        records.replace_spec(session=session, experiment=experiment, spec=after, now=now)
        records.record_event(
            session=session,
            experiment_id=experiment.id,
            service=experiment.service,
            at=now,
            actor=actor,
            kind="updated",
            from_state=experiment.state,
            to_state=experiment.state,
            reason=f"edited by {actor}",
        )
        return experiment

    async with database.transaction() as tx:
        return await tx.run(write)


async def delete_experiment(
    *, database: Database, clock: Clock, experiment_id: int, actor: str
) -> None:
    now = utc_now(clock)

    def write(*, session: Session) -> None:
        experiment = records.get_experiment(session=session, experiment_id=experiment_id)
        _require_editable(experiment, "deleted")
        # The trail outlives the draft: a service-level event names what was deleted.
        records.record_event(
            session=session,
            service=experiment.service,
            at=now,
            actor=actor,
            kind="deleted",
            from_state=experiment.state,
            reason=f"draft experiment {experiment.id} deleted by {actor}",
            payload={"experiment_id": experiment.id, "name": experiment.name},
        )
        records.delete_experiment(session=session, experiment=experiment)

    async with database.transaction() as tx:
        await tx.run(write)


@dataclass(frozen=True)
class _Begun:
    experiment: Experiment
    previous: ExperimentState
    plan: RoutePlan | None


def _begin_action(
    *, session: Session, experiment_id: int, action: Action, now: datetime
) -> _Begun:
    experiment = records.get_experiment(session=session, experiment_id=experiment_id)
    previous = ExperimentState(experiment.state)
    target = transition(previous, action)
    if action is Action.START:
        other = records.active_experiment(
            session=session, service=experiment.service, excluding=experiment.id
        )
        if other is not None:
            raise Conflict(
                f"service {experiment.service!r} already has experiment {other.id} "
                f"in state '{other.state}'"
            )
    plan = route_after(
        action,
        previous=previous,
        first_step_bp=experiment.steps[0].weight_bp,
        canary_bp=experiment.canary_weight_bp,
        step=experiment.current_step,
        breaker=BreakerState(experiment.breaker_state),
    )
    experiment.state = target.value
    experiment.updated_at = now
    if plan is not None:
        experiment.canary_weight_bp = plan.canary_bp
        experiment.current_step = plan.step
    if action in (Action.START, Action.RESUME):
        # A hold counts running time only: it starts again after a pause.
        experiment.step_started_at = now
    if action is Action.START:
        experiment.breaker_state = "closed"
        experiment.breaker_changed_at = now
    # Flushing now checks the row version and the one-active-per-service index.
    session.flush()
    return _Begun(experiment, previous, plan)


def _finish_action(
    *,
    session: Session,
    begun: _Begun,
    action: Action,
    actor: str,
    reason: str,
    now: datetime,
) -> Experiment:
    experiment = begun.experiment
    route: Route | None = None
    if begun.plan is not None:
        route = desired_routes.commit_route_of(
            session=session, experiment=experiment, canary_bp=begun.plan.canary_bp,
            state=begun.plan.state, now=now,
        )
    payload: dict[str, object] = {
        "action": action.value,
        "canary_weight_bp": experiment.canary_weight_bp,
        "step": experiment.current_step,
    }
    if route is not None:
        payload |= {"route_revision": route.revision, "route_state": route.state.value}
    records.record_event(
        session=session,
        experiment_id=experiment.id,
        service=experiment.service,
        at=now,
        actor=actor,
        kind=action.value,
        from_state=begun.previous.value,
        to_state=experiment.state,
        reason=reason or f"{action.value} by {actor}",
        payload=payload,
    )
    return experiment


async def apply_action(
    *,
    database: Database,
    changes: RouteChanges,
    clock: Clock,
    experiment_id: int,
    action: Action,
    actor: str,
    reason: str = "",
) -> Experiment:
    """Commit the action (state, desired route, event); the route follows via the
    reconciler, woken through `changes`."""
    now = utc_now(clock)
    async with database.transaction() as tx:
        begun = await tx.run(_begin_action, experiment_id=experiment_id, action=action, now=now)
        experiment = await tx.run(
            _finish_action, begun=begun, action=action, actor=actor, reason=reason, now=now
        )
    if begun.plan is not None:
        changes.notify(experiment.service)
    return experiment
