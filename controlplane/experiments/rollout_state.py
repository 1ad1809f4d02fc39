"""Between the stored experiment and the decision core's RolloutState.

The row is the source of truth for what a user did (pause, resume, promote…); the
rollout state JSON is the controller's memory between evaluations. Pure functions.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from controlplane.decision.model import RolloutState, Step
from controlplane.decision.tally import Tally
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.experiments.store import ExperimentRecord
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.routes import TOTAL_WEIGHT
from controlplane.kernel.rules import BreakerRule, parse_rule


class Unparsed(enum.Enum):
    """The stored memory was not parsed by the caller (the default)."""

    TOKEN = 0


UNPARSED = Unparsed.TOKEN


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


def stored_rollout_state(experiment: ExperimentRecord) -> RolloutState | None:
    """The rollout memory stored with the experiment, parsed; None when it has none.
    KeyError, TypeError or ValueError when it is unreadable."""
    stored: dict[str, Any] | None = experiment.rollout_state
    return RolloutState.from_dict(stored) if stored else None


def rollout_state_of(
    experiment: ExperimentRecord, now: float, stored: RolloutState | Unparsed | None = UNPARSED
) -> RolloutState:
    """The state to decide from: the stored one (`stored`, when the caller parsed it
    already), reconciled with the row."""
    state = stored_rollout_state(experiment) if isinstance(stored, Unparsed) else stored
    status = ExperimentState(experiment.state)
    row_step_started = epoch(experiment.step_started_at, now)
    if state is None:
        return RolloutState(
            status=status,
            breaker=BreakerState.CLOSED,
            step_index=max(experiment.current_step, 0),
            step_started_at=row_step_started,
            canary_bp=experiment.canary_weight_bp,
            weight_since=row_step_started,
            tally=Tally.starting(row_step_started),
        )
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
