"""The rule's Kayenta-compatible knobs in live decisions: direction, effect, confidence."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from controlplane.decision import BreakerState, Verdict, decide, evaluate
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.rules import BreakerRule, parse_rule
from controlplane.kernel.snapshots import WindowSnapshot
from tests.decision.factory import STEPS, T0, rule, sampled, snap, state

TS = T0 + 20
HALF = state(step_index=3, canary_bp=STEPS[3].weight_bp)  # 50/50: equal counts, no SRM


def windows(
    canary_factor: float, ts: float, *, seed: int = 3, n: int = 1000
) -> dict[str, WindowSnapshot]:
    rng = np.random.default_rng(seed)
    base = rng.lognormal(np.log(100), 0.4, n)
    canary = rng.lognormal(np.log(100), 0.4, n) * canary_factor
    zeros = np.zeros(n)
    return {
        "canary": sampled("canary", canary, zeros, ts),
        "baseline": sampled("baseline", base, zeros, ts),
    }


def trips(r: BreakerRule, canary_factor: float) -> bool:
    """Two fresh windows in a row, as the controller sees them 250 ms apart."""
    first = decide(HALF, windows(canary_factor, TS), r, STEPS, TS)
    second = decide(first.new_state, windows(canary_factor, TS + 0.25, seed=4), r, STEPS, TS + 0.25)
    return second.new_state.breaker is BreakerState.OPEN


def baseline_rule(**overrides: Any) -> BreakerRule:
    return rule(compare="baseline", threshold_ms=10_000, **overrides)


# ---------------------------------------------------------------- the rule


def test_defaults_leave_the_rule_as_it_was() -> None:
    r = rule()
    assert r.direction.is_default and r.effect is None and r.confidence is None
    assert r.alpha == 0.01
    assert parse_rule(r.to_json()) == r


def test_confidence_sets_alpha_and_survives_a_round_trip() -> None:
    r = parse_rule({"service": "s", "threshold_ms": 300, "confidence": 0.999})
    assert r.alpha == pytest.approx(0.001)
    assert parse_rule(r.to_json()) == r


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"alpha": 0.05, "confidence": 0.99}, "contradicts"),
        # an out-of-range alpha next to the confidence it matches is still out of range
        ({"alpha": 0.5, "confidence": 0.5000000000000001}, "less than 0.5"),
        ({"alpha": "0.01", "confidence": 0.99}, "valid number"),
        ({"confidence": 1.0}, "less than 1"),
        ({"confidence": "0.99"}, "valid number"),
        ({"direction": {"latency": "decrease"}}, "compare: baseline"),
        ({"effect": {"kind": "mean_ratio", "max": 1.2}}, "compare: baseline"),
        ({"compare": "baseline", "direction": {"latency": "down"}}, "increase"),
        ({"compare": "baseline", "direction": {"latncy": "either"}}, "Extra inputs"),
        ({"compare": "baseline", "effect": {"kind": "cles", "max": 1.2}}, "[0.5, 1]"),
        ({"compare": "baseline", "effect": {"kind": "mean_ratio", "max": 0.9}}, "[1, 1e+06]"),
        ({"compare": "baseline", "effect": {"kind": "mean_ratio", "max": float("nan")}}, "finite"),
        ({"compare": "baseline", "effect": {"kind": "mean_ratio", "max": "2"}}, "valid number"),
        (
            {"compare": "baseline", "effect": {"kind": "mean_ratio", "max": 2, "percentile": 99}},
            "only for kind percentile_ratio",
        ),
        (
            {
                "compare": "baseline",
                "effect": {"kind": "percentile_ratio", "max": 2, "percentile": 97},
            },
            "must be one of",
        ),
        ({"compare": "baseline", "effect": {"kind": "median", "max": 2}}, "mean_ratio"),
    ],
)
def test_bad_knobs_are_refused_by_name(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_rule({"service": "s", "threshold_ms": 300, **fields})
    assert message in str([e.msg for e in caught.value.errors])


def test_effect_min_defaults_to_the_mirror() -> None:
    r = baseline_rule(effect={"kind": "mean_ratio", "max": 1.25})
    assert r.effect is not None and r.effect.lower == pytest.approx(0.8)
    c = baseline_rule(effect={"kind": "cles", "max": 0.6})
    assert c.effect is not None and c.effect.lower == pytest.approx(0.4)


# ---------------------------------------------------------------- evaluations


def test_the_knob_path_with_default_meaning_decides_as_the_default_path() -> None:
    """A percentile_ratio gate at the margin is what the default rule checks: same
    bound, same test, same verdict (the knob path is not a different judge)."""
    default = baseline_rule()
    gated = baseline_rule(effect={"kind": "percentile_ratio", "max": 1.2})
    for factor in (0.7, 1.0, 1.15, 1.3, 2.0):
        w = windows(factor, TS)
        a = evaluate(w["canary"], w["baseline"], default, always_test=True)
        b = evaluate(w["canary"], w["baseline"], gated, always_test=True)
        assert a.verdict is b.verdict, factor
        for ga, gb in zip(a.guardrails, b.guardrails, strict=True):
            assert (ga.observed, ga.exceeded, ga.breached) == (
                gb.observed,
                gb.exceeded,
                gb.breached,
            )
            assert ga.p_adjusted == gb.p_adjusted


def test_direction_decrease_trips_on_a_faster_canary_and_not_on_a_slower_one() -> None:
    r = baseline_rule(direction={"latency": "decrease"})
    assert trips(r, 0.5)
    assert not trips(r, 2.0)
    # the default (increase) is the other way round
    assert trips(baseline_rule(), 2.0)
    assert not trips(baseline_rule(), 0.5)


def test_direction_decrease_evidence_names_the_lower_bound_and_test() -> None:
    r = baseline_rule(direction={"latency": "decrease"})
    w = windows(0.5, TS)
    latency = evaluate(w["canary"], w["baseline"], r).guardrails[0]
    assert latency.breached
    assert latency.basis == "percentile_ratio_decrease_and_rank_test"
    assert latency.bound == pytest.approx(1 / 1.2)
    assert latency.test is not None and latency.test.method == "mann_whitney_u_less"


def test_either_trips_both_ways_at_twice_the_one_sided_p() -> None:
    r = baseline_rule(direction={"latency": "either"})
    assert trips(r, 0.5) and trips(r, 2.0)
    assert not trips(r, 1.0)
    w = windows(1.3, TS, n=200)
    one = evaluate(w["canary"], w["baseline"], baseline_rule()).guardrails[0]
    both = evaluate(w["canary"], w["baseline"], r).guardrails[0]
    assert one.test is not None and both.test is not None
    assert both.test.p_value == pytest.approx(min(1.0, 2 * one.test.p_value))
    assert both.test.method == "mann_whitney_u_greater_two_sided"


def test_effect_gate_replaces_the_margin() -> None:
    # 1.3x slower: over the default margin of 1.2, within an allowed 1.5
    assert trips(baseline_rule(), 1.3)
    assert not trips(baseline_rule(effect={"kind": "percentile_ratio", "max": 1.5}), 1.3)
    assert not trips(baseline_rule(effect={"kind": "mean_ratio", "max": 1.5}), 1.3)
    # ... and a tighter gate catches a change the margin lets through
    assert not trips(baseline_rule(), 1.15)
    assert trips(baseline_rule(effect={"kind": "mean_ratio", "max": 1.05}), 1.15)
    assert trips(baseline_rule(effect={"kind": "cles", "max": 0.55}), 1.15)


def test_effect_evidence_is_the_measure_the_rule_names() -> None:
    w = windows(1.12, TS)
    latency = evaluate(
        w["canary"], w["baseline"], baseline_rule(effect={"kind": "mean_ratio", "max": 1.05})
    ).guardrails[0]
    assert latency.basis == "mean_ratio_increase_and_rank_test"
    assert latency.observed == pytest.approx(w["canary"].mean_ms / w["baseline"].mean_ms)  # type: ignore[operator]
    assert latency.bound == 1.05


def test_cles_gate_without_reservoirs_falls_back_to_the_margin_and_says_so() -> None:
    r = baseline_rule(effect={"kind": "cles", "max": 0.55})
    latency = evaluate(snap("canary", TS, p95_ms=400.0), snap("baseline", TS), r).guardrails[0]
    assert latency.exceeded and latency.observed == 2.0 and latency.bound == 1.2
    assert latency.note is not None and "no data for cles" in latency.note


def test_failures_decrease_trips_when_the_canary_stops_failing() -> None:
    """A canary that answers 200 where the baseline fails a tenth (a swallowed error)."""
    r = baseline_rule(failure_ratio=0.05, direction={"failures": "decrease"})
    canary, baseline = snap("canary", TS, failures=0), snap("baseline", TS, failures=100)
    result = evaluate(canary, baseline, r)
    failures = result.guardrails[1]
    assert result.verdict is Verdict.BREACH
    assert failures.bound == pytest.approx(0.05) and failures.observed == 0.0
    assert failures.test is not None and failures.test.method == "fisher_exact_less"
    assert evaluate(canary, baseline, baseline_rule(failure_ratio=0.05)).verdict is Verdict.PASS
    worse = evaluate(snap("canary", TS, failures=100), snap("baseline", TS, failures=0), r)
    assert worse.verdict is Verdict.PASS


def test_confidence_is_the_alpha_of_the_judgment() -> None:
    canary = snap("canary", TS, count=1000, failures=70)  # over 5%, Holm p near 0.007
    default = evaluate(canary, None, rule())
    failures = default.guardrails[1]
    assert failures.p_adjusted is not None and 0.001 < failures.p_adjusted < 0.01
    assert default.verdict is Verdict.BREACH
    strict = parse_rule({**rule().model_dump(exclude={"alpha"}), "confidence": 0.999})
    assert evaluate(canary, None, strict).verdict is Verdict.PASS
