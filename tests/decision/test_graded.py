"""Graded actions in the rollout (decision 0049): pause holds the weight and lets go,
rollback ends at once, step_back and stop trip; provider metrics count per reading."""

from __future__ import annotations

from typing import Any

from controlplane.decision import (
    BreakerState,
    Decision,
    EventKind,
    ExperimentState,
    RecordEvent,
    Rollback,
    RolloutState,
    decide,
)
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.kernel.rules import BreakerRule
from controlplane.providers.evidence import MetricEvidence, Reading
from tests.decision.factory import STEPS, T0, half_open, healthy, rule, slow, state

Q = 'max(process_resident_memory_bytes{variant="$variant"})'


def memory(action: str, **kw: Any) -> MetricSpec:
    return MetricSpec(name="memory", kind="gauge", query=Q, bound=100.0, action=action, **kw)


def reading(v: float | None, read_at: float) -> dict[str, MetricEvidence]:
    canary = Reading(v) if v is not None else Reading.missing("prometheus: connection refused")
    return {"memory": MetricEvidence("memory", canary, Reading(50.0), read_at, (Q,))}


def kinds(d: Decision) -> list[EventKind]:
    return [a.kind for a in d.effects if isinstance(a, RecordEvent)]


def events(d: Decision, kind: EventKind) -> list[RecordEvent]:
    return [a for a in d.effects if isinstance(a, RecordEvent) and a.kind is kind]


def look(
    s: RolloutState,
    r: BreakerRule,
    t: float,
    v: float | None,
    read_at: float | None = None,
    *,
    breach: bool = False,
    provider: bool = True,
) -> Decision:
    snaps = (slow if breach else healthy)(t, bp=s.canary_bp)
    metrics = reading(v, t if read_at is None else read_at) if provider else None
    return decide(s, snaps, r, STEPS, t, metrics=metrics)


def test_pause_holds_the_weight_then_resumes_advancing_once_clean() -> None:
    r = rule(metrics=[memory("pause")])
    s = state()
    d = look(s, r, T0 + 10, 500.0)
    assert d.new_state.held_by == () and not kinds(d)
    d = look(d.new_state, r, T0 + 20, 500.0)
    assert d.new_state.held_by == ("memory",)
    assert kinds(d) == [EventKind.GUARDRAIL_HOLD]
    hold = events(d, EventKind.GUARDRAIL_HOLD)[0]
    assert "memory 500 > bound 100" in hold.reason and "pause" in hold.reason
    assert hold.payload["guardrail"] == "memory" and hold.payload["queries"] == [Q]
    assert hold.payload["values"]["observed"] == 500.0
    assert d.route_write is None and d.new_state.breaker is BreakerState.CLOSED
    # the step is due, but held: no advance, no trip, however long it breaches
    s = d.new_state
    for t in (T0 + 30, T0 + 40, T0 + 50, T0 + 61, T0 + 71):
        d = look(s, r, t, 500.0)
        s = d.new_state
        assert d.route_write is None and s.step_index == 0 and s.trips == 0
    assert "held by memory" in d.reason
    assert d.evidence["held_by"]["guardrails"] == ["memory"]
    # clean for consecutive_breaches readings: released, and the due step advances
    d = look(s, r, T0 + 81, 50.0)
    assert d.new_state.held_by == ("memory",) and not kinds(d)
    d = look(d.new_state, r, T0 + 91, 50.0)
    assert EventKind.GUARDRAIL_RELEASED in kinds(d)
    assert EventKind.STEP_ADVANCED in kinds(d)
    assert d.new_state.held_by == () and d.new_state.step_index == 1


def test_one_reading_seen_at_many_looks_counts_once() -> None:
    r = rule(metrics=[memory("stop")])
    s = state()
    for i in range(8):  # looks every quarter second, one reading
        d = look(s, r, T0 + 10 + i * 0.25, 500.0, read_at=T0 + 9)
        s = d.new_state
        assert s.breaker is BreakerState.CLOSED
    assert s.metric_streaks["memory"].breaches == 1
    d = look(s, r, T0 + 13, 500.0, read_at=T0 + 12)
    assert d.new_state.breaker is BreakerState.OPEN


def test_stop_cuts_the_canary_and_names_the_guardrail() -> None:
    r = rule(metrics=[memory("stop")])
    d = look(state(), r, T0 + 10, 500.0)
    d = look(d.new_state, r, T0 + 20, 500.0)
    assert d.new_state.breaker is BreakerState.OPEN and d.new_state.canary_bp == 0
    assert kinds(d) == [EventKind.TRIPPED]
    assert d.evidence["action"] == {"action": "stop", "by": "memory"}
    assert "memory: 2 breached readings in a row" in d.reason
    assert d.next_check_at == T0 + 20 + r.cooldown_sec


def test_step_back_returns_to_the_previous_step() -> None:
    r = rule(metrics=[memory("step_back")])
    s = state(step_index=2, canary_bp=STEPS[2].weight_bp)
    d = look(s, r, T0 + 10, 500.0)
    d = look(d.new_state, r, T0 + 20, 500.0)
    assert d.new_state.breaker is BreakerState.OPEN
    assert d.new_state.canary_bp == STEPS[1].weight_bp
    assert d.evidence["action"]["action"] == "step_back"


def test_rollback_rolls_back_at_once_without_a_probe() -> None:
    r = rule(max_trips=3, metrics=[memory("rollback")])
    d = look(state(), r, T0 + 10, 500.0)
    d = look(d.new_state, r, T0 + 20, 500.0)
    assert d.new_state.status is ExperimentState.ROLLED_BACK and d.new_state.canary_bp == 0
    assert any(isinstance(a, Rollback) for a in d.effects)
    assert kinds(d) == [EventKind.ROLLED_BACK]
    assert "rolled back at once (memory: action rollback)" in d.reason
    assert d.next_check_at is None and d.new_state.trips == 0


def test_the_most_severe_action_of_the_streaks_wins() -> None:
    # latency breaches with stop, memory with pause: the breaker trips
    r = rule(action="stop", metrics=[memory("pause")])
    d = look(state(), r, T0 + 10, 500.0, breach=True)
    d = look(d.new_state, r, T0 + 20, 500.0, breach=True)
    assert d.new_state.breaker is BreakerState.OPEN
    assert d.evidence["action"]["by"] == "latency"
    assert d.new_state.held_by == ()  # no pause outlives a trip


def test_the_rule_action_pause_holds_on_latency() -> None:
    r = rule(action="pause")
    d = look(state(), r, T0 + 10, None, breach=True, provider=False)
    d = look(d.new_state, r, T0 + 20, None, breach=True, provider=False)
    assert d.new_state.breaker is BreakerState.CLOSED and d.new_state.held_by == ("latency",)
    assert kinds(d) == [EventKind.GUARDRAIL_HOLD]
    d = look(d.new_state, r, T0 + 30, None, provider=False)
    d = look(d.new_state, r, T0 + 40, None, provider=False)
    assert kinds(d) == [EventKind.GUARDRAIL_RELEASED] and d.new_state.held_by == ()


def test_without_a_provider_a_held_metric_holds_the_step_until_its_timeout() -> None:
    r = rule(metrics=[memory("stop", no_data_timeout_sec=100)])
    d = look(state(), r, T0 + 10, None, provider=False)
    [no_data] = events(d, EventKind.NO_DATA)
    assert "no metric provider configured" in no_data.reason and "hold" in no_data.reason
    s = d.new_state
    for t in range(20, 110, 10):
        d = look(s, r, T0 + t, None, provider=False)
        s = d.new_state
        assert s.breaker is BreakerState.CLOSED and s.step_index == 0
        assert EventKind.NO_DATA not in kinds(d)
    assert "no data for memory" in d.reason
    d = look(s, r, T0 + 111, None, provider=False)
    assert next(e.reason for e in events(d, EventKind.NO_DATA)).endswith("judged without it")
    assert d.new_state.step_index == 1  # judged without it: the step advances


def test_ignore_judges_without_the_metric_from_the_start() -> None:
    r = rule(metrics=[memory("stop", no_data="ignore")])
    d = look(state(), r, T0 + 10, None)
    assert "no_data: ignore" in events(d, EventKind.NO_DATA)[0].reason
    s = d.new_state
    for t in range(20, 70, 10):
        d = look(s, r, T0 + t, None)
        s = d.new_state
    assert s.step_index == 1 and s.trips == 0


def test_a_probe_counts_only_readings_of_its_own_weight() -> None:
    r = rule(metrics=[memory("stop")])
    s = half_open(r)  # probing since T0 + 100, for the rule's window of 10 s
    for t in range(101, 110, 2):  # each reading's window began before the probe
        d = look(s, r, T0 + t, 500.0, read_at=T0 + t)
        s = d.new_state
        assert s.breaker is BreakerState.HALF_OPEN and s.metric_streaks == {}
    d = look(s, r, T0 + 111, 500.0, read_at=T0 + 111)  # the probe's gate judges it
    assert d.new_state.breaker is BreakerState.OPEN and kinds(d) == [EventKind.PROBE_FAILED]
    assert d.evidence["action"] == {"action": "stop", "by": "memory"}


def test_the_state_keeps_the_graded_bookkeeping_across_a_restart() -> None:
    r = rule(metrics=[memory("pause")])
    d = look(state(), r, T0 + 10, 500.0)
    d = look(d.new_state, r, T0 + 20, 500.0)
    again = RolloutState.from_dict(d.new_state.to_dict())
    assert again == d.new_state


def test_an_insignificant_ratio_over_the_baseline_does_not_hold_the_step() -> None:
    # two healthy arms: the canary's share is over the baseline's half the time
    ratio = MetricSpec(
        name="error_ratio", kind="ratio", compare="baseline",
        query='sum(increase(bad{variant="$variant"}[$window]))',
        total_query='sum(increase(all{variant="$variant"}[$window]))',
    )  # fmt: skip
    r = rule(metrics=[ratio])
    s = state()
    for t in range(10, 70, 10):
        found = {
            "error_ratio": MetricEvidence(
                "error_ratio", Reading(0.0101, 101.0, 10_000.0),
                Reading(0.0100, 100.0, 10_000.0), T0 + t,
            )
        }  # fmt: skip
        d = decide(s, healthy(T0 + t, bp=s.canary_bp), r, STEPS, T0 + t, metrics=found)
        s = d.new_state
    assert s.step_index == 1 and s.trips == 0
