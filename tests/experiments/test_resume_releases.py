"""A user's resume lets go of a guardrail's pause (decision 0049): the row's restarted
hold resets the rollout's memory of the breach, the pause included."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from controlplane.decision.model import MetricStreak
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.experiments.rollout_state import rollout_state_of
from controlplane.experiments.store import ExperimentRecord, StepRecord
from tests.decision.factory import T0, state


def record(stored: dict[str, Any], step_started: float) -> ExperimentRecord:
    at = datetime.fromtimestamp(step_started, UTC)
    return ExperimentRecord(
        id=1, name="shop v2", service="shop", state=ExperimentState.RUNNING, salt="s",
        baseline_upstream="http://shop-v1:8080", canary_upstream="http://shop-v2:8080",
        steps=(StepRecord(0, 100, 60), StepRecord(1, 500, 60)), sticky_header=None,
        sticky_cookie=None, rule=None, current_step=0, canary_weight_bp=100,
        breaker_state=BreakerState.CLOSED, trips=0, step_started_at=at,
        breaker_changed_at=None, route_revision=1, rollout_state=stored, created_at=at,
        updated_at=at, version=3,
    )  # fmt: skip


def held() -> dict[str, Any]:
    return state(
        held_by=("memory",),
        held_since=T0 + 20,
        held_reason="held at 100 bp by memory: memory 500 > bound 100",
        metric_streaks={"memory": MetricStreak(T0 + 20, 2, 0)},
        consecutive_breaches=0,
    ).to_dict()


def test_a_resume_releases_the_pause() -> None:
    resumed = rollout_state_of(record(held(), T0 + 100), T0 + 101)
    assert resumed.held_by == () and resumed.held_since is None
    assert resumed.metric_streaks == {}


def test_without_a_resume_the_pause_stands() -> None:
    same = rollout_state_of(record(held(), T0), T0 + 101)
    assert same.held_by == ("memory",) and same.held_since == T0 + 20
