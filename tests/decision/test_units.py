"""Judging on units: cluster-robust tests, the exact-test switch, unit-level SRM."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from controlplane.decision import decide
from controlplane.decision.breaker import Verdict, clustered_units, evaluate
from controlplane.decision.stats import cluster_ratio, clustered_bound_test, unit_split
from controlplane.decision.tally import SrmTally, Tally
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.units import (
    DISTINCT_K,
    UNIT_BLOCKS,
    UnitSummary,
    block_of,
    bottom_distinct,
)

from .factory import STEPS, T0, rule, snap, state

LOOK_ALPHA = 2e-5  # about what a look is held to (docs/decisions/0003)


def with_units(
    base: WindowSnapshot,
    unit: np.ndarray,
    failed: np.ndarray,
    above: np.ndarray,
    log_ms: np.ndarray | None = None,
) -> WindowSnapshot:
    """`base` with per-sample units and outcomes turned into the window's unit state."""
    if log_ms is None:
        log_ms = np.full(unit.shape[0], np.log(100.0))
    rows = block_of(unit.astype(np.uint32))
    size = UNIT_BLOCKS + 1
    table = np.column_stack(
        [
            np.bincount(rows, minlength=size).astype(np.float64),
            np.bincount(rows, weights=failed.astype(np.float64), minlength=size),
            np.bincount(rows, weights=above.astype(np.float64), minlength=size),
            np.bincount(rows, weights=log_ms, minlength=size),
            np.bincount(rows, weights=log_ms**2, minlength=size),
        ]
    )
    stride = max(1, unit.shape[0] // 512)
    return replace(
        base,
        count=int(unit.shape[0]),
        failures=int(failed.sum()),
        above_threshold=int(above.sum()),
        units=UnitSummary.from_arrays(table, bottom_distinct([unit.astype(np.uint32)])),
        reservoir_ms=tuple(float(v) for v in np.exp(log_ms[::stride])),
        reservoir_units=tuple(int(u) for u in unit[::stride]),
    )


def population(rng: np.random.Generator, n: int, users: int, heavy_share: float) -> np.ndarray:
    """n samples' units: one heavy unit with `heavy_share`, the rest spread over `users`."""
    unit = rng.integers(1, 2**32, users, dtype=np.uint64).astype(np.uint32)[
        rng.integers(0, users, n)
    ]
    heavy = rng.random(n) < heavy_share
    unit[heavy] = np.uint32(0xC0FFEE01)
    return unit


def test_a_broken_unit_that_is_half_of_the_window_does_not_trip_on_its_own() -> None:
    rng = np.random.default_rng(1)
    n = 1000
    unit = population(rng, n, 40, 0.5)
    heavy = unit == np.uint32(0xC0FFEE01)
    failed = heavy & (rng.random(n) < 0.2)  # the heavy unit fails a fifth of its requests
    canary = with_units(snap("canary", T0), unit, failed, np.zeros(n, bool))
    r = rule(failure_ratio=0.05)
    judged = evaluate(canary, None, r, alpha=LOOK_ALPHA)
    failures = {g.name: g for g in judged.guardrails}["failures"]
    assert failures.exceeded  # 10% of requests failed: over the 5% bound
    assert failures.test is not None and failures.test.method == "cluster_robust_t_vs_bound"
    assert not failures.breached  # one unit's failures are one observation, not 100
    assert failures.note is not None and "of the canary's window is one unit" in failures.note
    # the same counts judged per request would have tripped
    plain = replace(canary, units=None, reservoir_units=())
    judged_plain = evaluate(plain, None, r, alpha=LOOK_ALPHA)
    assert {g.name: g for g in judged_plain.guardrails}["failures"].breached


def test_failures_spread_over_many_units_still_breach() -> None:
    rng = np.random.default_rng(2)
    n = 2000
    unit = population(rng, n, 400, 0.1)
    failed = rng.random(n) < 0.15
    canary = with_units(snap("canary", T0), unit, failed, np.zeros(n, bool))
    assert clustered_units(canary) is not None
    judged = evaluate(canary, None, rule(failure_ratio=0.05), alpha=LOOK_ALPHA)
    assert judged.verdict is Verdict.BREACH
    failures = {g.name: g for g in judged.guardrails}["failures"]
    assert failures.test is not None and failures.test.method == "cluster_robust_t_vs_bound"


@pytest.mark.parametrize(
    ("units", "method"),
    [
        ("none", "binomial_bound"),  # samples without a unit: per request, exactly
        ("distinct", "binomial_bound"),  # every request its own unit: independent
        ("clustered", "cluster_robust_t_vs_bound"),
    ],
)
def test_which_test_decides(units: str, method: str) -> None:
    rng = np.random.default_rng(3)
    n = 1000
    if units == "none":
        unit = np.zeros(n, dtype=np.uint32)
    elif units == "distinct":
        unit = rng.choice(2**32 - 1, n, replace=False).astype(np.uint32) + 1
    else:
        unit = population(rng, n, 30, 0.3)
    failed = rng.random(n) < 0.2
    canary = with_units(snap("canary", T0), unit, failed, np.zeros(n, bool))
    judged = evaluate(canary, None, rule(failure_ratio=0.05), always_test=True)
    failures = {g.name: g for g in judged.guardrails}["failures"]
    assert failures.test is not None and failures.test.method == method
    assert judged.variants["canary"]["units"]["samples_without_unit"] == (
        n if units == "none" else 0
    )


def test_baseline_comparison_on_units_uses_the_log_mean_test() -> None:
    rng = np.random.default_rng(4)
    n = 1000
    pair = {}
    for arm, shift in (("canary", np.log(2.0)), ("baseline", 0.0)):
        unit = population(rng, n, 50, 0.2)
        log_ms = rng.normal(np.log(100.0) + shift, 0.5, n)
        base = snap(arm, T0, p95_ms=float(np.exp(np.quantile(log_ms, 0.95))))
        pair[arm] = with_units(base, unit, np.zeros(n, bool), np.zeros(n, bool), log_ms)
    r = rule(compare="baseline", baseline_margin=1.2)
    judged = evaluate(pair["canary"], pair["baseline"], r, alpha=LOOK_ALPHA)
    latency = {g.name: g for g in judged.guardrails}["latency"]
    assert latency.basis == "percentile_ratio_and_log_mean_test"
    assert latency.breached
    # an A/A pair is not a breach, whatever its percentile ratio
    same = replace(pair["canary"], units=pair["baseline"].units)
    judged = evaluate(same, pair["baseline"], r, alpha=LOOK_ALPHA)
    assert not {g.name: g for g in judged.guardrails}["latency"].breached


def test_the_variance_is_never_below_the_binomial_one() -> None:
    # every block at exactly the same rate: the sandwich says zero variance
    table = np.zeros((UNIT_BLOCKS + 1, 5))
    table[1:, 0] = 100
    table[1:, 1] = 10
    summary = UnitSummary.from_arrays(table, np.zeros(0, dtype=np.uint32))
    est = cluster_ratio(summary, 1)
    assert est.variance == pytest.approx(0.0, abs=1e-15)
    result = clustered_bound_test("failures", est, 0.05)
    # (0.1 - 0.05) / sqrt(0.05 * 0.95 / 6400) = 18.4: the binomial floor, not infinity
    assert result.statistic == pytest.approx(18.35, rel=0.01)


# ---------------------------------------------------------------- unit-level SRM


def sketch(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    values = rng.choice(2**32 - 1, n, replace=False) + 1
    return tuple(int(v) for v in np.sort(values)[:DISTINCT_K])


def test_unit_split_counts_over_the_hashes_both_sketches_cover() -> None:
    rng = np.random.default_rng(5)
    full = sketch(rng, 5000)  # more units than the sketch holds: it covers a fifth
    small = sketch(rng, 200)
    split = unit_split(full, small, 2000, full=DISTINCT_K)
    assert split.baseline_units == DISTINCT_K
    assert split.covered_fraction == pytest.approx(DISTINCT_K / 5000, rel=0.1)
    assert split.canary_units == sum(1 for h in small if h <= full[-1])


def unit_snapshots(
    t: float, rng: np.random.Generator, canary_units: int, baseline_units: int, heavy: int = 0
) -> dict[str, WindowSnapshot]:
    out = {}
    for arm, users in (("canary", canary_units), ("baseline", baseline_units)):
        n = 4 * users + (heavy if arm == "canary" else 0)
        unit = rng.integers(1, 2**32, users, dtype=np.uint64).astype(np.uint32)
        samples = unit[rng.integers(0, users, n)]
        if arm == "canary" and heavy:
            samples[:heavy] = np.uint32(0xBEEF)
        out[arm] = with_units(snap(arm, t), samples, np.zeros(n, bool), np.zeros(n, bool))
    return out


@pytest.mark.parametrize(
    ("canary_units", "heavy", "expect_srm", "expect_heavy"),
    [
        (500, 0, False, False),  # fair: 500 of 1,000 units at 50%
        (380, 0, True, False),  # the canary lost a quarter of its units
        (500, 3000, False, True),  # one unit makes 3,000 extra canary requests
    ],
)
def test_split_is_judged_on_units(
    canary_units: int, heavy: int, expect_srm: bool, expect_heavy: bool
) -> None:
    rng = np.random.default_rng(6)
    s = state(step_index=3, canary_bp=5000, weight_since=T0)
    events: list[str] = []
    srm = None
    for k in range(6):  # six disjoint windows after the route settled
        t = T0 + 11.5 + 10 * k
        d = decide(
            s, unit_snapshots(t, rng, canary_units, 1000 - canary_units, heavy), rule(), STEPS, t
        )
        s = d.new_state
        events += [e.kind.value for e in d.events]
        srm = d.evidence.get("srm") or srm
    assert srm is not None and srm["judged_on"] == "units"
    assert ("srm_detected" in events) is expect_srm
    assert srm["heavy_users"] is expect_heavy


@pytest.mark.parametrize(("units", "warned"), [(True, False), (False, True)])
def test_a_canary_whose_few_users_are_silent_is_no_sample_ratio_mismatch(
    units: bool, warned: bool
) -> None:
    # a 1% step: the canary's handful of light users make no request for a minute
    # while one heavy baseline user makes most of 2,000. On units, 0 of about 60
    # seen is what 1% expects; the request counts (0 of 2,000, 20 expected) would
    # call it a mismatch - as they still do when the windows carry no units
    rng = np.random.default_rng(11)
    s = state(step_index=0, canary_bp=100, weight_since=T0)
    events: list[str] = []
    srm = None
    for k in range(6):
        t = T0 + 11.5 + 10 * k
        heavy = np.full(1400, 0xBEEF, dtype=np.uint32)
        light = rng.integers(1, 2**32, 600, dtype=np.uint64).astype(np.uint32) % 60 + 7
        unit = np.concatenate([heavy, light])
        baseline = with_units(snap("baseline", t), unit, np.zeros(2000, bool), np.zeros(2000, bool))
        empty = np.zeros(0, dtype=np.uint32)
        canary = with_units(snap("canary", t), empty, np.zeros(0, bool), np.zeros(0, bool))
        if not units:
            baseline = replace(baseline, units=None, reservoir_units=())
            canary = replace(canary, units=None, reservoir_units=())
        d = decide(s, {"canary": canary, "baseline": baseline}, rule(), STEPS, t)
        s = d.new_state
        events += [e.kind.value for e in d.events]
        srm = d.evidence.get("srm") or srm
    assert srm is not None and srm["judged_on"] == ("units" if units else "requests")
    assert ("srm_detected" in events) is warned


def test_a_ramp_step_change_starts_a_new_unit_count() -> None:
    rng = np.random.default_rng(7)
    s = state(step_index=1, canary_bp=500, weight_since=T0)
    s = decide(s, unit_snapshots(T0 + 11.5, rng, 50, 950), rule(), STEPS, T0 + 11.5).new_state
    assert s.srm_tally is not None and s.srm_tally.canary_units
    # the weight rises: units seen at 5% are judged again against 25%, from scratch
    moved = s.with_changes(canary_bp=2500, weight_since=T0 + 12)
    later = unit_snapshots(T0 + 23.5, rng, 250, 750)
    d = decide(moved, later, rule(), STEPS, T0 + 23.5)
    tally = d.new_state.srm_tally
    assert tally is not None and tally.since == T0 + 12 and tally.windows == 1
    assert later["canary"].units is not None
    assert d.evidence["srm"]["units"]["canary_units"] == len(later["canary"].units.distinct)
    assert d.evidence["srm"]["expected_canary_fraction"] == 0.25
    assert not d.new_state.srm_flagged


def test_unit_state_survives_the_rollout_state_round_trip() -> None:
    rng = np.random.default_rng(8)
    snaps = unit_snapshots(T0 + 11.5, rng, 300, 700)
    tally = Tally.starting(T0).add(snaps["canary"], snaps["baseline"])
    again = Tally.from_dict(tally.to_dict())
    assert again.canary.units is not None and tally.canary.units is not None
    np.testing.assert_array_equal(again.canary.units.rows, tally.canary.units.rows)
    srm = SrmTally.starting(T0, T0 + 1).add(
        700, 300, T0 + 11.5, (snaps["baseline"].units, snaps["canary"].units)
    )
    assert SrmTally.from_dict(srm.to_dict()) == srm
    with pytest.raises(ValueError):
        SrmTally.from_dict({**srm.to_dict(), "canary_units": "xyz"})
    round_trip = WindowSnapshot.from_json(snaps["canary"].to_json())
    assert round_trip.units is not None
    assert round_trip.reservoir_units == snaps["canary"].reservoir_units


@pytest.mark.parametrize(("clustered", "advances"), [(True, True), (False, False)])
def test_a_heavy_slow_unit_does_not_hold_a_step_for_ever(clustered: bool, advances: bool) -> None:
    """6% above the threshold against a 5% tail, made by one heavy unit: per request
    that holds the step (more requests would settle it); on units it cannot be told
    from the unit's own spread, so the step advances and the next one judges again."""
    rng = np.random.default_rng(9)
    n = 2000
    unit = population(rng, n, 60, 0.3)
    heavy = unit == np.uint32(0xC0FFEE01)
    above = (heavy & (rng.random(n) < 0.16)) | (~heavy & (rng.random(n) < 0.017))
    window = with_units(snap("canary", T0 + 50), unit, np.zeros(n, bool), above)
    if not clustered:
        window = replace(window, units=None, reservoir_units=())
    assert window.above_threshold_fraction > 0.05
    s = state(tally=Tally.starting(T0).add(window, None))
    # a look whose window overlaps the counted one: the gate judges the tally alone
    fine = snap("canary", T0 + 59, above=10)
    d = decide(s, {"canary": fine, "baseline": snap("baseline", T0 + 59)}, rule(), STEPS, T0 + 61)
    assert (d.new_state.step_index == 1) is advances
    gate = d.evidence["step_gate"]["guardrails"]["latency"]
    assert gate["exceeded"]
