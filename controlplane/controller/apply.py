"""Applying one decision: the experiment's state, its desired route and the events, in
one unit of work of the store (experiments.store), and nothing else.

    load (version check) → write the state → the desired route → events
    → commit → wake the reconciler → one decision log line per event

The row's version check makes a concurrent API action (pause, promote…) win: the
commit fails and the next round decides again from fresh state. No route reaches
etcd from here: the leader's reconciler publishes the committed one (within
milliseconds, woken by the commit), so a failed commit leaves nothing behind.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from controlplane.controller.ownership import ShardFence
from controlplane.controller.reconciler import fence_entry
from controlplane.decision.model import Decision, Promote, Rollback
from controlplane.experiments.decision_log import log_event
from controlplane.experiments.lifecycle import ExperimentState
from controlplane.experiments.release_commits import record_release_of, release_payload
from controlplane.experiments.store import ExperimentRecord
from controlplane.kernel.clock import utc_now
from controlplane.kernel.kv import Fence
from controlplane.kernel.routes import Route
from controlplane.kernel.rules import BreakerRule
from controlplane.runtime import Backends


def decided_state(
    experiment: ExperimentRecord, decision: Decision, at: datetime
) -> ExperimentRecord:
    """The experiment as the decision leaves it (pure)."""
    state = decision.new_state
    lifecycle = experiment.state
    if any(isinstance(a, Promote) for a in decision.effects):
        lifecycle = ExperimentState.PROMOTED
    elif any(isinstance(a, Rollback) for a in decision.effects):
        lifecycle = ExperimentState.ROLLED_BACK
    breaker_moved = experiment.breaker_state is not state.breaker
    step_moved = experiment.current_step != state.step_index
    return replace(
        experiment,
        state=lifecycle,
        breaker_state=state.breaker,
        breaker_changed_at=at if breaker_moved else experiment.breaker_changed_at,
        trips=state.trips,
        current_step=state.step_index,
        step_started_at=at if step_moved else experiment.step_started_at,
        canary_weight_bp=state.canary_bp,
        rollout_state={
            **state.to_dict(),
            "next_check_at": decision.next_check_at,
            "last_reason": decision.reason,
        },
        updated_at=at,
    )


def event_payloads(
    decision: Decision, rule: BreakerRule, route: Route | None, fence: Fence | None
) -> list[dict[str, Any]]:
    """Each event's payload: its own, the rule it was judged on, the route revision it
    committed and the leadership that decided it."""
    payloads = []
    for event in decision.events:
        payload: dict[str, Any] = dict(event.payload)
        payload["rule"] = rule.model_dump(mode="json")
        if route is not None:
            payload["route_revision"] = route.revision
        if fence is not None:
            payload["leader_fence"] = fence_entry(fence)
        payloads.append(payload)
    return payloads


async def apply_decision(
    backends: Backends,
    *,
    experiment_id: int,
    version: int,
    decision: Decision,
    rule: BreakerRule,
    fence: Fence | None,
    shard: ShardFence | None = None,
    owner: str = "",
) -> Route | None:
    """Commit the decision; return the desired route it committed, if any.

    RevisionConflict when the experiment moved on since `version` (the decision was
    taken on a stale read; the next round decides again). With a shard (sharded
    controllers, decision 0057): NotLeader when a newer owner fenced the shard.
    """
    at = utc_now(backends.clock)
    async with backends.store.transaction() as tx:
        if shard is not None:
            await tx.hold_shard(shard=shard.shard, fence=shard.token, owner=owner, now=at)
        loaded = await tx.load_experiment(experiment_id=experiment_id)
        # the version decided on, not the one just loaded: save_state checks it
        experiment = await tx.save_state(
            experiment=decided_state(replace(loaded, version=version), decision, at)
        )
        route: Route | None = None
        write = decision.route_write
        if write is not None:
            route, experiment = await tx.save_desired_route(
                experiment=experiment, canary_bp=write.canary_bp, state=write.route_state,
                now=at,
            )
        recorded = []
        release = None
        if route is not None:
            release = await record_release_of(
                tx, experiment=experiment, route_state=route.state, starting=False,
                aborted=False, actor="controller", at=at,
            )  # fmt: skip
        for event, payload in zip(
            decision.events, event_payloads(decision, rule, route, fence), strict=True
        ):
            if release is not None:
                payload["release"] = release_payload(release)
            recorded.append(
                await tx.append_event(
                    experiment_id=experiment.id,
                    service=experiment.service,
                    at=at,
                    actor="controller",
                    kind=event.kind,
                    from_state=str(payload.get("from", "")) or None,
                    to_state=str(payload.get("to", "")) or None,
                    reason=event.reason,
                    payload=payload,
                )
            )
    if route is not None:
        backends.route_changes.notify(experiment.service)
    for done in recorded:  # committed: now they are decisions
        log_event(
            kind=done.kind, experiment_id=done.experiment_id, service=done.service,
            actor=done.actor, from_state=done.from_state, to_state=done.to_state,
            reason=done.reason, payload=done.payload,
        )  # fmt: skip
    return route
