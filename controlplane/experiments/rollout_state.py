"""Between the stored experiment and the decision core's RolloutState.

The row is the source of truth for what a user did (pause, resume, promote…); the
rollout state JSON is the controller's memory between evaluations. Pure functions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from controlplane.decision.model import RolloutState, Step
from controlplane.decision.tally import Tally
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.experiments.store import ExperimentRecord
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.routes import TOTAL_WEIGHT
from controlplane.kernel.rules import BreakerRule, parse_rule


def epoch(at: datetime | None, default: float) -> float:
    return at.timestamp() if at is not None else default


def steps_of(experiment: ExperimentRecord) -> tuple[Step, ...]:
    return tuple(
        Step(weight_pct=s.weight_bp * 100 / TOTAL_WEIGHT, hold_sec=s.hold_sec)
        for s in experiment.steps
    )


def inline_rule(experiment: ExperimentRecord) -> BreakerRule | None:
    """The experiment's own rule, which overrides the service's; None if it has none."""
    if not experiment.rule:
        return None
    data = dict(experiment.rule)
    data.setdefault("service", experiment.service)
    try:
        return parse_rule(data)
    except ValidationFailed:
        return None


def rollout_state_of(experiment: ExperimentRecord, now: float) -> RolloutState:
    """The state to decide from: the stored one, reconciled with the row."""
    status = ExperimentState(experiment.state)
    row_step_started = epoch(experiment.step_started_at, now)
    stored: dict[str, Any] | None = experiment.rollout_state
    if not stored:
        return RolloutState(
            status=status,
            breaker=BreakerState.CLOSED,
            step_index=max(experiment.current_step, 0),
            step_started_at=row_step_started,
            canary_bp=experiment.canary_weight_bp,
            weight_since=row_step_started,
            tally=Tally.starting(row_step_started),
        )
    state = RolloutState.from_dict(stored)
    changes: dict[str, Any] = {}
    if state.status is not status:
        changes["status"] = status
    if status is ExperimentState.RUNNING and row_step_started > state.step_started_at:
        # a resume restarted the hold: running time only counts towards it
        changes |= {
            "step_started_at": row_step_started,
            "weight_since": row_step_started,
            "tally": Tally.starting(row_step_started),
            "consecutive_breaches": 0,
            # a user's resume also lets go of a guardrail's pause (decision 0049)
            "held_by": (),
            "held_since": None,
            "held_reason": None,
            "samples_clean": 0,
            "metric_streaks": {},
        }
    return state.with_changes(**changes) if changes else state
