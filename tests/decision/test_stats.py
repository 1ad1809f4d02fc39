from __future__ import annotations

import numpy as np
import pytest

from controlplane.decision.stats import (
    failure_bound_test,
    failure_comparison_test,
    holm,
    latency_shift_test,
    quantile_exceedance_test,
    sample_ratio_mismatch,
)


def test_holm_multiplies_the_smallest_by_the_family_size_and_keeps_order() -> None:
    adjusted = holm({"latency": 0.01, "failures": 0.04})
    assert adjusted == pytest.approx({"latency": 0.02, "failures": 0.04})
    assert holm({"a": 0.03, "b": 0.01}) == pytest.approx({"b": 0.02, "a": 0.03})
    assert holm({"a": 0.9, "b": 0.8}) == pytest.approx({"b": 1.0, "a": 1.0})


def test_quantile_test_is_significant_for_a_clear_exceedance_only() -> None:
    assert quantile_exceedance_test(200, 1000, 0.05).p_value < 1e-30
    assert quantile_exceedance_test(55, 1000, 0.05).p_value > 0.2
    assert quantile_exceedance_test(0, 0, 0.05).p_value == 1.0


def test_failure_bound_test_is_one_sided() -> None:
    assert failure_bound_test(30, 100, 0.1).p_value < 1e-6
    assert failure_bound_test(2, 100, 0.1).p_value > 0.99


def test_fisher_finds_a_worse_canary_and_not_a_better_one() -> None:
    worse = failure_comparison_test(20, 200, 10, 2000)
    better = failure_comparison_test(1, 200, 100, 2000)
    assert worse.p_value < 1e-6
    assert better.p_value > 0.9
    assert failure_comparison_test(5, 100, 0, 1000).statistic > 1e300  # infinite odds, finite


def test_rank_test_sees_a_slower_canary() -> None:
    rng = np.random.default_rng(7)
    base = rng.lognormal(np.log(100), 0.5, 500)
    assert latency_shift_test(base * 1.5, base[::-1]).p_value < 1e-6
    assert latency_shift_test(base / 1.5, base).p_value > 0.99


def test_srm_needs_a_few_expected_samples_per_arm() -> None:
    assert sample_ratio_mismatch(990, 5, 100) is None


def test_srm_flags_a_split_far_from_the_weights() -> None:
    result = sample_ratio_mismatch(6000, 4000, 5000)
    assert result is not None and result.mismatch and result.p_value < 1e-10
    fine = sample_ratio_mismatch(9500, 500, 500)
    assert fine is not None and not fine.mismatch


@pytest.mark.parametrize(("b", "c", "bp"), [(9500, 500, 500), (6000, 4000, 5000), (990, 30, 100)])
def test_srm_p_value_is_scipy_chisquare(b: int, c: int, bp: int) -> None:
    from scipy import stats as sps

    result = sample_ratio_mismatch(b, c, bp)
    assert result is not None
    total = b + c
    ref = sps.chisquare([b, c], f_exp=[total * (1 - bp / 10_000), total * bp / 10_000])
    assert result.statistic == pytest.approx(float(ref.statistic))
    assert result.p_value == pytest.approx(float(ref.pvalue), rel=1e-9, abs=1e-300)


@pytest.mark.parametrize(
    ("k", "n", "p"), [(0, 10, 0.1), (3, 10, 0.1), (66, 1000, 0.05), (10, 10, 0.5)]
)
def test_binomial_tails_are_scipy_binom_sf(k: int, n: int, p: float) -> None:
    from scipy import stats as sps

    assert quantile_exceedance_test(k, n, p).p_value == pytest.approx(
        float(sps.binom.sf(k - 1, n, p)), rel=1e-9
    )
