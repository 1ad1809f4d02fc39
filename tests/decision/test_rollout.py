"""Table tests for decide(): every transition, with explicit `now` values."""

from __future__ import annotations

import json

import pytest

from controlplane.decision import (
    BreakerState,
    Decision,
    EventKind,
    ExperimentState,
    Promote,
    RecordEvent,
    Rollback,
    RolloutState,
    SetCanaryWeight,
    Step,
    decide,
    start,
)
from controlplane.kernel.routes import RouteState
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot
from tests.decision.factory import STEPS, T0, half_open, healthy, rule, slow, snap, state

RULE = rule()


def at(
    s: RolloutState,
    snaps: dict[str, WindowSnapshot],
    now: float,
    r: BreakerRule = RULE,
    steps: tuple[Step, ...] = STEPS,
) -> Decision:
    return decide(s, snaps, r, steps, now)


def kinds(d: Decision) -> list[EventKind]:
    return [a.kind for a in d.effects if isinstance(a, RecordEvent)]


def tripped(s: RolloutState | None = None, r: BreakerRule = RULE, t: float = T0 + 20) -> Decision:
    """Two breached evaluations on fresh snapshots, 250 ms apart."""
    s = s if s is not None else state()
    first = at(s, slow(t, bp=s.canary_bp), t, r)
    return at(first.new_state, slow(t + 0.25, bp=s.canary_bp), t + 0.25, r)




# ---------------------------------------------------------------- start and hold


def test_start_runs_the_first_step_and_says_when_it_is_due() -> None:
    d = start(STEPS, T0)
    assert d.new_state.status is ExperimentState.RUNNING
    assert d.new_state.breaker is BreakerState.CLOSED
    assert d.route_write == SetCanaryWeight(100, RouteState.RUNNING)
    assert d.next_check_at == T0 + 60
    assert kinds(d) == [EventKind.STARTED]


def test_start_refuses_an_empty_schedule() -> None:
    with pytest.raises(ValueError):
        start((), T0)


def test_holds_a_healthy_step_until_it_is_due() -> None:
    d = at(state(), healthy(T0 + 10), T0 + 10)
    assert d.effects == ()
    assert d.new_state.breaker is BreakerState.CLOSED
    assert d.next_check_at == T0 + 60
    assert d.evidence["window"]["verdict"] == "pass"


# ---------------------------------------------------------------- trips


def test_opens_when_p95_exceeds_threshold_after_min_samples() -> None:
    d = tripped()
    assert d.new_state.breaker is BreakerState.OPEN
    assert d.new_state.opened_at == T0 + 20.25
    assert d.new_state.trips == 1
    assert d.route_write == SetCanaryWeight(0, RouteState.TRIPPED)
    assert d.next_check_at == T0 + 20.25 + RULE.cooldown_sec
    assert kinds(d) == [EventKind.TRIPPED]
    assert d.evidence["weights"] == {"canary_bp_before": 100, "canary_bp_after": 0}


def test_does_not_trip_on_fewer_than_min_samples_however_slow() -> None:
    s = state()
    for i in range(5):
        t = T0 + 20 + i * 0.25
        d = at(s, slow(t, count=99), t)
        s = d.new_state
        assert d.evidence["window"]["verdict"] == "too_few_samples"
    assert s.breaker is BreakerState.CLOSED and s.consecutive_breaches == 0


def test_one_breached_evaluation_does_not_trip() -> None:
    d = at(state(), slow(T0 + 20), T0 + 20)
    assert d.new_state.breaker is BreakerState.CLOSED
    assert d.new_state.consecutive_breaches == 1
    assert d.effects == ()


def test_a_passing_evaluation_between_breaches_resets_the_count() -> None:
    d1 = at(state(), slow(T0 + 20), T0 + 20)
    d2 = at(d1.new_state, healthy(T0 + 20.25), T0 + 20.25)
    d3 = at(d2.new_state, slow(T0 + 20.5), T0 + 20.5)
    assert d3.new_state.breaker is BreakerState.CLOSED
    assert d3.new_state.consecutive_breaches == 1


def test_the_same_snapshot_is_not_counted_twice() -> None:
    snaps = slow(T0 + 20)
    d1 = at(state(), snaps, T0 + 20)
    d2 = at(d1.new_state, snaps, T0 + 20.25)
    assert d2.new_state.breaker is BreakerState.CLOSED
    assert d2.new_state.consecutive_breaches == 1
    assert d2.evidence["window"]["verdict"] == "not_evaluated"


def test_consecutive_breaches_of_one_trips_at_once() -> None:
    d = at(state(), slow(T0 + 20), T0 + 20, rule(consecutive_breaches=1))
    assert d.new_state.breaker is BreakerState.OPEN


def test_failure_ratio_above_the_bound_trips() -> None:
    def failing(t: float) -> dict[str, WindowSnapshot]:
        return {"canary": snap("canary", t, failures=300), "baseline": snap("baseline", t)}

    d1 = at(state(), failing(T0 + 20), T0 + 20)
    d2 = at(d1.new_state, failing(T0 + 20.5), T0 + 20.5)
    assert d2.new_state.breaker is BreakerState.OPEN
    assert d2.evidence["window"]["guardrails"]["failures"]["breached"] is True


def test_step_back_returns_to_the_previous_steps_weight() -> None:
    r = rule(action="step_back")
    s = state(step_index=2, canary_bp=STEPS[2].weight_bp)
    d = tripped(s, r)
    assert d.route_write == SetCanaryWeight(STEPS[1].weight_bp, RouteState.TRIPPED)
    assert d.new_state.step_index == 2


def test_step_back_at_the_first_step_stops_the_canary() -> None:
    d = tripped(state(), rule(action="step_back"))
    assert d.route_write == SetCanaryWeight(0, RouteState.TRIPPED)


def test_the_max_trips_th_trip_rolls_back_for_good() -> None:
    d = tripped(state(trips=2), rule(max_trips=3))
    assert d.new_state.status is ExperimentState.ROLLED_BACK
    assert d.new_state.canary_bp == 0
    assert d.route_write == SetCanaryWeight(0, RouteState.ROLLED_BACK)
    assert any(isinstance(a, Rollback) for a in d.effects)
    assert kinds(d) == [EventKind.TRIPPED, EventKind.ROLLED_BACK]
    assert d.next_check_at is None


# ---------------------------------------------------------------- open and half-open


def test_open_breaker_holds_until_the_cooldown_ends() -> None:
    opened = tripped().new_state
    d = at(opened, healthy(T0 + 50), T0 + 50)
    assert d.effects == ()
    assert d.new_state == opened
    assert d.next_check_at == T0 + 20.25 + RULE.cooldown_sec


def test_after_the_cooldown_probes_at_the_half_open_weight() -> None:
    opened = tripped().new_state
    t = T0 + 20.25 + RULE.cooldown_sec
    d = at(opened, {}, t, rule(half_open_weight=250))
    assert d.new_state.breaker is BreakerState.HALF_OPEN
    assert d.route_write == SetCanaryWeight(250, RouteState.HALF_OPEN)
    assert d.new_state.probe_started_at == t
    assert d.next_check_at == t + RULE.window_sec
    assert kinds(d) == [EventKind.HALF_OPEN]


def test_probe_waits_for_its_window_and_min_samples() -> None:
    s = half_open()
    # a window inside the probe but with too few samples
    d = at(s, healthy(T0 + 110, count=40), T0 + 110)
    assert d.new_state.breaker is BreakerState.HALF_OPEN
    assert "40 canary samples" in d.reason
    assert d.next_check_at is not None and d.next_check_at >= T0 + 111


def test_probe_passes_closes_and_resumes_at_the_step_before_the_trip() -> None:
    s = half_open(step_index=2)
    d = at(s, healthy(T0 + 110), T0 + 110)
    assert d.new_state.breaker is BreakerState.CLOSED
    assert d.new_state.step_index == 1
    assert d.route_write == SetCanaryWeight(STEPS[1].weight_bp, RouteState.RUNNING)
    assert d.new_state.step_started_at == T0 + 110
    assert d.next_check_at == T0 + 110 + STEPS[1].hold_sec
    assert kinds(d) == [EventKind.PROBE_PASSED]
    assert d.evidence["step_gate"]["verdict"] == "pass"


def test_probe_that_tripped_at_the_first_step_resumes_there() -> None:
    d = at(half_open(step_index=0), healthy(T0 + 110), T0 + 110)
    assert d.new_state.step_index == 0
    assert d.new_state.canary_bp == STEPS[0].weight_bp


def test_failed_probe_reopens_and_counts_a_trip() -> None:
    s = half_open()
    d1 = at(s, slow(T0 + 110), T0 + 110)
    assert d1.new_state.breaker is BreakerState.OPEN
    assert d1.new_state.trips == 2
    assert d1.new_state.opened_at == T0 + 110
    assert d1.route_write == SetCanaryWeight(0, RouteState.TRIPPED)
    assert kinds(d1) == [EventKind.PROBE_FAILED]


def test_failed_probe_at_max_trips_rolls_back() -> None:
    d = at(half_open().with_changes(trips=2), slow(T0 + 110), T0 + 110)
    assert d.new_state.status is ExperimentState.ROLLED_BACK
    assert d.route_write == SetCanaryWeight(0, RouteState.ROLLED_BACK)


def test_probe_ignores_windows_that_began_before_it() -> None:
    # the window still holds the samples that tripped the breaker
    s = half_open()
    d1 = at(s, slow(T0 + 101), T0 + 101)
    d2 = at(d1.new_state, slow(T0 + 101.5), T0 + 101.5)
    assert d2.new_state.breaker is BreakerState.HALF_OPEN
    assert d2.new_state.consecutive_breaches == 0


# ---------------------------------------------------------------- steps and promotion


def test_advances_after_the_hold_with_min_samples_and_a_passing_comparison() -> None:
    d1 = at(state(), healthy(T0 + 10, count=500), T0 + 10)
    d2 = at(d1.new_state, healthy(T0 + 60, count=500), T0 + 60)
    assert d2.new_state.step_index == 1
    assert d2.route_write == SetCanaryWeight(STEPS[1].weight_bp, RouteState.RUNNING)
    assert d2.new_state.step_started_at == T0 + 60
    assert d2.next_check_at == T0 + 60 + STEPS[1].hold_sec
    assert kinds(d2) == [EventKind.STEP_ADVANCED]
    assert d2.evidence["weights"] == {"canary_bp_before": 100, "canary_bp_after": 500}


def test_does_not_advance_before_the_hold_ends() -> None:
    d = at(state(), healthy(T0 + 59.75, count=5000), T0 + 59.75)
    assert d.new_state.step_index == 0 and d.effects == ()


def test_low_traffic_windows_add_up_to_min_samples_before_advancing() -> None:
    s = state()
    # 30 canary samples per 10-s window: disjoint windows count, overlapping ones do not
    for t in (10, 12, 20, 25, 30):
        s = at(s, healthy(T0 + t, count=30), T0 + t).new_state
    assert s.tally.canary.count == 90
    held = at(s, healthy(T0 + 60, count=5), T0 + 60)
    assert held.new_state.step_index == 0
    assert "95 canary samples" in held.reason
    d = at(held.new_state, healthy(T0 + 70, count=30), T0 + 70)
    assert d.new_state.step_index == 1


def test_does_not_advance_while_the_steps_evidence_is_over_a_bound() -> None:
    # 7% above the threshold: not significant enough to trip, yet not good enough to advance
    snaps = {
        "canary": snap("canary", T0 + 60, count=100, above=7),
        "baseline": snap("baseline", T0 + 60, count=9900),
    }
    d = at(state(), snaps, T0 + 60)
    assert d.new_state.step_index == 0
    assert d.new_state.breaker is BreakerState.CLOSED
    assert "does not pass" in d.reason


def test_promotes_after_the_last_step() -> None:
    last = len(STEPS) - 1
    s = state(step_index=last, canary_bp=STEPS[last].weight_bp)
    d = at(s, healthy(T0 + 60, bp=STEPS[last].weight_bp), T0 + 60)
    assert d.new_state.status is ExperimentState.PROMOTED
    assert d.route_write == SetCanaryWeight(10_000, RouteState.PROMOTED)
    assert any(isinstance(a, Promote) for a in d.effects)
    assert kinds(d) == [EventKind.PROMOTED]
    assert d.next_check_at is None


@pytest.mark.parametrize(
    "status",
    [
        ExperimentState.PAUSED,
        ExperimentState.DRAFT,
        ExperimentState.PROMOTED,
        ExperimentState.ROLLED_BACK,
        ExperimentState.ABORTED,
    ],
)
def test_paused_and_finished_experiments_get_no_action(status: ExperimentState) -> None:
    s = state(status=status)
    d = at(s, slow(T0 + 100), T0 + 100)
    assert d.effects == () and d.new_state == s and d.next_check_at is None


# ---------------------------------------------------------------- no data and SRM


def test_no_data_holds_by_default() -> None:
    s = state()
    for t in (10, 100, 400, 1000):
        d = at(s, {}, T0 + t)
        s = d.new_state
    assert s.breaker is BreakerState.CLOSED and s.step_index == 0
    assert s.no_data_since == T0 + 10


def test_no_data_fails_after_the_timeout_when_the_rule_says_fail() -> None:
    r = rule(no_data="fail", no_data_timeout_sec=30)
    d1 = at(state(), {}, T0 + 10, r)
    assert d1.new_state.breaker is BreakerState.CLOSED
    assert d1.next_check_at == T0 + 40
    d2 = at(d1.new_state, {}, T0 + 39.9, r)
    assert d2.new_state.breaker is BreakerState.CLOSED
    d3 = at(d2.new_state, {}, T0 + 40, r)
    assert d3.new_state.breaker is BreakerState.OPEN
    assert "no canary samples" in d3.reason


def test_samples_arriving_reset_the_no_data_clock() -> None:
    r = rule(no_data="fail", no_data_timeout_sec=30)
    d1 = at(state(), {}, T0 + 10, r)
    d2 = at(d1.new_state, healthy(T0 + 30), T0 + 30, r)
    d3 = at(d2.new_state, {}, T0 + 45, r)
    assert d3.new_state.no_data_since == T0 + 45
    assert d3.new_state.breaker is BreakerState.CLOSED


def test_no_data_is_announced_once_per_period_when_the_rule_holds() -> None:
    r = rule(no_data_timeout_sec=30)
    d1 = at(state(), {}, T0 + 10, r)
    assert kinds(d1) == [] and d1.next_check_at is not None and d1.next_check_at <= T0 + 40
    d2 = at(d1.new_state, {}, T0 + 40, r)
    assert kinds(d2) == [EventKind.NO_DATA]
    assert d2.new_state.breaker is BreakerState.CLOSED and d2.new_state.no_data_reported
    event = next(a for a in d2.effects if isinstance(a, RecordEvent))
    assert event.payload["no_data_since"] == T0 + 10 and event.payload["policy"] == "hold"
    d3 = at(d2.new_state, {}, T0 + 500, r)
    assert kinds(d3) == []  # the same period: said once
    # samples end the period; the next gap is a new one
    d4 = at(d3.new_state, healthy(T0 + 510), T0 + 510, r)
    assert not d4.new_state.no_data_reported and d4.new_state.no_data_since is None
    d5 = at(d4.new_state, {}, T0 + 600, r)
    d6 = at(d5.new_state, {}, T0 + 630, r)
    assert kinds(d5) == [] and kinds(d6) == [EventKind.NO_DATA]


def test_a_no_data_trip_comes_with_its_no_data_event() -> None:
    r = rule(no_data="fail", no_data_timeout_sec=30)
    d1 = at(state(), {}, T0 + 10, r)
    d2 = at(d1.new_state, {}, T0 + 40, r)
    assert kinds(d2) == [EventKind.NO_DATA, EventKind.TRIPPED]


def test_the_no_data_mark_survives_a_round_trip_through_json() -> None:
    marked = state(no_data_since=T0, no_data_reported=True)
    assert RolloutState.from_dict(json.loads(json.dumps(marked.to_dict()))) == marked
    assert RolloutState.from_dict({**marked.to_dict(), "no_data_reported": None}) == state(
        no_data_since=T0)


def test_a_snapshot_older_than_its_window_counts_as_no_data() -> None:
    d = at(state(), slow(T0 + 10), T0 + 25)
    assert d.new_state.no_data_since == T0 + 25
    assert d.new_state.consecutive_breaches == 0
    assert "old" in d.evidence["window"]["reason"]


def _skewed(t: float) -> dict[str, WindowSnapshot]:
    # 5% configured, 10% observed over 10000 samples
    return {
        "canary": snap("canary", t, count=1000, above=5),
        "baseline": snap("baseline", t, count=9000, above=5),
    }


def test_sample_ratio_mismatch_is_reported_once_as_an_event() -> None:
    s = state(step_index=1, canary_bp=500)
    d1 = at(s, _skewed(T0 + 20), T0 + 20)
    assert kinds(d1) == [EventKind.SRM_DETECTED]
    assert d1.new_state.srm_flagged
    d2 = at(d1.new_state, _skewed(T0 + 20.25), T0 + 20.25)
    assert kinds(d2) == []
    # the verdict is on the step's disjoint windows: an overlapping fair window adds
    # nothing, and one fair window does not outweigh the skewed one
    d3 = at(d2.new_state, healthy(T0 + 20.5, bp=500), T0 + 20.5)
    assert kinds(d3) == [] and d3.new_state.srm_flagged
    d4 = at(d3.new_state, healthy(T0 + 30, bp=500), T0 + 30)
    assert kinds(d4) == [] and d4.new_state.srm_flagged
    # a new weight starts new counts: its first fair settled window clears it
    moved = d4.new_state.with_changes(canary_bp=500, weight_since=T0 + 35)
    d5 = at(moved, healthy(T0 + 46, bp=500), T0 + 46)
    assert kinds(d5) == [EventKind.SRM_CLEARED]
    assert not d5.new_state.srm_flagged


def test_sample_ratio_mismatch_waits_for_windows_after_the_weight_change() -> None:
    s = state(step_index=1, canary_bp=500, weight_since=T0 + 15)
    d = at(s, _skewed(T0 + 20), T0 + 20)
    assert kinds(d) == [] and d.evidence["srm"] is None


def test_sample_ratio_mismatch_only_warns_by_default() -> None:
    s = state(step_index=1, canary_bp=500)
    d = at(at(s, _skewed(T0 + 20), T0 + 20).new_state, _skewed(T0 + 60), T0 + 60)
    assert d.new_state.step_index == 2


def test_sample_ratio_mismatch_holds_the_step_when_the_rule_says_hold() -> None:
    r = rule(srm="hold")
    s = state(step_index=1, canary_bp=500)
    d = at(at(s, _skewed(T0 + 20), T0 + 20, r).new_state, _skewed(T0 + 60), T0 + 60, r)
    assert d.new_state.step_index == 1
    assert "sample ratio mismatch" in d.reason


# ---------------------------------------------------------------- evidence


def test_evidence_is_json_and_carries_both_variants_and_the_tests() -> None:
    d = tripped()
    text = json.dumps(d.evidence, allow_nan=False)
    window = json.loads(text)["window"]
    assert window["variants"]["canary"]["count"] == 1000
    assert window["variants"]["baseline"]["above_threshold_fraction"] == pytest.approx(0.01)
    latency = window["guardrails"]["latency"]
    assert latency["test"]["p_value"] < 1e-10 and latency["p_adjusted"] is not None
    assert json.loads(text)["rule"]["threshold_ms"] == RULE.threshold_ms
    for event in d.events:
        json.dumps(event.payload, allow_nan=False)
        assert event.payload["who"] == "controller"
