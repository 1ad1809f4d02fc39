"""A one-shot judgment of two sample sets, with the semantics of Kayenta's judge.

Kayenta's MannWhitneyClassifier (spinnaker/kayenta, kayenta-judge) classifies a
metric as High, Low, Pass or Nodata: a Mann-Whitney confidence interval for the
location shift canary - baseline (the Hodges-Lehmann shift) must exclude zero by a
tolerance (a quarter of the estimate), the effect size must be beyond the allowed
one, and the metric's direction says which of High and Low count. `judge` does the
same on latencies (and, optionally, failure counts), deterministically, and returns
every number it decided on, so the verdict can be checked by hand.

How the interval is computed. Kayenta (like R's `wilcox.test(conf.int=TRUE,
exact=FALSE)`) solves (U(mu) - nm/2 -+ 1/2) / sigma = +-z for mu, where U(mu)
counts the pairs with canary - mu > baseline (ties count a half) and sigma carries
the tie correction. U is a step function of mu that jumps only at the pairwise
differences d = canary_i - baseline_j, so the roots are order statistics of d; this
module finds which ones from the same equation and selects them exactly, instead of
running a root finder to a tolerance (Kayenta's is 1e-4 absolute). The estimate is
the median of d, the Hodges-Lehmann estimator, which lies in the set where the same
equation has its root at z = 0. Deviations are listed in docs/decisions/0013.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import special as spc
from scipy import stats as sps

from controlplane.kernel.judgment import Direction, EffectGate, EffectKind

# Kayenta's NetflixACAJudge: the interval must clear a quarter of the estimate
DEFAULT_TOLERANCE = 0.25
# Kayenta's default effect gate (meanRatio, allowed increase and decrease 1.0)
DEFAULT_EFFECT = EffectGate(kind=EffectKind.MEAN_RATIO, max=1.0, min=1.0)
DEFAULT_CONFIDENCE = 0.99
DEFAULT_PERCENTILE = 95.0
# pairwise differences are materialised (8 bytes each) up to this many pairs; beyond,
# order statistics are found by bisection on the value, counting pairs per row
MATERIALISE_PAIRS = 4_000_000
# ... until the band left holds at most this many pairs, which are then materialised
BAND_PAIRS = 1_000_000

FloatArray = npt.NDArray[np.float64]


class Classification(StrEnum):
    PASS = "pass"
    HIGH = "high"
    LOW = "low"
    NODATA = "nodata"


@dataclass(frozen=True)
class ShiftInterval:
    """The Mann-Whitney interval for canary - baseline at a two-sided `level`."""

    low: float
    high: float
    estimate: float
    level: float


@dataclass(frozen=True)
class LatencyEvidence:
    baseline_count: int
    canary_count: int
    baseline_mean: float | None = None
    canary_mean: float | None = None
    percentile: float = DEFAULT_PERCENTILE
    baseline_percentile: float | None = None
    canary_percentile: float | None = None
    shift_estimate: float | None = None
    interval_low: float | None = None
    interval_high: float | None = None
    interval_level: float | None = None
    tolerance: float = DEFAULT_TOLERANCE
    tolerance_bound: float | None = None
    mean_ratio: float | None = None
    effect_kind: str = DEFAULT_EFFECT.kind.value
    effect_size: float | None = None
    effect_max: float = DEFAULT_EFFECT.upper
    effect_min: float = DEFAULT_EFFECT.lower
    u_statistic: float | None = None
    p_value_greater: float | None = None
    p_value_less: float | None = None


@dataclass(frozen=True)
class FailureEvidence:
    baseline_failures: int
    baseline_count: int
    canary_failures: int
    canary_count: int
    baseline_ratio: float | None = None
    canary_ratio: float | None = None
    odds_ratio: float | None = None
    p_value_greater: float | None = None
    p_value_less: float | None = None
    significance: float | None = None


@dataclass(frozen=True)
class MetricJudgment:
    name: str
    classification: Classification
    direction: Direction
    reason: str
    evidence: LatencyEvidence | FailureEvidence

    def to_dict(self) -> dict[str, Any]:
        return {
            "classification": self.classification.value,
            "direction": self.direction.value,
            "reason": self.reason,
            "evidence": asdict(self.evidence),
        }


@dataclass(frozen=True)
class Judgment:
    """The overall classification (high > low > nodata > pass) and each metric's."""

    classification: Classification
    confidence: float
    latency: MetricJudgment
    failures: MetricJudgment | None = None

    @property
    def reason(self) -> str:
        parts = [f"latency: {self.latency.reason}"]
        if self.failures is not None:
            parts.append(f"failures: {self.failures.reason}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "classification": self.classification.value,
            "confidence": self.confidence,
            "reason": self.reason,
            "metrics": {
                m.name: m.to_dict() for m in (self.latency, self.failures) if m is not None
            },
        }


@dataclass(frozen=True)
class FailureCounts:
    failures: int
    count: int


def judge(
    baseline: Sequence[float],
    canary: Sequence[float],
    *,
    direction: Direction = Direction.INCREASE,
    effect: EffectGate | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    min_samples: int = 1,
    tolerance: float = DEFAULT_TOLERANCE,
    failures: tuple[FailureCounts, FailureCounts] | None = None,
    failures_direction: Direction = Direction.INCREASE,
) -> Judgment:
    """Classify the canary against the baseline.

    `confidence` is the chance that an unchanged canary passes one metric: `either`
    reads both ends of a two-sided interval at that level, `increase` and
    `decrease` one end of the one-sided bound (the two-sided interval at
    2 * confidence - 1), so each direction spends the same 1 - confidence.
    `failures` is ((baseline failures, count), (canary failures, count)).
    """
    if not 0.5 < confidence < 1.0:
        raise ValueError("confidence must be within (0.5, 1)")
    if min_samples < 1:
        raise ValueError("min_samples must be at least 1")
    latency = judge_latency(
        _finite(baseline, "baseline"),
        _finite(canary, "canary"),
        direction=direction,
        effect=effect or DEFAULT_EFFECT,
        confidence=confidence,
        min_samples=min_samples,
        tolerance=tolerance,
    )
    failure = (
        judge_failures(
            failures[0], failures[1], direction=failures_direction, confidence=confidence
        )
        if failures is not None
        else None
    )
    return Judgment(_overall(latency, failure), confidence, latency, failure)


def _overall(*metrics: MetricJudgment | None) -> Classification:
    found = {m.classification for m in metrics if m is not None}
    for c in (Classification.HIGH, Classification.LOW, Classification.NODATA):
        if c in found:
            return c
    return Classification.PASS


def _finite(values: Sequence[float], name: str) -> FloatArray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of numbers")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} holds a value that is not a finite number")
    return array


def interval_level(direction: Direction, confidence: float) -> float:
    """The two-sided level whose end(s) the direction reads at `confidence`."""
    return confidence if direction is Direction.EITHER else 2 * confidence - 1


def judge_latency(
    baseline: FloatArray,
    canary: FloatArray,
    *,
    direction: Direction,
    effect: EffectGate,
    confidence: float,
    min_samples: int = 1,
    tolerance: float = DEFAULT_TOLERANCE,
) -> MetricJudgment:
    n, m = len(canary), len(baseline)
    q = effect.percentile or DEFAULT_PERCENTILE
    gate = {
        "effect_kind": effect.kind.value,
        "effect_max": effect.upper,
        "effect_min": effect.lower,
        "tolerance": tolerance,
        "percentile": q,
    }
    if min(n, m) < min_samples:
        side = "canary" if n < min_samples else "baseline"
        return MetricJudgment(
            "latency",
            Classification.NODATA,
            direction,
            f"{min(n, m)} {side} samples, fewer than {min_samples}",
            LatencyEvidence(baseline_count=m, canary_count=n, **gate),  # type: ignore[arg-type]
        )
    level = interval_level(direction, confidence)
    shift = shift_interval(canary, baseline, level)
    mw_greater = sps.mannwhitneyu(canary, baseline, alternative="greater", method="asymptotic")
    mw_less = sps.mannwhitneyu(canary, baseline, alternative="less", method="asymptotic")
    u = float(mw_greater.statistic)
    means = float(np.mean(baseline)), float(np.mean(canary))
    pcts = percentile(baseline, q), percentile(canary, q)
    mean_ratio = _ratio(means[1], means[0])
    size = effect_size(effect.kind, baseline, canary, u=u, q=q)
    bound = tolerance * abs(shift.estimate)
    evidence = LatencyEvidence(
        baseline_count=m,
        canary_count=n,
        baseline_mean=means[0],
        canary_mean=means[1],
        baseline_percentile=pcts[0],
        canary_percentile=pcts[1],
        shift_estimate=shift.estimate,
        interval_low=shift.low,
        interval_high=shift.high,
        interval_level=level,
        tolerance_bound=bound,
        mean_ratio=mean_ratio,
        effect_size=size,
        u_statistic=u,
        p_value_greater=float(mw_greater.pvalue),
        p_value_less=float(mw_less.pvalue),
        **gate,  # type: ignore[arg-type]
    )
    # Kayenta: an effect size that cannot be computed (a zero mean) does not gate
    high = direction.flags_high and shift.low > bound and (size is None or size > effect.upper)
    low = direction.flags_low and shift.high < -bound and (size is None or size < effect.lower)
    if high:
        verdict, why = Classification.HIGH, "the interval lies above the tolerance"
    elif low:
        verdict, why = Classification.LOW, "the interval lies below the tolerance"
    elif np.array_equal(np.sort(canary), np.sort(baseline)):
        verdict, why = Classification.PASS, "the canary and baseline data are identical"
    else:
        verdict, why = Classification.PASS, "no change beyond the interval and the effect gate"
    reason = (
        f"{why}: shift {shift.estimate:.4g} in [{shift.low:.4g}, {shift.high:.4g}] "
        f"({level:.4g} two-sided), tolerance ±{bound:.4g}, "
        f"{effect.kind.value} {_fmt(size)} allowed [{effect.lower:.4g}, {effect.upper:.4g}]"
    )
    return MetricJudgment("latency", verdict, direction, reason, evidence)


def judge_failures(
    baseline: FailureCounts,
    canary: FailureCounts,
    *,
    direction: Direction,
    confidence: float,
) -> MetricJudgment:
    """Fisher's exact test on the two failure counts, at the judge's confidence."""
    evidence = FailureEvidence(
        baseline_failures=baseline.failures,
        baseline_count=baseline.count,
        canary_failures=canary.failures,
        canary_count=canary.count,
    )
    for counts in (baseline, canary):
        if not 0 <= counts.failures <= counts.count:
            raise ValueError("failures must be within [0, count]")
    if baseline.count == 0 or canary.count == 0:
        return MetricJudgment(
            "failures", Classification.NODATA, direction, "no requests on a side", evidence
        )
    table = [
        [canary.failures, canary.count - canary.failures],
        [baseline.failures, baseline.count - baseline.failures],
    ]
    greater = sps.fisher_exact(table, alternative="greater")
    less = sps.fisher_exact(table, alternative="less")
    odds = float(greater.statistic)
    # either direction spends the budget over both tails
    significance = (1 - confidence) / (2 if direction is Direction.EITHER else 1)
    ratios = baseline.failures / baseline.count, canary.failures / canary.count
    evidence = FailureEvidence(
        baseline_failures=baseline.failures,
        baseline_count=baseline.count,
        canary_failures=canary.failures,
        canary_count=canary.count,
        baseline_ratio=ratios[0],
        canary_ratio=ratios[1],
        odds_ratio=odds if math.isfinite(odds) else None,
        p_value_greater=float(greater.pvalue),
        p_value_less=float(less.pvalue),
        significance=significance,
    )
    if direction.flags_high and float(greater.pvalue) < significance:
        verdict, why = Classification.HIGH, "the canary fails more often"
    elif direction.flags_low and float(less.pvalue) < significance:
        verdict, why = Classification.LOW, "the canary fails less often"
    else:
        verdict, why = Classification.PASS, "no significant change"
    reason = (
        f"{why}: {ratios[1]:.4g} vs {ratios[0]:.4g}, Fisher p>={float(greater.pvalue):.3g} "
        f"p<={float(less.pvalue):.3g} at {significance:.3g}"
    )
    return MetricJudgment("failures", verdict, direction, reason, evidence)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _ratio(top: float, bottom: float) -> float | None:
    # Kayenta's meanRatio: NaN (here None) when either mean is zero
    if top == 0.0 or bottom == 0.0:
        return None
    return top / bottom


def percentile(values: FloatArray, q: float) -> float:
    """P_q as the product defines it: the smallest value with at least q% at or below."""
    return float(np.quantile(values, q / 100, method="inverted_cdf"))


def effect_size(
    kind: EffectKind, baseline: FloatArray, canary: FloatArray, *, u: float, q: float
) -> float | None:
    """The effect of `kind`; None when it cannot be computed (a zero denominator).

    `u` is the Mann-Whitney U of the canary (pairs canary > baseline, ties a half),
    so CLES is u / (n m), Kayenta's rank formula.
    """
    if kind is EffectKind.CLES:
        return u / (len(canary) * len(baseline))
    if kind is EffectKind.MEAN_RATIO:
        return _ratio(float(np.mean(canary)), float(np.mean(baseline)))
    return _ratio(percentile(canary, q), percentile(baseline, q))


def shift_interval(
    canary: FloatArray,
    baseline: FloatArray,
    level: float,
    *,
    materialise_pairs: int = MATERIALISE_PAIRS,
) -> ShiftInterval:
    """Kayenta's (and R's) asymptotic Mann-Whitney interval for canary - baseline."""
    x = np.sort(canary)
    y = np.sort(baseline)
    n, m = len(x), len(y)
    pairs = n * m
    total = n + m
    ties = _tie_sum(x) + _tie_sum(y)
    # between pairwise differences no value of canary - mu ties a baseline value, so
    # only each sample's own ties enter the variance (a tie across the samples
    # happens only at the jump points themselves)
    variance = pairs / 12 * ((total + 1) - (ties / (total * (total - 1)) if total > 1 else 0))
    sigma = math.sqrt(max(variance, 0.0))
    z = float(spc.ndtri(1 - (1 - level) / 2))
    ranks = [
        _interval_rank(pairs, sigma, z),
        _interval_rank(pairs, sigma, -z),
        (pairs + 1) // 2,
        pairs // 2 + 1,
    ]
    values = _pairwise_order_statistics(x, y, ranks, materialise_pairs)
    return ShiftInterval(
        low=values[0], high=values[1], estimate=(values[2] + values[3]) / 2, level=level
    )


def _tie_sum(sorted_values: FloatArray) -> float:
    _, counts = np.unique(sorted_values, return_counts=True)
    c = counts.astype(np.float64)
    return float(np.sum(c**3 - c))


def _interval_rank(pairs: int, sigma: float, zq: float) -> int:
    """The rank r (1-based) of the pairwise difference where the equation
    (K - nm/2 - sign(K - nm/2)/2) / sigma = zq changes sign, K = #{d > mu}.

    The left side grows with K; K <= k_ok is where it is <= zq. Between d_(r) and
    d_(r+1), K = nm - r, so the root sits at d_(nm - k_ok), clipped to the sample's
    range as Kayenta clips to [min d, max d].
    """

    def at_or_below(k: int) -> bool:
        t = k - pairs / 2
        corrected = t - 0.5 * float(np.sign(t))
        if sigma == 0.0:
            return corrected <= 0.0 if zq >= 0 else corrected < 0.0
        return corrected / sigma <= zq

    lo, hi = -1, pairs  # at_or_below(-1) holds by convention; find the largest k that holds
    if at_or_below(pairs):
        lo = pairs
    else:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if at_or_below(mid):
                lo = mid
            else:
                hi = mid
    return min(max(pairs - lo, 1), pairs)


def _pairwise_order_statistics(
    x: FloatArray, y: FloatArray, ranks: Sequence[int], materialise_pairs: int
) -> list[float]:
    """The r-th smallest of x_i - y_j for each rank r (x and y sorted ascending)."""
    pairs = len(x) * len(y)
    if pairs <= materialise_pairs:
        d = np.subtract.outer(x, y).ravel()
        d.partition([r - 1 for r in sorted(set(ranks))])
        return [float(d[r - 1]) for r in ranks]
    return [_select_by_bisection(x, y, r) for r in ranks]


def _count_at_most(x: FloatArray, y: FloatArray, v: float) -> int:
    # x_i - y_j <= v  <=>  y_j >= x_i - v
    below = np.searchsorted(y, x - v, side="left")
    return int(len(x) * len(y) - np.sum(below))


def _smallest_above(x: FloatArray, y: FloatArray, v: float) -> float:
    # per row, the largest y_j < x_i - v gives the smallest x_i - y_j > v
    j = np.searchsorted(y, x - v, side="left") - 1
    rows = j >= 0
    return float(np.min(x[rows] - y[j[rows]]))


def _select_by_bisection(x: FloatArray, y: FloatArray, r: int) -> float:
    """The r-th smallest difference without materialising all n*m of them."""
    lo = float(x[0] - y[-1])
    hi = float(x[-1] - y[0])
    if r <= 1:
        return lo
    count_lo = _count_at_most(x, y, lo)
    if count_lo >= r:
        return lo
    count_hi = len(x) * len(y)
    # invariant: count(lo) < r <= count(hi)
    while count_hi - count_lo > BAND_PAIRS and np.nextafter(lo, math.inf) < hi:
        mid = lo + (hi - lo) / 2
        c = _count_at_most(x, y, mid)
        stalled = c == count_lo
        if c >= r:
            hi, count_hi = mid, c
        else:
            lo, count_lo = mid, c
        if stalled:
            # halving moved lo through a gap (tied differences sit together): jump to
            # the smallest difference above it, which may already hold rank r
            nearest = _smallest_above(x, y, lo)
            at_nearest = _count_at_most(x, y, nearest)
            if at_nearest >= r:
                return nearest  # nothing lies between lo and it
            lo, count_lo = nearest, at_nearest
    if count_hi - count_lo > BAND_PAIRS:
        return hi  # the band is one value as far as floats can tell
    # the differences in (lo, hi]: per row, y_j in [x_i - hi, x_i - lo)
    start = np.searchsorted(y, x - hi, side="left")
    stop = np.searchsorted(y, x - lo, side="left")
    widths = stop - start
    rows = np.repeat(np.arange(len(x)), widths)
    offsets = np.arange(int(widths.sum())) - np.repeat(np.cumsum(widths) - widths, widths)
    band = x[rows] - y[start[rows] + offsets]
    k = r - count_lo - 1
    band.partition(k)
    return float(band[k])
