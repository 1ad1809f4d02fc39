"""Graded actions (decision 0049): which action a breach calls for, and the pause.

Pure bookkeeping for the rollout (rollout.py), on values only:

- Streaks. Latency and failures keep the breaker's streak (`consecutive_breaches`,
  one count per fresh look, as always). A provider metric keeps its own, one count
  per reading (`MetricStreak`): the provider is read every `interval_sec`, the
  rollout looks every quarter second, and counting one reading at every look would
  make `consecutive_breaches` looks of the same number. During a probe only readings
  whose window starts after the probe's weight took effect count.
- Trips. A guardrail whose streak reaches the rule's `consecutive_breaches` and whose
  action is step_back, stop or rollback calls for that action; among several the
  most severe wins, and the chosen guardrail is named (`trip_candidate`).
- Pause. A guardrail whose action is pause and whose streak reaches
  `consecutive_breaches` holds the weight (`held_by`): no trip, no cut, no advance.
  It lets go once the guardrail has been clean for `consecutive_breaches` looks (its
  readings, for a provider metric), or when a user resumes the experiment.
  `guardrail_hold` / `guardrail_released` mark the edges.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.decision.breaker import Evaluation, Guardrail, describe
from controlplane.decision.metric_guardrails import Status
from controlplane.decision.model import MetricStreak, RecordEvent, RolloutState
from controlplane.experiments.events import EventKind
from controlplane.experiments.lifecycle import BreakerState
from controlplane.kernel.metric_specs import GuardrailAction
from controlplane.kernel.rules import BreakerRule
from controlplane.providers.evidence import MetricEvidence

SAMPLE_GUARDRAILS = ("latency", "failures")


@dataclass(frozen=True)
class MetricLook:
    """What this call made of the provider metrics: the evidence it was given (for the
    step gate), the metrics judged without their data, and the events to record."""

    evidence: Mapping[str, MetricEvidence] = field(default_factory=dict)
    expired: frozenset[str] = frozenset()
    provider: bool = True
    events: tuple[RecordEvent, ...] = ()


@dataclass(frozen=True)
class TripCall:
    """A breach streak that calls for an action other than pause."""

    action: GuardrailAction
    by: str
    reason: str


def observe_metrics(
    state: RolloutState,
    evaluation: Evaluation | None,
    rule: BreakerRule,
    now: float,
    look: MetricLook,
) -> tuple[RolloutState, MetricLook]:
    """Count the look's new readings into the streaks, then hold or release."""
    streaks = dict(state.metric_streaks)
    if evaluation is not None:
        for g in evaluation.guardrails:
            if g.metric is None:
                continue
            counted = _count(streaks.get(g.name), g, state, rule)
            if counted is not None:
                streaks[g.name] = counted
    names = {m.name for m in rule.metrics}
    streaks = {n: v for n, v in streaks.items() if n in names}
    if streaks != dict(state.metric_streaks):
        state = state.with_changes(metric_streaks=streaks)
    state, edges = _hold_or_release(state, evaluation, rule, now)
    return state, MetricLook(look.evidence, look.expired, look.provider, (*look.events, *edges))


def _count(
    before: MetricStreak | None, g: Guardrail, state: RolloutState, rule: BreakerRule
) -> MetricStreak | None:
    assert g.metric is not None
    read_at = g.metric.get("read_at")
    if not isinstance(read_at, int | float):
        return None
    if before is not None and read_at <= before.read_at:
        return None  # this reading was counted at an earlier look
    if state.breaker is BreakerState.HALF_OPEN and read_at - rule.window_sec < state.weight_since:
        return None  # the probe is judged on its own readings
    breaches = before.breaches if before is not None else 0
    clean = before.clean if before is not None else 0
    if g.status == Status.JUDGED and g.breached:
        return MetricStreak(read_at, breaches + 1, 0)
    if g.status in (Status.JUDGED, Status.SKIPPED):
        return MetricStreak(read_at, 0, clean + 1)
    return MetricStreak(read_at, 0, clean)  # held or too few: neither breach nor clean


def _pausing(rule: BreakerRule) -> set[str]:
    names = {m.name for m in rule.metrics if m.action is GuardrailAction.PAUSE}
    if rule.action is GuardrailAction.PAUSE:
        names.update(SAMPLE_GUARDRAILS)
    return names


def _hold_or_release(
    state: RolloutState, evaluation: Evaluation | None, rule: BreakerRule, now: float
) -> tuple[RolloutState, tuple[RecordEvent, ...]]:
    pausing = _pausing(rule)
    need = rule.consecutive_breaches
    held = [n for n in state.held_by if n in pausing]
    released = [n for n in state.held_by if n not in pausing]
    for name in list(held):
        if name in SAMPLE_GUARDRAILS:
            clean = state.samples_clean >= need
        else:
            streak = state.metric_streaks.get(name)
            clean = streak is not None and streak.clean >= need
        if clean:
            held.remove(name)
            released.append(name)
    added: list[str] = []
    samples_held = any(n in held for n in SAMPLE_GUARDRAILS)
    if (
        rule.action is GuardrailAction.PAUSE
        and state.consecutive_breaches >= need
        and not samples_held
    ):
        added.append(_samples_name(evaluation))
    for m in rule.metrics:
        streak = state.metric_streaks.get(m.name)
        if m.name in pausing and m.name not in held and streak and streak.breaches >= need:
            added.append(m.name)
    held += added
    if not added and not released:
        return state, ()
    guardrails = {g.name: g for g in evaluation.guardrails} if evaluation is not None else {}
    events: list[RecordEvent] = []
    for name in added:
        g = guardrails.get(name)
        words = _words(g) if g is not None else f"{name} breached {need} looks in a row"
        reason = f"held at {state.canary_bp} bp by {name}: {words} (action: pause)"
        events.append(RecordEvent(EventKind.GUARDRAIL_HOLD, reason, _data(name, g, state, now)))
    for name in released:
        g = guardrails.get(name)
        reason = (
            f"{name} clean for {need} looks in a row: released, advancing again"
            if name in pausing
            else f"{name} no longer pauses the rollout (the rule changed): released"
        )
        events.append(RecordEvent(EventKind.GUARDRAIL_RELEASED, reason, _data(name, g, state, now)))
    if held:
        text = "; ".join(e.reason for e in events if e.kind is EventKind.GUARDRAIL_HOLD)
        state = state.with_changes(
            held_by=tuple(held),
            held_since=state.held_since if state.held_since is not None else now,
            held_reason=text or state.held_reason,
        )
    else:
        state = state.with_changes(held_by=(), held_since=None, held_reason=None)
    return state, tuple(events)


def _samples_name(evaluation: Evaluation | None) -> str:
    if evaluation is not None:
        for g in evaluation.guardrails:
            if g.metric is None and g.breached:
                return g.name
    return "latency"


def _words(g: Guardrail) -> str:
    return describe(g)


def _data(name: str, g: Guardrail | None, state: RolloutState, now: float) -> dict[str, Any]:
    data: dict[str, Any] = {
        "at": now,
        "guardrail": name,
        "canary_bp": state.canary_bp,
        "step_index": state.step_index,
        "held_by": list(state.held_by),
    }
    if g is not None:
        data["values"] = g.to_dict()
        if g.metric is not None:
            data["queries"] = g.metric.get("queries", [])
    return data


def trip_candidate(
    state: RolloutState, evaluation: Evaluation | None, rule: BreakerRule, samples_reason: str
) -> TripCall | None:
    """The most severe action a streak at `consecutive_breaches` calls for, other than
    pause; None when none does. Latency and failures first on a tie."""
    need = rule.consecutive_breaches
    calls: list[TripCall] = []
    if state.consecutive_breaches >= need and rule.action is not GuardrailAction.PAUSE:
        reason = f"{state.consecutive_breaches} breached evaluations in a row; {samples_reason}"
        calls.append(TripCall(rule.action, _samples_name(evaluation), reason))
    guardrails = {g.name: g for g in evaluation.guardrails} if evaluation is not None else {}
    for m in rule.metrics:
        streak = state.metric_streaks.get(m.name)
        if m.action is GuardrailAction.PAUSE or streak is None or streak.breaches < need:
            continue
        g = guardrails.get(m.name)
        words = _words(g) if g is not None and g.breached else "breached"
        reason = f"{m.name}: {streak.breaches} breached readings in a row; {words}"
        calls.append(TripCall(m.action, m.name, reason))
    if not calls:
        return None
    best = calls[0]
    for call in calls[1:]:
        if call.action.severity > best.action.severity:
            best = call
    return best


def held_text(state: RolloutState) -> str:
    names = ", ".join(state.held_by)
    return f"held by {names} (action: pause): {state.held_reason or 'breached'}"


def cleared() -> dict[str, Any]:
    """The changes a cut of the weight makes to the graded bookkeeping: the new
    weight starts its own streaks, and no pause outlives a trip."""
    return {
        "metric_streaks": {},
        "samples_clean": 0,
        "held_by": (),
        "held_since": None,
        "held_reason": None,
    }


__all__ = [
    "MetricLook",
    "TripCall",
    "cleared",
    "held_text",
    "observe_metrics",
    "trip_candidate",
]
