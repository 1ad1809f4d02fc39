"""The baseline comparison with the rule's judgment knobs: direction and effect gate.

A rule that sets neither (`direction` increase for both guardrails, no `effect`)
never reaches this module: the breaker keeps its own checks, bit for bit. With the
knobs, each guardrail is over its bound when its effect is beyond the allowed one in
a bad direction, and the test is the one-sided rank (latency) or Fisher (failures)
test of that direction; `either` doubles the one-sided p-value, which spends the
alpha over both tails. Kayenta's semantics, in p-value form so that the breaker's
Holm correction and per-look alpha apply unchanged (docs/decisions/0013).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from controlplane.decision.stats import (
    TestResult,
    failure_comparison_test,
    latency_shift_test,
)
from controlplane.kernel.judgment import Direction, EffectKind
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot


@dataclass(frozen=True)
class Gate:
    """One guardrail's bound and test under the knobs; the breaker makes it a Guardrail."""

    basis: str
    observed: float | None
    bound: float | None
    exceeded: bool
    test: TestResult | None = None
    note: str | None = None


def latency_knobs_set(rule: BreakerRule) -> bool:
    return rule.effect is not None or rule.direction.latency is not Direction.INCREASE


def failure_knobs_set(rule: BreakerRule) -> bool:
    return rule.direction.failures is not Direction.INCREASE


@dataclass(frozen=True)
class _Effect:
    kind: str
    size: float | None
    upper: float
    lower: float
    note: str | None = None


def _ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or bottom is None or top == 0.0 or bottom == 0.0:
        return None
    return top / bottom


def _effect(canary: WindowSnapshot, baseline: WindowSnapshot, rule: BreakerRule) -> _Effect:
    """The rule's effect size; without a gate, the percentile ratio against the margin."""
    percentile_ratio = _ratio(
        canary.percentile_ms(rule.percentile), baseline.percentile_ms(rule.percentile)
    )
    margin = _Effect(
        "percentile_ratio", percentile_ratio, rule.baseline_margin, 1 / rule.baseline_margin
    )
    gate = rule.effect
    if gate is None:
        return margin
    reservoirs = bool(canary.reservoir_ms and baseline.reservoir_ms)
    if gate.kind is EffectKind.PERCENTILE_RATIO:
        q = gate.percentile or rule.percentile
        size = _ratio(canary.percentile_ms(q), baseline.percentile_ms(q))
        return _Effect(gate.kind.value, size, gate.upper, gate.lower)
    if gate.kind is EffectKind.MEAN_RATIO:
        if canary.mean_ms is not None and baseline.mean_ms is not None:
            size = _ratio(canary.mean_ms, baseline.mean_ms)
            return _Effect(gate.kind.value, size, gate.upper, gate.lower)
        if reservoirs:
            size = _ratio(
                float(np.mean(canary.reservoir_ms)), float(np.mean(baseline.reservoir_ms))
            )
            return _Effect(gate.kind.value, size, gate.upper, gate.lower, "means of the reservoirs")
    elif reservoirs:
        u = sps.mannwhitneyu(canary.reservoir_ms, baseline.reservoir_ms).statistic
        size = float(u) / (len(canary.reservoir_ms) * len(baseline.reservoir_ms))
        return _Effect(gate.kind.value, size, gate.upper, gate.lower)
    return _Effect(
        margin.kind,
        margin.size,
        margin.upper,
        margin.lower,
        f"no data for {gate.kind.value} in a snapshot: the percentile ratio and margin judged",
    )


def _rank_test(canary: WindowSnapshot, baseline: WindowSnapshot, side: Direction) -> TestResult:
    if side is Direction.INCREASE:
        return latency_shift_test(canary.reservoir_ms, baseline.reservoir_ms)
    result = sps.mannwhitneyu(canary.reservoir_ms, baseline.reservoir_ms, alternative="less")
    return TestResult(
        "latency", "mann_whitney_u_less", float(result.statistic), float(result.pvalue)
    )


def _fisher_test(canary: WindowSnapshot, baseline: WindowSnapshot, side: Direction) -> TestResult:
    if side is Direction.INCREASE:
        return failure_comparison_test(
            canary.failures, canary.count, baseline.failures, baseline.count
        )
    table = [
        [canary.failures, canary.count - canary.failures],
        [baseline.failures, baseline.count - baseline.failures],
    ]
    result = sps.fisher_exact(table, alternative="less")
    return TestResult(
        "failures", "fisher_exact_less", float(result.statistic), float(result.pvalue)
    )


def _two_tailed(result: TestResult) -> TestResult:
    """`either`: the side that is over its bound, at twice its one-sided p."""
    return TestResult(
        result.name,
        f"{result.method}_two_sided",
        result.statistic,
        min(1.0, 2 * result.p_value),
    )


def _side(direction: Direction, high: bool, low: bool) -> Direction:
    if direction is not Direction.EITHER:
        return direction
    return Direction.DECREASE if low and not high else Direction.INCREASE


def baseline_latency_gate(
    canary: WindowSnapshot, baseline: WindowSnapshot, rule: BreakerRule, test: bool
) -> Gate:
    direction = rule.direction.latency
    effect = _effect(canary, baseline, rule)
    note = effect.note
    if effect.size is None:
        # Kayenta: an effect size that cannot be computed does not gate; the test decides
        high, low = direction.flags_high, direction.flags_low
        note = note or f"{effect.kind} not computable (a zero or missing value): test alone"
    else:
        high = direction.flags_high and effect.size > effect.upper
        low = direction.flags_low and effect.size < effect.lower
    side = _side(direction, high, low)
    bound = effect.lower if side is Direction.DECREASE else effect.upper
    if not (canary.reservoir_ms and baseline.reservoir_ms):
        reason = "no reservoir in a snapshot: the rank test was not run"
        return Gate(
            basis=f"{effect.kind}_{direction.value}",
            observed=effect.size,
            bound=bound,
            exceeded=(high or low) and effect.size is not None,
            note="; ".join(n for n in (note, reason) if n),
        )
    result: TestResult | None = None
    if test:
        result = _rank_test(canary, baseline, side)
        if direction is Direction.EITHER:
            result = _two_tailed(result)
    return Gate(
        basis=f"{effect.kind}_{direction.value}_and_rank_test",
        observed=effect.size,
        bound=bound,
        exceeded=high or low,
        test=result,
        note=note,
    )


def baseline_failure_gate(
    canary: WindowSnapshot, baseline: WindowSnapshot, rule: BreakerRule, test: bool
) -> Gate:
    """Increase: over `failure_ratio`, as without knobs. Decrease: the canary fails
    less than the baseline by more than `failure_ratio` (a canary that stopped
    reporting errors it should report)."""
    direction = rule.direction.failures
    observed = canary.failure_ratio
    floor = baseline.failure_ratio - rule.failure_ratio
    high = direction.flags_high and observed > rule.failure_ratio
    low = direction.flags_low and observed < floor
    side = _side(direction, high, low)
    result: TestResult | None = None
    if test:
        result = _fisher_test(canary, baseline, side)
        if direction is Direction.EITHER:
            result = _two_tailed(result)
    return Gate(
        basis=f"ratio_{direction.value}_and_fisher_vs_baseline",
        observed=observed,
        bound=floor if side is Direction.DECREASE else rule.failure_ratio,
        exceeded=high or low,
        test=result,
    )
