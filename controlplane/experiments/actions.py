"""What a user can do to an experiment, each in one unit of work of the store.

    load → check the lifecycle → write the state → the desired route → record the
    event → commit → wake the reconciler

An action writes SQL only (through experiments.store). The service's desired route
commits with the state, and the leader's reconciler (controller.reconciler) makes
etcd hold it, woken by the commit: the answer comes after the commit, the route
follows within milliseconds (`route_applied` in the experiment's detail says when).
A failed commit leaves nothing anywhere.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from controlplane.experiments.decision_log import log_event
from controlplane.experiments.events import EventKind
from controlplane.experiments.lifecycle import (
    ACTIVE,
    EDITABLE,
    BreakerState,
    ExperimentState,
    LifecycleAction,
    RouteAfterAction,
    route_after,
    transition,
)
from controlplane.experiments.release_commits import (
    follow_stable_version,
    record_release_of,
    release_payload,
    version_payload,
)
from controlplane.experiments.releases import Version
from controlplane.experiments.store import ExperimentRecord, ExperimentSpec, ExperimentStore
from controlplane.kernel.clock import Clock, utc_now
from controlplane.kernel.errors import Conflict, RevisionConflict
from controlplane.kernel.routes import Route
from controlplane.routing.changes import RouteChanges

# an action meeting a row the controller just saved is judged again on the new row
ACTION_ATTEMPTS = 5


def new_salt() -> str:
    return secrets.token_hex(8)


async def create_experiment(
    *, store: ExperimentStore, clock: Clock, spec: ExperimentSpec, actor: str
) -> ExperimentRecord:
    now = utc_now(clock)
    async with store.transaction() as tx:
        experiment = await tx.create_experiment(spec=spec, salt=new_salt(), now=now)
        await tx.append_event(
            experiment_id=experiment.id,
            service=spec.service,
            at=now,
            actor=actor,
            kind=EventKind.CREATED,
            to_state=ExperimentState.DRAFT,
            reason=f"created by {actor}",
        )
    return experiment


class NotEditable(Conflict):
    """Only a draft can be edited or deleted; `current` names the state it is in."""

    def __init__(self, experiment_id: int, current: str, verb: str) -> None:
        self.current = current
        super().__init__(
            f"experiment {experiment_id} is '{current}': only a draft can be {verb}"
        )


def _require_editable(experiment: ExperimentRecord, verb: str) -> None:
    if experiment.state not in EDITABLE:
        raise NotEditable(experiment.id, experiment.state.value, verb)


async def update_experiment(
    *,
    store: ExperimentStore,
    clock: Clock,
    experiment_id: int,
    change: Callable[[ExperimentSpec], ExperimentSpec],
    actor: str,
) -> ExperimentRecord:
    """Apply `change` (a pure merge that may raise ValidationFailed) to a draft."""
    now = utc_now(clock)
    async with store.transaction() as tx:
        experiment = await tx.load_experiment(experiment_id=experiment_id)
        _require_editable(experiment, "edited")
        before = experiment.spec
        after = change(before)
        if after == before:
            return experiment  # nothing to write, so no event either
        experiment = await tx.save_spec(experiment=experiment, spec=after, now=now)
        await tx.append_event(
            experiment_id=experiment.id,
            service=experiment.service,
            at=now,
            actor=actor,
            kind=EventKind.UPDATED,
            from_state=experiment.state,
            to_state=experiment.state,
            reason=f"edited by {actor}",
        )
    return experiment


async def delete_experiment(
    *, store: ExperimentStore, clock: Clock, experiment_id: int, actor: str
) -> None:
    now = utc_now(clock)
    async with store.transaction() as tx:
        experiment = await tx.load_experiment(experiment_id=experiment_id)
        _require_editable(experiment, "deleted")
        # The trail outlives the draft: a service-level event names what was deleted.
        await tx.append_event(
            service=experiment.service,
            at=now,
            actor=actor,
            kind=EventKind.DELETED,
            from_state=experiment.state,
            reason=f"draft experiment {experiment.id} deleted by {actor}",
            payload={"experiment_id": experiment.id, "name": experiment.name},
        )
        await tx.delete_experiment(experiment=experiment)


def begun_state(
    experiment: ExperimentRecord, *, action: LifecycleAction, others: list[ExperimentRecord],
    now: datetime,
) -> tuple[ExperimentRecord, RouteAfterAction | None]:
    """The experiment after `action` and the route it publishes: pure, checked against
    the lifecycle and against the service's other active experiments."""
    target = transition(experiment.state, action)
    if action is LifecycleAction.START and others:
        other = others[0]
        raise Conflict(
            f"service {experiment.service!r} already has experiment {other.id} "
            f"in state '{other.state}'"
        )
    plan = route_after(
        action,
        previous=experiment.state,
        first_step_bp=experiment.steps[0].weight_bp,
        canary_bp=experiment.canary_weight_bp,
        step=experiment.current_step,
        breaker=experiment.breaker_state,
    )
    # a hold counts running time only: it starts again after a pause
    restarts_hold = action in (LifecycleAction.START, LifecycleAction.RESUME)
    starts = action is LifecycleAction.START
    after = replace(
        experiment,
        state=target,
        updated_at=now,
        canary_weight_bp=plan.canary_bp if plan else experiment.canary_weight_bp,
        current_step=plan.step if plan else experiment.current_step,
        step_started_at=now if restarts_hold else experiment.step_started_at,
        breaker_state=BreakerState.CLOSED if starts else experiment.breaker_state,
        breaker_changed_at=now if starts else experiment.breaker_changed_at,
    )
    return after, plan


async def apply_action(
    *,
    store: ExperimentStore,
    changes: RouteChanges,
    clock: Clock,
    experiment_id: int,
    action: LifecycleAction,
    actor: str,
    reason: str = "",
) -> ExperimentRecord:
    """Commit the action (state, desired route, event); the route follows via the
    reconciler, woken through `changes`.

    The controller saves a running experiment's rollout memory on every evaluation, so
    an action can meet a row that moved since it was read: it is then judged again on
    the row as it is now (still legal or not), a few times, before the conflict is
    reported."""
    for attempt in range(ACTION_ATTEMPTS):
        try:
            return await _apply_action_once(
                store=store, changes=changes, clock=clock, experiment_id=experiment_id,
                action=action, actor=actor, reason=reason,
            )  # fmt: skip
        except RevisionConflict:
            if attempt + 1 == ACTION_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


async def _apply_action_once(
    *,
    store: ExperimentStore,
    changes: RouteChanges,
    clock: Clock,
    experiment_id: int,
    action: LifecycleAction,
    actor: str,
    reason: str,
) -> ExperimentRecord:
    now = utc_now(clock)
    async with store.transaction() as tx:
        experiment = await tx.load_experiment(experiment_id=experiment_id)
        previous = experiment.state
        others: list[ExperimentRecord] = []
        followed: Version | None = None
        if action is LifecycleAction.START:
            others, _ = await tx.list_experiments(
                service=experiment.service, states=ACTIVE, excluding=experiment.id, limit=1
            )
            if not others:
                experiment, followed = await follow_stable_version(
                    tx, experiment=experiment, now=now
                )
        after, plan = begun_state(experiment, action=action, others=others, now=now)
        experiment = await tx.save_state(experiment=after)
        route: Route | None = None
        if plan is not None:
            route, experiment = await tx.save_desired_route(
                experiment=experiment, canary_bp=plan.canary_bp, state=plan.state, now=now
            )
        payload: dict[str, object] = {
            "action": action.value,
            "canary_weight_bp": experiment.canary_weight_bp,
            "step": experiment.current_step,
        }
        if route is not None:
            payload |= {"route_revision": route.revision, "route_state": route.state.value}
        if followed is not None:
            payload["baseline"] = version_payload(followed)
        if plan is not None:
            release = await record_release_of(
                tx, experiment=experiment, route_state=plan.state,
                starting=action is LifecycleAction.START,
                aborted=action is LifecycleAction.ABORT, actor=actor, at=now,
            )  # fmt: skip
            if release is not None:
                payload["release"] = release_payload(release)
        event = await tx.append_event(
            experiment_id=experiment.id,
            service=experiment.service,
            at=now,
            actor=actor,
            kind=EventKind.of_action(action),
            from_state=previous.value,
            to_state=experiment.state.value,
            reason=reason or f"{action.value} by {actor}",
            payload=payload,
        )
    if plan is not None:
        changes.notify(experiment.service)
    log_event(
        kind=event.kind, experiment_id=event.experiment_id, service=event.service,
        actor=event.actor, from_state=event.from_state, to_state=event.to_state,
        reason=event.reason, payload=event.payload,
    )  # fmt: skip
    return experiment
