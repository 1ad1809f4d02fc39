"""decision/words.py by table: numbers, times, guardrails, events and standings in
words; and no payload, however odd, makes it raise."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.decision import start
from controlplane.decision.words import (
    duration_text,
    evaluation_sentence,
    event_sentence,
    ms_text,
    ratio_text,
    status_sentence,
    when_text,
)
from tests.decision.factory import STEPS, T0, rule
from tests.decision.test_rollout import tripped

NOW = T0  # 2027-01-15T08:00:00Z


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (0.25, "0.2 s"), (40, "40 s"), (89, "89 s"), (90, "2 min"), (3599, "60 min"),
     (5400, "1 h 30 min"), (7200, "2 h"), (2 * 86400, "2 d"), (3 * 86400 + 4 * 3600, "3 d 4 h"),
     (-5, "0 s")],
)  # fmt: skip
def test_durations_read_as_people_say_them(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


@pytest.mark.parametrize(
    ("epoch", "now", "text"),
    [
        (NOW + 40, NOW, "08:00:40Z (in 40 s)"),
        (NOW - 125, NOW, "07:57:55Z (2 min ago)"),
        (NOW + 0.2, NOW, "08:00:00Z (now)"),
        (NOW + 86400, NOW, "2027-01-16T08:00:00Z (in 24 h)"),
        (NOW, None, "2027-01-15T08:00:00Z"),
    ],
)
def test_moments_are_iso_8601_with_a_relative_part(
    epoch: float, now: float | None, text: str
) -> None:
    assert when_text(epoch, now) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(407.4, "407 ms"), (88.0, "88 ms"), (12.54, "12.5 ms"), (0.42, "0.42 ms"), (24_000, "24 s"),
     (123_456, "123 s"), (1_234_567, "1235 s")],
)
def test_latencies(value: float, text: str) -> None:
    assert ms_text(value) == text


@pytest.mark.parametrize(
    ("value", "text"), [(0.12, "12.0%"), (0.011, "1.1%"), (0.0, "0.0%"), (0.0005, "0.05%")]
)
def test_ratios(value: float, text: str) -> None:
    assert ratio_text(value) == text


WINDOW = {"window_start": NOW - 10, "window_end": NOW}
ABSOLUTE = {"percentile": 95, "threshold_ms": 200}


def evaluation(canary: dict[str, Any], baseline: dict[str, Any], **guardrails: Any) -> Any:
    return {"variants": {"canary": canary, "baseline": baseline}, "guardrails": guardrails}


@pytest.mark.parametrize(
    ("rule", "found", "text"),
    [
        pytest.param(
            ABSOLUTE,
            evaluation(
                {"percentile_ms": 407.0, "count": 68, "above_threshold_fraction": 0.3, **WINDOW},
                {"percentile_ms": 88.0},
                latency={"basis": "exact_above_threshold_count", "bound": 0.05,
                         "exceeded": True, "breached": True},
            ),
            "canary P95 407 ms > bound 200 ms over the last 10 s, n=68 (30.0% above it, 5.0% "
            "allowed); baseline P95 88 ms",
            id="absolute latency",
        ),
        pytest.param(
            {**ABSOLUTE, "latency": "first_byte", "percentile": 99},
            evaluation(
                {"percentile_ms": 250.0, "count": 500, "above_threshold_fraction": 0.02,
                 **WINDOW},
                {},
                latency={"basis": "exact_above_threshold_count", "bound": 0.01,
                         "exceeded": True, "breached": False},
            ),
            "canary first-byte P99 250 ms > bound 200 ms over the last 10 s, n=500 (2.0% above "
            "it, 1.0% allowed) (over, but not significant yet)",
            id="first byte, not significant",
        ),
        pytest.param(
            {"percentile": 95, "compare": "baseline"},
            evaluation(
                {"percentile_ms": 300.0, "count": 400, **WINDOW}, {"percentile_ms": 100.0},
                latency={"basis": "percentile_ratio_and_rank_test", "observed": 3.0,
                         "bound": 1.2, "exceeded": True, "breached": True},
            ),
            "canary P95 300 ms > 1.2 × baseline P95 100 ms over the last 10 s, n=400",  # noqa: RUF001
            id="against the baseline",
        ),
        pytest.param(
            ABSOLUTE,
            evaluation(
                {"failures": 9, "count": 75, "failure_ratio": 0.12, **WINDOW},
                {"failures": 1, "count": 90, "failure_ratio": 1 / 90},
                failures={"basis": "ratio_and_binomial_vs_bound", "observed": 0.12,
                          "bound": 0.05, "exceeded": True, "breached": True},
            ),
            "canary failures 12.0% (9/75) > bound 5.0% over the last 10 s; baseline 1.1% (1/90)",
            id="failures",
        ),
        pytest.param(
            ABSOLUTE,
            evaluation(
                {}, {},
                error_ratio={"observed": 0.041, "bound": 0.019, "exceeded": True,
                             "breached": True, "status": "judged",
                             "metric": {"kind": "ratio", "compare": "baseline",
                                        "baseline": {"value": 0.009}}},
            ),
            "error_ratio 4.1% > 1.9% (baseline 0.9%)",
            id="provider metric",
        ),
    ],
)  # fmt: skip
def test_breached_guardrails_in_words(rule: Any, found: Any, text: str) -> None:
    assert evaluation_sentence(found, rule, which="exceeded") == text


def test_a_trip_decided_by_the_rollout_reads_with_its_numbers() -> None:
    event = tripped().events[-1]
    assert event_sentence(event.kind, event.reason, event.payload, now=T0 + 25) == (
        "tripped (trip 1 of 3): canary P95 900 ms > bound 300 ms over the last 10 s, n=1000 "
        "(20.0% above it, 5.0% allowed); baseline P95 200 ms; canary cut to 0%, probed again "
        "at 1% from 08:01:20Z (in 55 s)"
    )
    assert "e-" not in event_sentence(event.kind, event.reason, event.payload)  # no p-values


def test_the_last_trip_allowed_promises_no_probe() -> None:
    decision = tripped(r=rule(max_trips=1))
    trip = next(e for e in decision.events if e.kind == "tripped")
    text = event_sentence(trip.kind, trip.reason, trip.payload, now=T0 + 25)
    assert text.startswith("tripped (trip 1 of 1): canary P95 900 ms > bound 300 ms")
    assert text.endswith("; canary cut to 0%; that was the last trip allowed: rolled back")
    assert "probe" not in text


@pytest.mark.parametrize(
    ("kind", "reason", "payload", "actor", "text"),
    [
        ("started", "", start(STEPS, T0).events[-1].payload, "controller",
         "started: 1% of traffic to the canary"),
        ("half_open", "", {"evidence": {"weights": {"canary_bp_after": 100},
                                         "rule": {"window_sec": 30}}}, "controller",
         "cooldown over: probing the canary at 1% for at least 30 s"),
        ("probe_passed", "", {"evidence": {"weights": {"canary_bp_after": 500},
                                            "step_index": {"after": 1}}}, "controller",
         "probe passed: canary back at 5% (step 2)"),
        ("rolled_back", "", {"evidence": {"trips": 3, "rule": {"max_trips": 3},
                                           "weights": {"canary_bp_after": 0}}}, "controller",
         "rolled back (trip 3 of 3); all traffic to the baseline"),
        ("pause", "change freeze", {}, "token:alice", "paused by token:alice: change freeze"),
        ("promote", "promote by token:ci", {}, "token:ci", "promoted by token:ci"),
        ("rule_changed", "rule for shop replaced", {}, "token:ops", "rule for shop replaced"),
        ("no_data", "", {}, "controller", "no data"),
        ("tripped", "trip 1 of 3: old payload", {}, "controller", "trip 1 of 3: old payload"),
    ],
)  # fmt: skip
def test_events_in_words(
    kind: str, reason: str, payload: dict[str, Any], actor: str, text: str
) -> None:
    assert event_sentence(kind, reason, payload, actor=actor) == text


BASE: dict[str, Any] = {
    "state": "running", "breaker": "closed", "step_index": 1, "steps": 4,
    "step_weight_bp": 2500, "canary_bp": 2500, "trips": 0, "now": NOW,
}  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        ({"next_at": NOW + 40}, "holding step 2 of 4 (25%) until 08:00:40Z (in 40 s)"),
        ({"next_at": NOW - 5}, "step 2 of 4 (25%) due since 07:59:55Z (5 s ago): waiting for "
         "its evidence"),
        ({"next_at": NOW + 40, "now": None}, "holding step 2 of 4 (25%) until "
         "2027-01-15T08:00:40Z"),
        ({"breaker": "open", "canary_bp": 0, "trips": 1, "max_trips": 3, "next_at": NOW + 120},
         "tripped (trip 1 of 3): canary at 0%, cooling down until 08:02:00Z (in 2 min)"),
        ({"breaker": "half_open", "canary_bp": 100, "trips": 1, "next_at": NOW + 30},
         "probing the canary at 1% (trip 1) until 08:00:30Z (in 30 s)"),
        ({"held_reason": "latency breached (action: pause)"},
         "holding step 2 of 4 (25%): latency breached (action: pause)"),
        ({"state": "paused"}, "paused at step 2 of 4, canary at 25%, until someone resumes it"),
        ({"state": "promoted", "canary_bp": 10000}, "promoted: 100% of traffic to the canary"),
        ({"state": "rolled_back"}, "rolled back: all traffic to the baseline"),
        ({"state": "draft", "step_index": -1}, "draft: not started"),
    ],
)  # fmt: skip
def test_where_a_rollout_stands_in_words(changes: dict[str, Any], text: str) -> None:
    assert status_sentence(**{**BASE, **changes}) == text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner,
                                                                  max_size=4),
    max_leaves=20,
)
KEYS = st.sampled_from(["evidence", "window", "variants", "canary", "guardrails", "latency",
                        "weights", "rule", "trips", "step_gate", "fast_window", "at"])


@given(
    kind=st.sampled_from(["tripped", "probe_failed", "rolled_back", "started", "half_open",
                          "probe_passed", "step_advanced", "promoted", "pause", "other"]),
    payload=st.dictionaries(KEYS, JSON | st.dictionaries(KEYS, JSON, max_size=4), max_size=4),
)  # fmt: skip
def test_any_payload_gives_a_sentence_never_an_error(kind: str, payload: dict[str, Any]) -> None:
    assert isinstance(event_sentence(kind, "why", payload, now=NOW), str)
