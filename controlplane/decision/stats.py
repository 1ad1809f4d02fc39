"""The significance tests behind the breaker (architecture §8), as small typed results.

Every result holds plain floats so it can go into an event's evidence as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special as spc
from scipy import stats as sps

# a sample ratio mismatch is reported below this p-value (architecture §8)
SRM_P_VALUE = 0.001
# chi-square is only trusted with a few expected samples in each arm
SRM_MIN_EXPECTED = 10.0
# the always-valid SRM test's Beta prior around the configured split: as much weight
# as this many samples (a mismatch of a tenth of the split at 50/50 is within one
# prior standard deviation)
SRM_PRIOR_SAMPLES = 100.0


@dataclass(frozen=True)
class TestResult:
    """One test: what it tested, its statistic and its one-sided p-value."""

    name: str
    method: str
    statistic: float
    p_value: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "method": self.method,
            "statistic": self.statistic,
            "p_value": self.p_value,
        }


def quantile_exceedance_test(above: int, count: int, tail: float) -> TestResult:
    """H0: at most `tail` of the population lies above the threshold (P_q <= T).

    The exact binomial (sign) test on the above-threshold count: with the P_q
    definition (architecture §8), "P_q > T" is "more than (1 - q) of samples above T",
    so this is an exact test of the percentile against the threshold.
    """
    return TestResult(
        "latency",
        "binomial_quantile",
        above / count if count else 0.0,
        _binom_sf(above, count, tail),
    )


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), the same as scipy.stats.binom.sf(k - 1, n, p).

    scipy.special directly: the distribution object costs far more per call, and
    this runs on looks that exceed a bound.
    """
    if k <= 0 or n == 0:
        return 1.0
    if k > n:
        return 0.0
    return float(spc.bdtrc(k - 1, n, p))


def failure_bound_test(failures: int, count: int, bound: float) -> TestResult:
    """H0: the failure probability is at most `bound` (exact one-sided binomial)."""
    return TestResult(
        "failures",
        "binomial_bound",
        failures / count if count else 0.0,
        _binom_sf(failures, count, bound),
    )


def failure_comparison_test(
    canary_failures: int, canary_count: int, baseline_failures: int, baseline_count: int
) -> TestResult:
    """H0: the canary fails no more often than the baseline (one-sided Fisher exact)."""
    table = [
        [canary_failures, canary_count - canary_failures],
        [baseline_failures, baseline_count - baseline_failures],
    ]
    result = sps.fisher_exact(table, alternative="greater")
    odds = float(result.statistic)
    # an infinite odds ratio (no baseline failures) is not JSON; report the largest float
    return TestResult(
        "failures",
        "fisher_exact_greater",
        odds if np.isfinite(odds) else float(np.finfo(float).max),
        float(result.pvalue),
    )


def latency_shift_test(canary_ms: Sequence[float], baseline_ms: Sequence[float]) -> TestResult:
    """H0: canary latencies are not stochastically greater (Mann-Whitney U, one-sided)."""
    result = sps.mannwhitneyu(canary_ms, baseline_ms, alternative="greater")
    return TestResult(
        "latency", "mann_whitney_u_greater", float(result.statistic), float(result.pvalue)
    )


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values: compare each with alpha to keep the family-wise error."""
    ordered = sorted(p_values.items(), key=lambda item: item[1])
    m = len(ordered)
    adjusted: dict[str, float] = {}
    running = 0.0
    for i, (name, p) in enumerate(ordered):
        # step-down: the adjusted values never decrease along the ordering
        running = max(running, min(1.0, (m - i) * p))
        adjusted[name] = running
    return adjusted


@dataclass(frozen=True)
class SrmResult:
    """Sample ratio mismatch: observed counts against the configured split."""

    baseline_count: int
    canary_count: int
    expected_canary_fraction: float
    statistic: float
    p_value: float
    mismatch: bool
    always_valid_p: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": "beta_binomial_mixture_sprt",
            "always_valid_p": self.always_valid_p,
            "baseline_count": self.baseline_count,
            "canary_count": self.canary_count,
            "expected_canary_fraction": self.expected_canary_fraction,
            "observed_canary_fraction": self.canary_count
            / max(self.baseline_count + self.canary_count, 1),
            "statistic": self.statistic,
            "p_value": self.p_value,
            "mismatch": self.mismatch,
        }


def sample_ratio_mismatch(
    baseline_count: int, canary_count: int, canary_bp: int, total_bp: int = 10_000
) -> SrmResult | None:
    """The observed split against the weights; None if too few to judge.

    `statistic` and `p_value` are scipy.stats.chisquare's with one degree of freedom
    (computed directly: the generic wrapper costs milliseconds, this microseconds).
    They hold for one look at a fixed sample; the controller looks again and again
    at growing counts, so the verdict (`mismatch`) comes from an always-valid test:
    a mixture sequential probability ratio test (a Beta prior centred on the
    configured split against the split itself), whose p-value 1/BF is valid at any
    number of looks (Ville's inequality) - p < 0.001 means a false warning in at most
    one step in a thousand, however often the step is looked at.
    """
    total = baseline_count + canary_count
    fraction = canary_bp / total_bp
    expected = (total * (1 - fraction), total * fraction)
    if min(expected) < SRM_MIN_EXPECTED:
        return None
    statistic = (baseline_count - expected[0]) ** 2 / expected[0] + (
        canary_count - expected[1]
    ) ** 2 / expected[1]
    p = float(spc.chdtrc(1, statistic))
    always_valid = always_valid_split_p(baseline_count, canary_count, fraction)
    return SrmResult(
        baseline_count=baseline_count,
        canary_count=canary_count,
        expected_canary_fraction=fraction,
        statistic=float(statistic),
        p_value=p,
        mismatch=always_valid < SRM_P_VALUE,
        always_valid_p=always_valid,
    )


def always_valid_split_p(baseline_count: int, canary_count: int, fraction: float) -> float:
    """1 / Bayes factor of "the canary share follows a Beta prior around `fraction`"
    against "it is `fraction`", capped at 1.

    Under H0 the Bayes factor is a nonnegative martingale in the samples, so the
    chance it ever exceeds 1/alpha is at most alpha, whatever the looks.
    """
    a = SRM_PRIOR_SAMPLES * fraction
    b = SRM_PRIOR_SAMPLES * (1 - fraction)
    log_bf = (
        float(spc.betaln(a + canary_count, b + baseline_count))
        - float(spc.betaln(a, b))
        - float(spc.xlogy(canary_count, fraction))
        - float(spc.xlogy(baseline_count, 1 - fraction))
    )
    return float(min(1.0, np.exp(-log_bf)))
