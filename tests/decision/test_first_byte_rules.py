"""A rule judges the latency it names: the total time, or the time to the first byte.

A stream whose body is slow but whose head comes fast passes a first_byte rule and
trips a total one; a slow head trips both. A first_byte rule never judges on nothing:
windows without first-byte samples are no data, and the evidence shows both latencies.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from controlplane.decision import BreakerState
from controlplane.decision.breaker import Verdict, evaluate
from controlplane.decision.rollout import decide
from controlplane.decision.tally import Tally
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.rules import Latency, parse_rule
from controlplane.kernel.snapshots import FIRST_BYTE, WindowSnapshot
from tests.decision.factory import STEPS, T0, rule, snap, state


def stream(
    variant: str, ts: float, *, total_above: int, first_byte_above: int, with_first_byte: int = 1000
) -> WindowSnapshot:
    """A window of 1000 streams: `*_above` of them over the threshold in each latency."""
    whole = snap(variant, ts, above=total_above, p95_ms=900.0 if total_above > 50 else 200.0)
    head = snap(
        variant,
        ts,
        count=with_first_byte,
        above=first_byte_above,
        p95_ms=900.0 if first_byte_above * 1000 > 50 * with_first_byte else 20.0,
    )
    return replace(whole, first_byte=replace(head, latency=FIRST_BYTE))


SLOW_BODY = {"total_above": 900, "first_byte_above": 0}
SLOW_HEAD = {"total_above": 900, "first_byte_above": 900}


@pytest.mark.parametrize(
    ("latency", "window", "verdict"),
    [
        (Latency.TOTAL, SLOW_BODY, Verdict.BREACH),
        (Latency.FIRST_BYTE, SLOW_BODY, Verdict.PASS),
        (Latency.TOTAL, SLOW_HEAD, Verdict.BREACH),
        (Latency.FIRST_BYTE, SLOW_HEAD, Verdict.BREACH),
    ],
)
def test_the_rule_judges_the_latency_it_names(
    latency: Latency, window: dict[str, int], verdict: Verdict
) -> None:
    canary = stream("canary", T0, **window)
    got = evaluate(canary, None, rule(latency=latency))
    assert got.verdict is verdict, got.reason
    evidence = got.variants["canary"]
    assert evidence["latency"] == latency.value
    assert evidence["total"]["p95_ms"] == 900.0
    assert evidence["first_byte"]["p95_ms"] in (20.0, 900.0)
    assert evidence["samples_without_first_byte"] == 0


def test_a_first_byte_rule_compares_first_bytes_with_the_baseline() -> None:
    r = rule(latency="first_byte", compare="baseline", baseline_margin=1.2)
    baseline = stream("baseline", T0, **SLOW_BODY)
    slow_head = replace(
        stream("canary", T0, **SLOW_HEAD),
        first_byte=replace(snap("canary", T0, above=900, p95_ms=900.0), latency=FIRST_BYTE),
    )
    assert evaluate(stream("canary", T0, **SLOW_BODY), baseline, r).verdict is Verdict.PASS
    assert evaluate(slow_head, baseline, r).verdict is Verdict.BREACH


def test_without_first_byte_samples_a_first_byte_rule_has_no_data() -> None:
    old_collector = snap("canary", T0, above=900, p95_ms=900.0)  # no nested window
    old_sidecars = stream("canary", T0, with_first_byte=0, total_above=900, first_byte_above=0)
    for canary in (old_collector, old_sidecars):
        got = evaluate(canary, None, rule(latency="first_byte"))
        assert got.verdict is Verdict.NO_DATA
        assert "1000 without" in got.reason
        assert got.variants["canary"]["samples_without_first_byte"] == 1000
    assert evaluate(old_collector, None, rule()).verdict is Verdict.BREACH


def test_min_samples_counts_the_samples_with_a_first_byte() -> None:
    canary = stream("canary", T0, with_first_byte=60, total_above=0, first_byte_above=0)
    got = evaluate(canary, None, rule(latency="first_byte", min_samples=100))
    assert got.verdict is Verdict.TOO_FEW_SAMPLES and "60 canary samples" in got.reason
    assert evaluate(canary, None, rule(min_samples=100)).verdict is Verdict.PASS


def test_a_slow_stream_never_trips_a_first_byte_rule_but_a_slow_head_does() -> None:
    for window, tripped in ((SLOW_BODY, False), (SLOW_HEAD, True)):
        s = state()
        for look in range(3):
            now = T0 + 11 * (look + 1)
            snapshots = {"canary": stream("canary", now, **window)}
            s = decide(s, snapshots, rule(latency="first_byte"), STEPS, now).new_state
        assert (s.breaker is BreakerState.OPEN) is tripped


def test_no_first_byte_data_holds_a_first_byte_rule_until_its_no_data_timeout() -> None:
    r = rule(latency="first_byte", no_data="fail", no_data_timeout_sec=30)
    s = state()
    tripped_at = None
    for look in range(6):
        now = T0 + 11 * (look + 1)
        canary = stream("canary", now, with_first_byte=0, total_above=0, first_byte_above=0)
        s = decide(s, {"canary": canary}, r, STEPS, now).new_state
        if s.breaker is BreakerState.OPEN and tripped_at is None:
            tripped_at = now
    assert tripped_at is not None and tripped_at - (T0 + 11) >= 30


def test_the_tally_starts_over_when_the_rule_changes_latency() -> None:
    tally = Tally.starting(T0)
    whole = stream("canary", T0 + 10, **SLOW_BODY)
    tally = tally.add(whole, None)
    assert tally.latency == "total" and tally.canary.count == 1000
    head = whole.for_latency("first_byte")
    moved = tally.add(replace(head, window_start=T0 + 10, window_end=T0 + 20, ts=T0 + 20), None)
    assert moved.latency == "first_byte" and moved.windows == 1
    assert Tally.from_dict(json.loads(json.dumps(moved.to_dict()))) == moved
    assert moved.snapshots("e1")["canary"].latency == "first_byte"
    assert "latency" not in tally.to_dict()  # a total tally reads as before


def test_a_total_rule_is_written_as_before_and_first_byte_is_named() -> None:
    total = rule()
    assert "latency" not in json.loads(total.to_json())
    assert "latency" not in total.model_dump(mode="json")
    first_byte = rule(latency="first_byte")
    assert json.loads(first_byte.to_json())["latency"] == "first_byte"
    assert parse_rule(first_byte.to_json()) == first_byte
    assert parse_rule(total.to_json()).latency is Latency.TOTAL


@pytest.mark.parametrize("value", ["ttfb", "", "FIRST_BYTE", 1, None, True, ["total"]])
def test_a_latency_that_is_not_total_or_first_byte_is_refused(value: object) -> None:
    data = json.loads(rule().to_json())
    with pytest.raises(ValidationFailed) as caught:
        parse_rule({**data, "latency": value})
    assert any(error.loc[0] == "latency" for error in caught.value.errors)
