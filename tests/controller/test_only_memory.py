"""Which decisions wait for the round's single commit (decision 0031)."""

from __future__ import annotations

import pytest

from controlplane.controller.runner import only_look_time, only_memory
from controlplane.decision.model import Decision, RolloutState, SetCanaryWeight
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.kernel.routes import RouteState

STATE = RolloutState(
    status=ExperimentState.RUNNING, breaker=BreakerState.CLOSED, step_index=0,
    step_started_at=100.0, canary_bp=1000, weight_since=100.0,
)  # fmt: skip


def _decision(effects: tuple[SetCanaryWeight, ...] = (), **changes: object) -> Decision:
    return Decision(STATE.with_changes(**changes), effects, "why", {}, None)


@pytest.mark.parametrize(
    ("decision", "waits"),
    [
        (_decision(consecutive_breaches=1, last_snapshot_ts=120.0), True),
        (_decision(no_data_since=110.0), True),
        (_decision(breaker=BreakerState.OPEN, canary_bp=0), False),
        (_decision(step_index=1, canary_bp=5000), False),
        (_decision(canary_bp=500), False),
        (_decision(status=ExperimentState.PROMOTED), False),
        (_decision((SetCanaryWeight(1000, RouteState.RUNNING),)), False),
    ],
    ids=["looks", "no-data-clock", "trip", "step", "weight", "status", "route-write"],
)
def test_only_a_change_of_memory_waits_for_the_rounds_commit(
    decision: Decision, waits: bool
) -> None:
    assert only_memory(STATE, decision) is waits


@pytest.mark.parametrize(
    ("decision", "kept"),
    [
        (_decision(last_snapshot_ts=120.0), True),
        (_decision(last_snapshot_ts=120.0, consecutive_breaches=1), False),
        (_decision(last_snapshot_ts=120.0, no_data_since=110.0), False),
        (_decision(last_snapshot_ts=120.0, overload_held=True), False),
        (_decision((SetCanaryWeight(1000, RouteState.RUNNING),), last_snapshot_ts=120.0),
         False),
        (_decision(), False),
    ],
    ids=["time-only", "streak", "no-data-clock", "overload-hold", "effect", "nothing"],
)
def test_a_look_that_moves_only_the_snapshot_time_is_kept(decision: Decision, kept: bool) -> None:
    """Such a look is kept in the controller's memory, not written (decision 0077)."""
    assert only_look_time(STATE, decision) is kept
