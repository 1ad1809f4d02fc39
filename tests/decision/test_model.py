from __future__ import annotations

import json

import pytest

from controlplane.decision import (
    BREAKER_TRANSITIONS,
    BreakerState,
    ExperimentState,
    RolloutState,
    Step,
    transition,
)
from controlplane.decision.tally import SrmTally
from controlplane.kernel.errors import IllegalTransition
from tests.decision.factory import T0, snap, state

ALL_BREAKER_PAIRS = [(a, b) for a in BreakerState for b in BreakerState]


@pytest.mark.parametrize(("current", "target"), ALL_BREAKER_PAIRS)
def test_breaker_moves_only_along_its_table(current: BreakerState, target: BreakerState) -> None:
    if target in BREAKER_TRANSITIONS[current]:
        assert transition(current, target) is target
    else:
        with pytest.raises(IllegalTransition) as info:
            transition(current, target)
        assert info.value.kind == "breaker"


def test_closed_breaker_cannot_jump_to_half_open() -> None:
    with pytest.raises(IllegalTransition, match="breaker cannot go from 'closed' to 'half_open'"):
        transition(BreakerState.CLOSED, BreakerState.HALF_OPEN)


@pytest.mark.parametrize(
    "terminal",
    [ExperimentState.PROMOTED, ExperimentState.ROLLED_BACK, ExperimentState.ABORTED],
)
def test_experiment_never_leaves_a_terminal_status(terminal: ExperimentState) -> None:
    for target in ExperimentState:
        with pytest.raises(IllegalTransition):
            transition(terminal, target)


def test_running_and_paused_move_both_ways() -> None:
    assert transition(ExperimentState.RUNNING, ExperimentState.PAUSED) is ExperimentState.PAUSED
    assert transition(ExperimentState.PAUSED, ExperimentState.RUNNING) is ExperimentState.RUNNING


def test_step_weight_is_in_basis_points() -> None:
    assert Step(1, 60).weight_bp == 100
    assert Step(0.5, 0).weight_bp == 50
    assert Step(100, 0).weight_bp == 10_000


@pytest.mark.parametrize(("pct", "hold"), [(0, 10), (101, 10), (5, -1)])
def test_step_refuses_impossible_values(pct: float, hold: float) -> None:
    with pytest.raises(ValueError):
        Step(pct, hold)


def test_state_refuses_weight_outside_basis_points() -> None:
    with pytest.raises(ValueError):
        state(canary_bp=10_001)


def test_state_round_trips_through_json() -> None:
    tally = state().tally.add(snap("canary", T0 + 10, count=20, reservoir=(1.0, 2.0)), None)
    srm_tally = SrmTally.starting(T0, T0 + 1).add(950, 50, T0 + 11)
    original = state(
        trips=1, consecutive_breaches=1, tally=tally, srm_flagged=True, srm_tally=srm_tally
    )
    again = RolloutState.from_dict(json.loads(json.dumps(original.to_dict())))
    assert again == original
