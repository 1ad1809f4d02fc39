"""Table tests for one breaker evaluation (evaluate) on hand-made and sampled windows."""

from __future__ import annotations

import numpy as np

from controlplane.decision import Verdict, evaluate
from tests.decision.factory import T0, rule, sampled, snap

TS = T0 + 30


def test_no_canary_samples_is_no_data_never_a_pass() -> None:
    assert evaluate(None, None, rule()).verdict is Verdict.NO_DATA
    assert evaluate(snap("canary", TS, count=0), None, rule()).verdict is Verdict.NO_DATA


def test_fewer_than_min_samples_is_too_few_samples_even_when_all_are_slow() -> None:
    result = evaluate(snap("canary", TS, count=99, above=99), None, rule(min_samples=100))
    assert result.verdict is Verdict.TOO_FEW_SAMPLES
    assert "99 canary samples" in result.reason


def test_p95_breach_is_decided_from_exact_counts_not_the_reported_percentile() -> None:
    # the sketch says 200 ms, yet 20% of the samples are above 300 ms: P95 > 300 exactly
    result = evaluate(snap("canary", TS, above=200, p95_ms=200.0), None, rule())
    assert result.verdict is Verdict.BREACH
    latency = result.guardrails[0]
    assert latency.basis == "exact_above_threshold_count"
    assert latency.observed == 0.2 and latency.bound == 0.05


def test_exactly_five_percent_above_means_p95_is_not_above_the_threshold() -> None:
    result = evaluate(snap("canary", TS, count=1000, above=50, p95_ms=400.0), None, rule())
    assert result.verdict is Verdict.PASS
    assert not result.guardrails[0].exceeded


def test_p999_bound_is_compared_in_integers() -> None:
    r = rule(percentile=99.9)
    assert evaluate(snap("canary", TS, count=10_000, above=10), None, r).verdict is Verdict.PASS
    breach = evaluate(snap("canary", TS, count=10_000, above=40), None, r)
    assert breach.verdict is Verdict.BREACH


def test_exceedance_that_is_not_significant_is_not_a_breach() -> None:
    # 7 of 100 above a 5% tail: over the bound, but p ~ 0.23 under H0 "P95 <= T"
    result = evaluate(snap("canary", TS, count=100, above=7), None, rule())
    latency = result.guardrails[0]
    assert latency.exceeded and not latency.breached
    assert result.verdict is Verdict.PASS
    assert latency.test is not None and latency.test.p_value > 0.1


def test_falls_back_to_reported_percentile_when_counts_are_not_exact_and_says_so() -> None:
    canary = snap("canary", TS, above=0, p95_ms=450.0, threshold_exact=False)
    result = evaluate(canary, None, rule())
    latency = result.guardrails[0]
    assert result.verdict is Verdict.BREACH
    assert latency.basis == "reported_percentile"
    assert latency.note is not None and "not exact" in latency.note


def test_falls_back_when_the_snapshot_counted_another_threshold() -> None:
    canary = snap("canary", TS, above=500, p95_ms=250.0, threshold_ms=200.0)
    result = evaluate(canary, None, rule(threshold_ms=300.0))
    assert result.verdict is Verdict.PASS
    note = result.guardrails[0].note
    assert note is not None and "200.0 ms" in note


def test_failure_ratio_above_the_bound_breaches_in_absolute_mode() -> None:
    result = evaluate(snap("canary", TS, failures=200), None, rule(failure_ratio=0.05))
    failures = result.guardrails[1]
    assert result.verdict is Verdict.BREACH and failures.breached
    assert failures.basis == "ratio_and_binomial_vs_bound"


def test_both_guardrails_are_tested_and_holm_adjusted_once_one_exceeds() -> None:
    result = evaluate(snap("canary", TS, failures=200, above=10), None, rule(failure_ratio=0.05))
    latency, failures = result.guardrails
    assert latency.test is not None and failures.test is not None
    assert failures.p_adjusted is not None
    assert failures.p_adjusted == min(1.0, 2 * failures.test.p_value)


def test_healthy_window_skips_the_tests() -> None:
    result = evaluate(snap("canary", TS, above=10), None, rule())
    assert result.verdict is Verdict.PASS
    assert all(g.test is None for g in result.guardrails)


def _lognormal(rng: np.random.Generator, n: int, median: float) -> np.ndarray:
    return rng.lognormal(np.log(median), 0.5, n)


def test_baseline_mode_breaches_when_canary_is_slower_by_the_margin_and_significantly() -> None:
    rng = np.random.default_rng(1)
    r = rule(compare="baseline", baseline_margin=1.2)
    canary = sampled("canary", _lognormal(rng, 1000, 200), np.zeros(1000), TS)
    baseline = sampled("baseline", _lognormal(rng, 1000, 100), np.zeros(1000), TS)
    result = evaluate(canary, baseline, r)
    latency = result.guardrails[0]
    assert result.verdict is Verdict.BREACH
    assert latency.basis == "percentile_ratio_and_rank_test"
    assert latency.test is not None and latency.test.method == "mann_whitney_u_greater"


def test_baseline_mode_needs_a_significant_rank_test_not_only_the_ratio() -> None:
    # the reported P95s differ by 1.5x, but the reservoirs are the same distribution
    rng = np.random.default_rng(2)
    same = tuple(float(v) for v in _lognormal(rng, 500, 100))
    r = rule(compare="baseline")
    canary = snap("canary", TS, p95_ms=300.0, reservoir=same)
    baseline = snap("baseline", TS, p95_ms=200.0, reservoir=same[::-1])
    result = evaluate(canary, baseline, r)
    assert result.guardrails[0].exceeded and not result.guardrails[0].breached
    assert result.verdict is Verdict.PASS


def test_baseline_mode_failures_must_also_be_worse_than_the_baseline() -> None:
    r = rule(compare="baseline", failure_ratio=0.05)
    same = evaluate(snap("canary", TS, failures=80), snap("baseline", TS, failures=80), r)
    assert same.guardrails[1].exceeded and same.verdict is Verdict.PASS
    worse = evaluate(snap("canary", TS, failures=80), snap("baseline", TS, failures=10), r)
    assert worse.verdict is Verdict.BREACH
    assert worse.guardrails[1].basis == "ratio_and_fisher_vs_baseline"


def test_baseline_mode_with_too_few_baseline_samples_gives_no_verdict() -> None:
    r = rule(compare="baseline")
    result = evaluate(snap("canary", TS), snap("baseline", TS, count=10), r)
    assert result.verdict is Verdict.TOO_FEW_SAMPLES
    assert "baseline" in result.reason
