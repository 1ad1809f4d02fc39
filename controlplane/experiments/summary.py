"""An experiment's standing in one sentence (decision/words.py), from its row: what
the list, the detail, the CLI and the dashboard show beside the numbers. Pure."""

from __future__ import annotations

from controlplane.decision.words import status_sentence
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.experiments.rollout_state import rollout_state_of
from controlplane.experiments.store import ExperimentRecord
from controlplane.kernel.rules import BreakerRule


def next_move_at(
    experiment: ExperimentRecord, rule: BreakerRule | None, now: float
) -> float | None:
    """When the rollout moves on its own: the step's end (closed), the cooldown's
    (open), the probe's (half-open); the controller's own next look when the rule
    that says so is unknown. None when it does not move on its own."""
    if experiment.state is not ExperimentState.RUNNING or experiment.current_step < 0:
        return None
    try:
        state = rollout_state_of(experiment, now)
    except (KeyError, TypeError, ValueError):
        return None
    stored = (experiment.rollout_state or {}).get("next_check_at")
    controller_at = float(stored) if isinstance(stored, int | float) else None
    if state.breaker is BreakerState.CLOSED:
        steps = experiment.steps
        if not 0 <= state.step_index < len(steps):
            return None
        return state.step_started_at + steps[state.step_index].hold_sec
    if state.breaker is BreakerState.OPEN and state.opened_at is not None and rule is not None:
        return state.opened_at + rule.cooldown_sec
    if (
        state.breaker is BreakerState.HALF_OPEN
        and state.probe_started_at is not None
        and rule is not None
    ):
        return state.probe_started_at + rule.window_sec
    return controller_at


def experiment_summary(
    experiment: ExperimentRecord, *, rule: BreakerRule | None = None, now: float | None = None
) -> str:
    """"holding step 2 of 4 (25%) until 14:03:10Z (in 40 s)" and the like; times are
    absolute (ISO 8601) without `now`, with a relative part given it."""
    reference = now if now is not None else experiment.updated_at.timestamp()
    steps = experiment.steps
    index = experiment.current_step
    held_reason: str | None = None
    overload = False
    stored = experiment.rollout_state or {}
    if experiment.state is ExperimentState.RUNNING:
        reason = stored.get("held_reason")
        held = stored.get("held_by")
        held_reason = reason if isinstance(reason, str) and held else None
        overload = stored.get("overload_held") is True
    return status_sentence(
        state=experiment.state.value,
        breaker=experiment.breaker_state.value,
        step_index=index,
        steps=len(steps),
        step_weight_bp=steps[index].weight_bp if 0 <= index < len(steps) else None,
        canary_bp=experiment.canary_weight_bp,
        trips=experiment.trips,
        max_trips=rule.max_trips if rule is not None else None,
        next_at=next_move_at(experiment, rule, reference),
        held_reason=held_reason,
        overload_held=overload,
        now=now,
    )
