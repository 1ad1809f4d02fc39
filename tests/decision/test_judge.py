"""The one-shot judge: Kayenta's Mann-Whitney classifier, checked by hand and against
published values (R's wilcox.test as Kayenta's own tests quote it, scipy's tests)."""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict

import numpy as np
import pytest
from scipy import stats as sps

from controlplane.decision.judge import (
    Classification,
    FailureCounts,
    judge,
    shift_interval,
)
from controlplane.kernel.judgment import Direction, EffectGate, EffectKind

# Kayenta's ClassifierSuite data (kayenta-judge), thirty values each
NORMAL_10 = (
    9.7767343120109462, 10.587071850477695, 7.8375506388901766, 9.3243326886113884,
    8.3774505409784421, 8.9359264399606282, 8.2707663324728511, 9.7484308126716925,
    11.623746715547156, 9.2753442679633942, 8.1538047749171518, 10.562020975754294,
    13.498135575451835, 11.054419256110332, 6.9538903590055092, 12.521008342195479,
    9.0216358603546443, 4.9234856699531662, 11.251360203607172, 11.598449508040337,
    8.435232204668182, 11.110228516867279, 10.70063380164755, 8.9212773652115249,
    10.086167067942661, 11.42107515483087, 9.3792347813644952, 7.7980320148552593,
    10.62339807275746, 11.909642062063739,
)  # fmt: skip
CONTROL_10 = (
    11.1453586774086, 9.9618059885597017, 7.068574306369829, 7.3012661810483657,
    9.7944630265656727, 9.6037918603687302, 6.1867793350339388, 12.345599159550174,
    10.371891733859533, 8.6094300785016724, 9.913162673361084, 10.361375299003466,
    14.206800387518818, 10.946153754753301, 10.215876627044048, 11.739760899484603,
    10.907627468626439, 12.823353694464775, 8.1018609771732137, 8.4981616408804932,
    12.113441374697231, 13.272210809932028, 10.114579381663297, 6.9463958767978067,
    6.2105278541727778, 10.160401684903775, 8.3457712066455461, 8.383822063895833,
    7.0020205070083765, 10.755757401808442,
)  # fmt: skip
HIGH_20 = (
    20.878412601720026, 21.78550581191622, 19.70828084717019, 15.859946903461562,
    19.510058772176841, 19.392005525270303, 22.926528314912101, 17.156530276709894,
    18.655117916226171, 23.422607911610392, 24.055817684156644, 22.62689958516501,
    21.979472967817678, 21.659318607218694, 20.067707574072426, 22.119570836305414,
    16.44037132663307, 21.559622826341268, 21.000181443489218, 17.779369411412663,
    17.806006358943584, 18.537200618386109, 20.555550300210797, 19.552928184468378,
    21.771118944087092, 21.809622806176627, 20.961762909905271, 20.977571577503021,
    19.106303205498794, 16.976918966987078,
)  # fmt: skip
CONTROL_20 = (
    20.758113589510348, 22.802059629464559, 20.612340363492208, 20.973274654749986,
    23.469237330498622, 21.53133988954805, 21.767353687439805, 18.308050730374301,
    19.062145167827566, 25.879498436001779, 18.982629726336128, 19.387920182269266,
    18.995398251246982, 24.228420230932805, 20.050985172694688, 18.2340451091756,
    17.870515494460435, 23.058103863806618, 18.400259567501134, 16.971352091177167,
    19.467529066052151, 17.90465423342031, 17.553948617825831, 16.104611843907193,
    24.38171081433039, 15.919294339922635, 20.479409626304697, 19.08307201492406,
    17.455788050722866, 18.853826823235142,
)  # fmt: skip

# Kayenta's MannWhitneySuite "Tie out with R Version": heavy ties, R's interval
R_TIES_CONTROL = (
    1.5, 6.0, 5.0, 2.5, 2.5, 2.0, 2.0, 3.5, 3.0, 3.0, 3.0, 2.0, 3.0, 8.0, 4.0, 2.5,
    3.0, 2.5, 2.5, 2.0, 2.5, 2.0, 2.0, 2.5, 3.5, 3.0, 1.5, 5.0, 2.5, 5.5, 2.0, 2.5,
    3.5, 2.0, 2.5, 4.0, 2.0, 2.0, 2.0, 2.0, 5.5, 4.5, 4.0, 3.0, 3.0, 3.5, 2.5, 3.0,
    2.5, 4.0, 6.0, 2.0, 5.0, 6.0, 3.5, 3.0, 54.5, 3.0, 5.0, 6.0, 3.5, 4.5, 2.5, 2.0,
    6.0, 5.0, 2.5, 3.5, 2.0, 3.0, 2.5, 3.5, 3.5, 2.5, 3.0, 4.5, 3.0, 15.5, 5.0, 2.5,
    3.0, 4.0, 3.5, 4.0, 4.0, 2.0, 4.5, 2.5, 4.0, 3.0,
)  # fmt: skip
R_TIES_CANARY = (
    2.5, 2.5, 2.0, 2.5, 3.5, 2.0, 3.5, 1.5, 3.0, 3.0, 2.5, 3.5, 2.0, 2.5, 2.0, 2.0,
    5.0, 3.0, 2.0, 1.5, 2.0, 4.0, 3.0, 2.5, 3.0, 2.0, 2.0, 2.0, 2.5, 3.5, 1.5, 1.5,
    3.5, 2.0, 2.5, 2.5, 3.0, 3.5, 2.5, 6.5, 2.5, 4.0, 2.5, 3.0, 2.5, 6.5, 2.5, 3.0,
    1.5, 2.0, 2.5, 3.0, 7.5, 1.5, 2.0, 4.0, 2.5, 2.0, 2.5, 3.5, 4.0, 2.5, 3.0, 2.5,
    2.0, 3.5, 3.0, 16.5, 3.0, 3.0, 7.0, 4.5, 5.0, 2.0, 3.5, 6.0, 1.5, 3.0, 2.5, 4.0,
    3.0, 1.5, 5.0, 3.0, 2.5, 5.5, 3.0, 1.5, 2.5, 6.0,
)  # fmt: skip
R_LARGE_CANARY = (
    1.5, 2.0, 5.0, 1.5, 1.5, 8.5, 1.0, 1.0, 2.0, 1.0, 1.5, 0.5, 2.0, 1.5, 2.0, 1.5,
    1.0, 2.5, 1.5, 1.5, 2.0, 1.5, 1.5, 1.5, 2.0, 2.0, 1.0, 5.5, 1.5, 2.0, 1.5, 1.5,
    1.0, 2.5, 1.0, 2.0, 1.5, 1.5, 2.0, 2.0, 1.5, 1.5, 1.0, 1.0, 2.0, 0.5, 1.5, 0.5,
    3.5, 1.5, 3.0, 19.0, 0.5, 1.5, 0.5, 1.5, 2.0, 1.5, 1.5, 1.5, 1.5, 2.0, 1.5, 2.0,
    2.0, 1.5, 1.0, 1.5, 1.0, 2.0, 1.0, 2.0, 1.5, 1.5, 3.0, 2.0, 1.5, 1.5, 0.5, 2.0,
    1.5, 1.0, 2.0, 1.0, 1.0, 2.0, 1.0, 2.0, 1.5, 1.0, 1.0, 2.0, 1.5, 1.5, 1.5, 0.5,
    1.5, 1.5, 0.5, 1.0, 1.5, 1.5, 1.5, 1.0, 2.0, 2.0, 2.0, 1.5, 1.0, 1.5, 1.0, 1.0,
    1.5, 3.5, 2.0, 1.5, 1.0, 2.0, 1.5, 5.5, 0.5, 2.0, 3.5, 1.5, 1.0, 2.0, 0.5, 2.5,
    1.0, 1.5, 0.5, 2.0, 2.0, 1.0, 0.5, 1.5, 1.0, 1.5, 0.5, 0.5, 1.0, 1.5, 1.0, 1.5,
    0.5, 1.5, 1.0, 1.0, 0.5, 1.0, 0.5, 4.0, 1.0, 1.5, 2.0, 5.5, 1.5, 0.5, 2.0, 1.0,
    1.5, 1.0, 1.5, 1.5, 1.0, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 2.0, 0.5, 1.5, 1.0, 2.0,
    1.0, 1.0, 0.5, 1.0,
)  # fmt: skip
R_LARGE_BASELINE = (
    1.5, 1.5, 1.0, 2.0, 1.5, 1.5, 1.5, 2.0, 1.0, 1.0, 2.0, 1.5, 1.5, 1.0, 1.5, 1.5,
    1.5, 1.5, 1.5, 2.0, 1.0, 1.5, 3.0, 2.0, 1.0, 1.5, 1.5, 1.5, 2.0, 1.5, 1.0, 1.0,
    1.5, 2.5, 2.0, 0.0, 1.0, 2.0, 2.0, 1.5, 3.0, 2.0, 1.0, 2.5, 0.5, 1.5, 0.5, 2.5,
    2.0, 1.5, 1.5, 2.0, 1.0, 4.5, 2.5, 0.5, 2.5, 1.5, 1.5, 1.0, 2.0, 1.0, 2.5, 1.5,
    2.0, 1.5, 3.0, 1.5, 1.5, 1.5, 1.5, 2.0, 1.0, 2.5, 1.0, 1.5, 2.5, 1.5, 2.5, 2.0,
    1.5, 1.5, 1.5, 2.5, 1.0, 7.5, 1.5, 3.0, 5.5, 1.0, 1.5, 2.0, 1.0, 1.5, 2.5, 2.5,
    1.0, 1.0, 2.5, 1.5, 1.5, 3.0, 4.0, 1.0, 1.5, 2.0, 1.5, 1.5, 1.5, 2.5, 1.5, 3.5,
    2.5, 1.5, 2.0, 1.0, 4.0, 1.5, 1.0, 1.5, 2.5, 2.5, 2.0, 2.5, 1.5, 1.5, 2.0, 1.0,
    1.5, 2.0, 1.5, 1.0, 2.5, 1.5, 1.5, 2.0, 2.0, 1.0, 1.5, 2.5, 0.5, 2.0, 2.5, 2.0,
    1.0, 2.0, 0.5, 1.5, 1.0, 2.5, 1.0, 1.5, 1.0, 7.0, 1.0, 3.5, 1.5, 2.0, 1.5, 1.5,
    2.0, 3.0, 1.5, 1.5, 2.0, 1.5, 2.0, 1.5, 4.0, 2.0, 1.5, 1.5, 1.5, 1.5, 1.5, 0.5,
    2.0, 1.0, 1.5, 0.5,
)  # fmt: skip


def brute_force_hodges_lehmann(canary: list[float], baseline: list[float]) -> float:
    return float(np.median([c - b for c, b in itertools.product(canary, baseline)]))


# ---------------------------------------------------------------- the interval


@pytest.mark.parametrize(
    ("canary", "baseline", "level", "low", "high", "estimate"),
    [
        # Kayenta's MannWhitneySuite, "Confidence Interval & Estimate"
        ((10.0, 20.0, 30.0, 40.0), (1.0, 2.0, 3.0, 4.0), 0.95, 6.0, 39.0, 22.5),
        # ... "Tie out with R Version": R 4 gives (-0.500002521696696, -3.486e-05), -0.49994
        (R_TIES_CANARY, R_TIES_CONTROL, 0.95, -0.500002521696696, -3.486287505871302e-05, -0.5),
        # ... "(Large)" at 0.98: (-0.4999173250549087, -6.912685789769486e-06), -3.45e-05
        (R_LARGE_CANARY, R_LARGE_BASELINE, 0.98, -0.4999173250549087, -6.9e-06, 0.0),
    ],
)
def test_interval_matches_r_and_kayenta(
    canary: tuple[float, ...],
    baseline: tuple[float, ...],
    level: float,
    low: float,
    high: float,
    estimate: float,
) -> None:
    # R's root finder stops within its tolerance of the jump; ours is the jump itself
    got = shift_interval(np.array(canary), np.array(baseline), level)
    assert got.low == pytest.approx(low, abs=1e-4)
    assert got.high == pytest.approx(high, abs=1e-4)
    assert got.estimate == pytest.approx(estimate, abs=1e-4)


@pytest.mark.parametrize("seed", range(6))
def test_estimate_is_the_brute_force_hodges_lehmann(seed: int) -> None:
    rng = np.random.default_rng(seed)
    canary = list(np.round(rng.lognormal(3, 0.6, int(rng.integers(1, 25))), 1))
    baseline = list(np.round(rng.lognormal(3, 0.6, int(rng.integers(1, 25))), 1))
    got = shift_interval(np.array(canary), np.array(baseline), 0.95)
    assert got.estimate == pytest.approx(brute_force_hodges_lehmann(canary, baseline))
    assert got.low <= got.estimate <= got.high


@pytest.mark.parametrize(("seed", "rounded"), [(1, False), (2, True), (3, True)])
def test_selection_without_materialising_matches_the_full_sort(seed: int, rounded: bool) -> None:
    rng = np.random.default_rng(seed)
    canary = rng.lognormal(3, 0.5, 700) * 1.04
    baseline = rng.lognormal(3, 0.5, 900)
    if rounded:  # many tied differences
        canary, baseline = np.round(canary), np.round(baseline)
    full = shift_interval(canary, baseline, 0.98)
    bisected = shift_interval(canary, baseline, 0.98, materialise_pairs=0)
    assert bisected == full


@pytest.mark.parametrize("seed", range(8))
def test_interval_end_agrees_with_scipy_mann_whitney_p(seed: int) -> None:
    """The interval's lower end clears 0 exactly when scipy's one-sided asymptotic
    Mann-Whitney p (continuity-corrected) is below the tail: one equation, two views."""
    rng = np.random.default_rng(100 + seed)
    baseline = rng.lognormal(3, 0.5, 60)
    canary = rng.lognormal(3, 0.5, 50) * (1 + 0.06 * seed)
    level = 0.98
    got = shift_interval(canary, baseline, level)
    p_greater = sps.mannwhitneyu(canary, baseline, alternative="greater", method="asymptotic")
    p_less = sps.mannwhitneyu(canary, baseline, alternative="less", method="asymptotic")
    assert (got.low > 0) == (p_greater.pvalue < (1 - level) / 2)
    assert (got.high < 0) == (p_less.pvalue < (1 - level) / 2)


def test_constant_samples_give_the_exact_shift() -> None:
    """Kayenta adds Gaussian noise when each side is one value; the exact answer is
    the difference itself, so no noise is needed."""
    got = shift_interval(np.full(20, 105.0), np.full(30, 100.0), 0.98)
    assert (got.low, got.estimate, got.high) == (5.0, 5.0, 5.0)
    verdict = judge([100.0] * 30, [105.0] * 20)
    assert verdict.classification is Classification.HIGH


# ---------------------------------------------------------------- classification


def test_kayenta_classifier_suite_either_at_95() -> None:
    """ClassifierSuite: tolerance 0.10, confLevel 0.95, direction Either."""
    common = {"direction": Direction.EITHER, "confidence": 0.95, "tolerance": 0.10}
    assert judge(CONTROL_10, NORMAL_10, **common).classification is Classification.PASS
    assert judge(CONTROL_10, HIGH_20, **common).classification is Classification.HIGH
    assert judge(CONTROL_20, NORMAL_10, **common).classification is Classification.LOW


@pytest.mark.parametrize(
    ("baseline", "canary", "direction", "expected"),
    [
        (CONTROL_20, NORMAL_10, Direction.INCREASE, Classification.PASS),
        (CONTROL_10, HIGH_20, Direction.DECREASE, Classification.PASS),
        (CONTROL_10, HIGH_20, Direction.INCREASE, Classification.HIGH),
        (CONTROL_20, NORMAL_10, Direction.DECREASE, Classification.LOW),
    ],
)
def test_kayenta_directional_cases(
    baseline: tuple[float, ...],
    canary: tuple[float, ...],
    direction: Direction,
    expected: Classification,
) -> None:
    # Kayenta reads one end of a two-sided 0.95 interval: our confidence 0.975
    got = judge(baseline, canary, direction=direction, confidence=0.975, tolerance=0.10)
    assert got.classification is expected
    assert got.latency.evidence.interval_level == pytest.approx(0.95)  # type: ignore[union-attr]


def test_mean_ratio_effect_gate_from_kayenta() -> None:
    """ClassifierSuite "Mean Ratio Effect Size: High": allowed (0.8, 1.2)."""
    gate = EffectGate(kind=EffectKind.MEAN_RATIO, max=1.2, min=0.8)
    got = judge(
        (1.0, 2.2, 1.1, 2.5, 3.0),
        (20.0, 22.0, 21.0, 25.0, 30.0),
        direction=Direction.EITHER,
        effect=gate,
        confidence=0.95,
        tolerance=0.10,
    )
    assert got.classification is Classification.HIGH
    assert got.latency.evidence.effect_size == pytest.approx(118 / 9.8)  # type: ignore[union-attr]


def test_effect_gate_holds_back_a_significant_but_small_shift() -> None:
    rng = np.random.default_rng(7)
    baseline = rng.lognormal(4, 0.3, 4000)
    canary = rng.lognormal(4, 0.3, 4000) * 1.05
    without = judge(baseline, canary)
    assert without.classification is Classification.HIGH  # 5% slower, clearly significant
    for gate in (
        EffectGate(kind=EffectKind.MEAN_RATIO, max=1.2),
        EffectGate(kind=EffectKind.PERCENTILE_RATIO, max=1.2, percentile=99),
        EffectGate(kind=EffectKind.CLES, max=0.6),
    ):
        held = judge(baseline, canary, effect=gate)
        assert held.classification is Classification.PASS, gate
        assert held.latency.evidence.interval_low > 0  # type: ignore[union-attr]
    tripped = judge(baseline, canary * 1.3, effect=EffectGate(kind=EffectKind.CLES, max=0.6))
    assert tripped.classification is Classification.HIGH


@pytest.mark.parametrize(
    ("canary", "baseline", "cles"),
    [
        ((1.0, 2.0, 3.0, 4.0, 5.0), (1.0, 2.0, 3.0, 4.0, 5.0), 0.5),  # StatisticSuite: identical
        ((2.3, 2.6, 3.3, 2.9, 1.4), (25.3, 25.2, 24.6, 24.4, 26.4), 0.0),  # no overlap
        ((3.0, 1.0), (2.0, 2.0, 3.0), 2.5 / 6),  # by hand: 3>2, 3>2, 3=3 (half); 1 > none
    ],
)
def test_cles_effect_size(
    canary: tuple[float, ...], baseline: tuple[float, ...], cles: float
) -> None:
    got = judge(baseline, canary, effect=EffectGate(kind=EffectKind.CLES, max=0.5))
    assert got.latency.evidence.effect_size == pytest.approx(cles)  # type: ignore[union-attr]


def test_percentile_ratio_uses_the_nearest_rank_percentile() -> None:
    baseline = [float(v) for v in range(1, 101)]  # P95 = 95
    canary = [2.0 * v for v in baseline]  # P95 = 190
    gate = EffectGate(kind=EffectKind.PERCENTILE_RATIO, max=1.5, percentile=95)
    got = judge(baseline, canary, effect=gate)
    evidence = got.latency.evidence
    assert (evidence.baseline_percentile, evidence.canary_percentile) == (95.0, 190.0)  # type: ignore[union-attr]
    assert evidence.effect_size == 2.0  # type: ignore[union-attr]
    assert got.classification is Classification.HIGH


def test_direction_decrease_flags_a_faster_canary_only() -> None:
    rng = np.random.default_rng(11)
    baseline = rng.lognormal(4, 0.3, 500)
    faster = rng.lognormal(4, 0.3, 500) * 0.5
    slower = rng.lognormal(4, 0.3, 500) * 2.0
    decrease = {"direction": Direction.DECREASE}
    assert judge(baseline, faster, **decrease).classification is Classification.LOW
    assert judge(baseline, slower, **decrease).classification is Classification.PASS
    assert judge(baseline, slower).classification is Classification.HIGH
    assert judge(baseline, faster).classification is Classification.PASS
    either = {"direction": Direction.EITHER}
    assert judge(baseline, faster, **either).classification is Classification.LOW
    assert judge(baseline, slower, **either).classification is Classification.HIGH


def test_either_reads_a_wider_interval_than_one_direction() -> None:
    rng = np.random.default_rng(5)
    baseline, canary = rng.lognormal(4, 0.3, 300), rng.lognormal(4, 0.3, 300) * 1.03
    one = judge(baseline, canary, confidence=0.99).latency.evidence
    both = judge(baseline, canary, confidence=0.99, direction=Direction.EITHER).latency.evidence
    assert one.interval_level == pytest.approx(0.98) and both.interval_level == 0.99  # type: ignore[union-attr]
    assert both.interval_low < one.interval_low  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("baseline", "canary", "min_samples"),
    [((), (1.0, 2.0), 1), ((1.0, 2.0), (), 1), ((1.0,) * 50, (2.0,) * 9, 10)],
)
def test_nodata(baseline: tuple[float, ...], canary: tuple[float, ...], min_samples: int) -> None:
    got = judge(baseline, canary, min_samples=min_samples)
    assert got.classification is Classification.NODATA
    assert got.latency.evidence.interval_low is None  # type: ignore[union-attr]


def test_identical_data_pass_with_a_reason() -> None:
    got = judge(CONTROL_10, tuple(reversed(CONTROL_10)), direction=Direction.EITHER)
    assert got.classification is Classification.PASS
    assert "identical" in got.latency.reason


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        judge([1.0, float("nan")], [1.0])
    with pytest.raises(ValueError, match="confidence"):
        judge([1.0], [1.0], confidence=0.4)


# ---------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("baseline", "canary", "direction", "expected"),
    [
        ((10, 1000), (40, 1000), Direction.INCREASE, Classification.HIGH),
        ((10, 1000), (12, 1000), Direction.INCREASE, Classification.PASS),
        ((40, 1000), (10, 1000), Direction.INCREASE, Classification.PASS),
        ((40, 1000), (10, 1000), Direction.DECREASE, Classification.LOW),
        ((40, 1000), (10, 1000), Direction.EITHER, Classification.LOW),
        ((0, 0), (10, 1000), Direction.INCREASE, Classification.NODATA),
    ],
)
def test_failures_by_fisher(
    baseline: tuple[int, int],
    canary: tuple[int, int],
    direction: Direction,
    expected: Classification,
) -> None:
    latencies = [100.0, 110.0, 120.0]
    got = judge(
        latencies,
        latencies,
        failures=(FailureCounts(*baseline), FailureCounts(*canary)),
        failures_direction=direction,
    )
    assert got.failures is not None
    assert got.failures.classification is expected
    assert got.classification is expected  # latency passes (identical)
    if expected is not Classification.NODATA:
        table = [[canary[0], canary[1] - canary[0]], [baseline[0], baseline[1] - baseline[0]]]
        p = sps.fisher_exact(table, alternative="greater").pvalue
        assert got.failures.evidence.p_value_greater == pytest.approx(p)  # type: ignore[union-attr]


def test_either_splits_the_failure_significance() -> None:
    counts = (FailureCounts(10, 1000), FailureCounts(25, 1000))
    one = judge([1.0], [1.0], failures=counts).failures
    both = judge([1.0], [1.0], failures=counts, failures_direction=Direction.EITHER).failures
    assert one is not None and both is not None
    assert one.evidence.significance == pytest.approx(0.01)  # type: ignore[union-attr]
    assert both.evidence.significance == pytest.approx(0.005)  # type: ignore[union-attr]
    p = one.evidence.p_value_greater  # type: ignore[union-attr]
    assert 0.005 < p < 0.01  # the case where splitting decides
    assert one.classification is Classification.HIGH
    assert both.classification is Classification.PASS


def test_evidence_is_plain_json() -> None:
    got = judge(CONTROL_10, HIGH_20, failures=(FailureCounts(1, 10), FailureCounts(0, 10)))
    encoded = json.loads(json.dumps(got.to_dict(), allow_nan=False))
    assert encoded["classification"] == "high"
    assert set(encoded["metrics"]) == {"latency", "failures"}
    assert all(
        v is None or isinstance(v, int | float | str) for v in asdict(got.latency.evidence).values()
    )
