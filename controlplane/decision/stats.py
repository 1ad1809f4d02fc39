"""The significance tests behind the breaker (architecture §8), as small typed results.

Every result holds plain floats so it can go into an event's evidence as is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import special as spc
from scipy import stats as sps

from controlplane.kernel.units import UnitSummary

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


# ---------------------------------------------------------------- cluster-robust tests
#
# docs/decisions/0012-cluster-robust-judgment.md. Requests of one unit (user) share its
# arm and its effects, so they are not independent samples. The window keeps, per
# block of units (controlplane/kernel/units.py), the sums a ratio or a mean needs;
# each unit lies in one block, so blocks are clusters and the cluster-robust
# (sandwich) variance over them is valid whatever the correlation inside a unit.
# Samples without a unit are clusters of one.


# a block holding more than this share of a window dominates it (see _cluster_estimate)
DOMINANT_BLOCK_SHARE = 0.5


@dataclass(frozen=True)
class ClusterEstimate:
    """A ratio estimate (Σ y / Σ n) with its cluster-robust variance and degrees of freedom."""

    estimate: float
    variance: float
    df: float
    clusters: int
    count: int
    # for comparing two arms (`clustered_comparison_test`): the leave-one-block-out
    # (CR3) variance and the degrees of freedom of the blocks' effective number
    # (Kish, 1 / Σ h_b²), both from the design's leverages (decision 0050)
    compare_variance: float = math.nan
    compare_df: float = math.nan


def _cluster_estimate(
    n: npt.NDArray[np.float64],
    y: npt.NDArray[np.float64],
    single_n: int,
    single_y: float,
    single_yy: float,
    sum_yy: float,
) -> ClusterEstimate:
    """Σy/Σn with the sandwich (CR1) cluster-robust variance, floored where one block
    dominates.

    V = G/(G-1) · Σ_b r_b² / N², r_b = y_b - est·n_b, the t with G - 1 degrees of
    freedom. Alone, CR1 is biased low exactly where one block holds most of a window:
    that block pulls the estimate to itself, so its residual is near zero however far
    it is from the rest - with one sticky heavy user making 97% of a 1% canary, CR1
    found that user "significantly" slower than the baseline. So when one block holds
    more than half of the window the rest cannot say how far a unit's mean may lie from
    the others', and the variance is at least h² s², s² the per-sample variance: the
    dominant block's mean anywhere in the requests' spread.

    Below that share no leverage correction: the jackknife (CR3, each r_b divided by
    1 - h_b) was measured and divides a heavy block's residual twice over - a heavy
    user making a fifth of the canary's window, with its own latency, capped the t of
    a doubled latency near 3.8, below what a look's share of alpha asks, and 11 of 100
    clustered x2-latency runs went uncut (decision 0012).
    A window with a single cluster has no variance estimate: infinite.

    Samples without a unit are clusters of one; their Σ r² comes from their sums:
    Σ (y_i - e)² = Σy² - 2eΣy + e²n.
    """
    used = n > 0
    n, y = n[used], y[used]
    total = float(n.sum()) + single_n
    if total <= 0:
        return ClusterEstimate(0.0, 0.0, 1.0, 0, 0)
    est = (float(y.sum()) + single_y) / total
    clusters = int(n.shape[0]) + single_n
    if clusters < 2:
        return ClusterEstimate(est, math.inf, 1.0, clusters, int(total))
    leverage = n / total
    r2 = (y - est * n) ** 2
    single_r2 = max(single_yy - 2 * est * single_y + est * est * single_n, 0.0)
    scale = clusters / (clusters - 1)
    variance = scale * (float(r2.sum()) + single_r2) / (total * total)
    heaviest = float(leverage.max()) if leverage.shape[0] else 0.0
    compare_variance, compare_df = _compare_variance(
        r2, leverage, single_r2, single_n, clusters, total
    )
    if heaviest > DOMINANT_BLOCK_SHARE:
        spread = max(sum_yy / total - est * est, 0.0)
        variance = max(variance, heaviest * heaviest * spread)
        compare_variance = max(compare_variance, heaviest * heaviest * spread)
    return ClusterEstimate(
        est, variance, clusters - 1.0, clusters, int(total), compare_variance, compare_df
    )


def _compare_variance(
    r2: npt.NDArray[np.float64],
    leverage: npt.NDArray[np.float64],
    single_r2: float,
    single_n: int,
    clusters: int,
    total: float,
) -> tuple[float, float]:
    """The variance and degrees of freedom an arm brings to a two-arm comparison.

    Each arm holds different units, so under "no difference" the arms still differ by
    which units landed where, and the heaviest ones decide by how much. CR1 divides
    that spread down exactly where it matters: a block holding a share h of its arm
    pulls the arm's estimate towards itself, its residual shrinks by (1 - h), its
    square by (1 - h)²; with a heavy user making 40% of an arm, CR1 sees a third of
    that user's share of the variance. The jackknife (CR3) restores it: each residual
    divided by 1 - h_b, the leave-one-block-out change. And a t over G - 1 degrees of
    freedom treats the 64 blocks as 64 equal witnesses when one or two of them carry
    the variance: the degrees of freedom are the arm's effective number of blocks
    (Kish, 1 / Σ h_b², samples without a unit each a block of one) less one, which
    depends on the leverages only, not on the residuals - a regression carried by
    every unit does not lower them (Satterthwaite's over the residuals does; decision
    0012). Measured on the heavy-user A/A windows of decision 0050 (3,000 users,
    Zipf 1.2, per-user sigma 0.45, 800 windows at 50%): CR1 over G - 1 rejected at
    p < 0.01 in 5.1% of 10-s windows and at p < 2e-5 in 0.25%; this rejects in
    1.3% and none.
    """
    if clusters < 2:
        return math.inf, 1.0
    kept = np.minimum(leverage, 1.0 - 1e-9)
    single_h = 1.0 / total
    jack = float(np.sum(r2 / (1.0 - kept) ** 2))
    if single_n:
        # samples without a unit: leverage 1/N each, their Σ r² from their sums
        jack += single_r2 / (1.0 - single_h) ** 2
    variance = (clusters - 1) / clusters * jack / (total * total)
    effective = 1.0 / (float(np.sum(leverage * leverage)) + single_n * single_h * single_h)
    return variance, max(effective - 1.0, 1.0)


def cluster_ratio(summary: UnitSummary, column: int) -> ClusterEstimate:
    """Failures (column 1) or above-threshold (2) per sample, clustered by unit block."""
    blocks = summary.blocks
    single_n, single_y = int(summary.no_unit[0]), float(summary.no_unit[column])
    # binary outcomes: y² = y
    sum_yy = float(blocks[:, column].sum()) + single_y
    return _cluster_estimate(blocks[:, 0], blocks[:, column], single_n, single_y, single_y, sum_yy)


def cluster_log_mean(summary: UnitSummary) -> ClusterEstimate:
    """Mean ln(RT in ms) per sample, clustered by unit block."""
    blocks, row = summary.blocks, summary.no_unit
    sum_yy = float(blocks[:, 4].sum()) + float(row[4])
    return _cluster_estimate(
        blocks[:, 0], blocks[:, 3], int(row[0]), float(row[3]), float(row[4]), sum_yy
    )


def _t_sf(t: float, df: float) -> float:
    return float(spc.stdtr(df, -t))


def clustered_bound_test(name: str, est: ClusterEstimate, bound: float) -> TestResult:
    """H0: the per-sample rate is at most `bound`, with units as clusters (one-sided t).

    The variance is never taken below the binomial variance at the bound: units can
    only add variance to independent requests (their effects are shared, not
    opposed), so an estimate below it is the estimator's noise with few clusters.
    """
    if est.count == 0:
        return TestResult(name, "cluster_robust_t_vs_bound", 0.0, 1.0)
    if est.variance == math.inf:  # a single cluster: nothing to judge it against
        return TestResult(name, "cluster_robust_t_vs_bound", 0.0, 1.0)
    floor = bound * (1 - bound) / est.count
    se = math.sqrt(max(est.variance, floor))
    t = (est.estimate - bound) / se
    return TestResult(name, "cluster_robust_t_vs_bound", t, _t_sf(t, est.df))


def clustered_comparison_test(
    name: str, canary: ClusterEstimate, baseline: ClusterEstimate, *, binary: bool
) -> TestResult:
    """H0: the canary's rate (or mean log latency) is no higher than the baseline's.

    Welch's two-sample t with each arm's leverage-corrected cluster-robust variance
    and effective degrees of freedom (`_compare_variance`), combined by
    Welch-Satterthwaite. For rates, each arm's variance is at least the binomial one
    at the pooled rate (as in `clustered_bound_test`), and only what the blocks add
    over it is held to the effective blocks' degrees of freedom (`_over_binomial`).
    """
    vc, vb = canary.compare_variance, baseline.compare_variance
    if math.isnan(vc) or math.isnan(vb):  # estimates built by hand: the sandwich
        vc, vb = canary.variance, baseline.variance
    df_c = canary.df if math.isnan(canary.compare_df) else canary.compare_df
    df_b = baseline.df if math.isnan(baseline.compare_df) else baseline.compare_df
    if binary and canary.count and baseline.count:
        pooled = (canary.estimate * canary.count + baseline.estimate * baseline.count) / (
            canary.count + baseline.count
        )
        # the pooled rate's events: what the binomial variance is estimated from
        events = 2.0 * pooled * (canary.count + baseline.count)
        vc, df_c = _over_binomial(vc, df_c, pooled * (1 - pooled) / canary.count, events)
        vb, df_b = _over_binomial(vb, df_b, pooled * (1 - pooled) / baseline.count, events)
    total = vc + vb
    method = "cluster_robust_welch_t"
    if not 0 < total < math.inf:  # no variance, or an arm with a single cluster
        return TestResult(name, method, 0.0, 1.0)
    t = (canary.estimate - baseline.estimate) / math.sqrt(total)
    spread = vc * vc / df_c + vb * vb / df_b
    df = total * total / spread if spread > 0 else math.inf
    return TestResult(name, method, t, _t_sf(t, max(df, 1.0)))


def _over_binomial(
    variance: float, df: float, binomial: float, binomial_df: float
) -> tuple[float, float]:
    """A binary arm's variance, at least the binomial one, and its degrees of freedom.

    The binomial part comes from the pooled rate of every sample of both arms, not
    from the arm's blocks: its relative variance is about one over the pooled
    events, so it carries twice their number as degrees of freedom
    (`binomial_df`). Only what the blocks add over it (a broken heavy user, failures
    a unit shares) is estimated on the arm's effective blocks (`df`, decision 0050);
    Welch-Satterthwaite over the two parts gives the arm's degrees of freedom. The
    effective blocks alone held a failure rate every canary user shares to the t of
    13 degrees of freedom whenever one heavy user made a fifth of the baseline,
    though its blocks carried no more than the binomial spread (decision 0056).
    """
    if not binomial > 0 or variance == math.inf:
        return max(variance, binomial), df
    binomial_df = max(binomial_df, 1.0)
    excess = variance - binomial
    if excess <= 0:
        return binomial, binomial_df
    return variance, variance * variance / (
        binomial * binomial / binomial_df + excess * excess / df
    )


@dataclass(frozen=True)
class UnitSrm:
    """The split judged on distinct units, over the hashes both arms' sketches cover."""

    canary_units: int
    baseline_units: int
    covered_fraction: float  # of the 32-bit hash space the counts are exact over
    result: SrmResult | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "canary_units": self.canary_units,
            "baseline_units": self.baseline_units,
            "hash_space_covered": self.covered_fraction,
            "test": self.result.to_dict() if self.result is not None else None,
        }


def unit_split(
    baseline: Sequence[int], canary: Sequence[int], canary_bp: int, *, full: int
) -> UnitSrm:
    """Distinct units per arm from two bottom-k sketches (sorted hashes), judged against
    the weights.

    A sketch with `full` hashes holds every hash up to its largest; so both arms'
    units are known exactly below the smaller of their largest hashes (`cover`).
    Units with a hash below it are a random subset of all units (the hash is
    independent of the bucket that assigns the arm), each in the canary with
    probability canary_bp / 10,000 - a binomial count, judged by the same
    always-valid test as the request counts.
    """
    cover = 2**32
    for sketch in (baseline, canary):
        if len(sketch) >= full:
            cover = min(cover, int(sketch[-1]) + 1)
    n_b = int(np.searchsorted(np.asarray(baseline, dtype=np.int64), cover))
    n_c = int(np.searchsorted(np.asarray(canary, dtype=np.int64), cover))
    return UnitSrm(n_c, n_b, cover / 2**32, sample_ratio_mismatch(n_b, n_c, canary_bp))
