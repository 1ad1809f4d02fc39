"""Unit-aware windows: per-block sums, the distinct-unit sketch and reservoir units.

The property that matters: split the samples any way over collectors (shards) and
over publishes (partials), merge, and the unit state is the one window over all of
them — counts exactly, log sums to rounding, the distinct sketch exactly.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.collector.sharding import export_partial, merge_snapshots, parse_partials
from controlplane.collector.windows import ExperimentWindow, WindowConfig
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.units import DISTINCT_K, UNIT_BLOCKS, UnitSummary, concentration

START = 1_800_000_000.0
CONFIG = WindowConfig(window_sec=20, threshold_ms=50.0)


def columns(
    seed: int, n: int, units: int, unitless: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    variant = rng.integers(0, 2, n).astype(np.int64)
    ts = START - 15 + rng.uniform(0, 15, n)
    rt = rng.lognormal(np.log(40_000), 1.0, n).astype(np.uint32)
    outcome = rng.choice(np.array([200, 200, 503], dtype=np.uint16), n)
    pool = rng.integers(1, 2**32, units, dtype=np.uint64).astype(np.uint32)
    unit = pool[rng.integers(0, units, n)]
    unit[rng.random(n) < unitless] = 0
    return variant, ts, rt, outcome, unit


def fresh() -> ExperimentWindow:
    window = ExperimentWindow("e", CONFIG, clock_now=START, seed=1)
    window._variant_index("baseline")
    window._variant_index("canary")
    return window


def ingest(window: ExperimentWindow, cols: tuple[np.ndarray, ...], index: np.ndarray) -> None:
    variant, ts, rt, outcome, unit = (c[index] for c in cols)
    window.ingest(variant, ts, rt, outcome, START, unit)


def assert_same_units(got: WindowSnapshot, want: WindowSnapshot) -> None:
    assert got.units is not None and want.units is not None
    np.testing.assert_array_equal(got.units.rows[:, :3], want.units.rows[:, :3])
    np.testing.assert_allclose(got.units.rows[:, 3:], want.units.rows[:, 3:], rtol=1e-9, atol=1e-6)
    np.testing.assert_array_equal(got.units.distinct, want.units.distinct)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 3_000),
    units=st.integers(1, 3_000),
    unitless=st.sampled_from([0.0, 0.1, 1.0]),
    shards=st.integers(1, 4),
    publishes=st.integers(1, 3),
)
def test_unit_state_merges_exactly_across_shards_and_partials(
    seed: int, n: int, units: int, unitless: float, shards: int, publishes: int
) -> None:
    cols = columns(seed, n, units, unitless)
    whole = fresh()
    ingest(whole, cols, np.arange(n))
    want = whole.snapshot(START)

    rng = np.random.default_rng(seed + 1)
    owner = rng.integers(0, shards, n)
    fields: dict[str, str] = {}
    for shard in range(shards):
        window = fresh()
        mine = np.flatnonzero(owner == shard)
        # the shard ingests its share in several reads, publishing after each
        for part in np.array_split(mine, publishes):
            ingest(window, cols, part)
            partial = export_partial(window, START, collector=f"c{shard}", unacked=())
            fields[f"@part:c{shard}"] = json.dumps(partial)
    got = merge_snapshots("e", parse_partials(fields), START, window_sec=CONFIG.window_sec)
    for name, snap in want.items():
        assert got[name].count == snap.count
        assert_same_units(got[name], snap)
        assert len(got[name].reservoir_units) == len(got[name].reservoir_ms)


def test_a_unit_that_is_half_of_a_window() -> None:
    n = 4_000
    cols = columns(5, n, 1_000, 0.0)
    variant, ts, rt, outcome, unit = cols
    variant[:] = 1
    heavy = np.uint32(0xDEADBEEF)
    unit[::2] = heavy
    window = fresh()
    window.ingest(variant, ts, rt, outcome, START, unit)
    snap = window.snapshot(START)["canary"]
    assert snap.units is not None
    block = (int(heavy) * UNIT_BLOCKS) >> 32
    assert snap.units.blocks[block, 0] >= n // 2
    assert snap.units.unit_samples == n
    assert snap.units.no_unit_samples == 0
    found = concentration(snap.reservoir_units, snap.count)
    assert found.top[0][0] == int(heavy)
    assert 0.4 < found.top[0][1] < 0.6
    assert found.effective_units is not None and found.effective_units < 5


def test_samples_without_a_unit_are_counted_apart() -> None:
    n = 1_000
    variant, ts, rt, outcome, unit = columns(6, n, 50, 0.0)
    unit[:300] = 0
    window = fresh()
    window.ingest(variant, ts, rt, outcome, START, unit)
    snaps = window.snapshot(START)
    assert sum(s.units.no_unit_samples for s in snaps.values() if s.units) == 300
    assert sum(s.units.unit_samples for s in snaps.values() if s.units) == 700
    # the log sums describe the samples: their mean is ln of a typical RT in ms
    canary = snaps["canary"].units
    assert canary is not None
    mean_log = canary.rows[:, 3].sum() / canary.rows[:, 0].sum()
    assert mean_log == pytest.approx(np.log(40.0), abs=0.15)


def test_distinct_units_exact_below_the_sketch_size_estimated_above() -> None:
    for units, exact in ((500, True), (20_000, False)):
        n = 60_000
        variant, ts, rt, outcome, unit = columns(7, n, units, 0.0)
        variant[:] = 0
        window = fresh()
        window.ingest(variant, ts, rt, outcome, START, unit)
        summary = window.snapshot(START)["baseline"].units
        assert summary is not None
        seen = len(np.unique(unit))
        if exact:
            assert summary.distinct_units() == seen
        else:
            assert len(summary.distinct) == DISTINCT_K
            assert summary.distinct_units() == pytest.approx(seen, rel=0.1)


def test_malformed_unit_summaries_are_refused() -> None:
    with pytest.raises(ValueError):
        UnitSummary.from_dict({"blocks": [[1, 2, 0, 0.0, 0.0]]})  # too few rows
    with pytest.raises(ValueError):
        UnitSummary.from_dict({"blocks": [[1, 2, 0, 0.0, 0.0]] * UNIT_BLOCKS})  # failures > count
    with pytest.raises(ValueError):
        UnitSummary.from_dict({"distinct": [0]})
    with pytest.raises(ValueError):
        UnitSummary.from_dict({"no_unit": [1, 0, 0, float("nan"), 0.0]})


def test_rows_without_units_read_off_the_histogram_match_the_per_sample_sums() -> None:
    variant, ts, rt, outcome, unit = columns(9, 2_000, 10, 1.0)
    alone = fresh()
    alone.ingest(variant, ts, rt, outcome, START, unit)  # no unit at all: the histogram path
    mixed = fresh()
    unit_one = unit.copy()
    unit_one[-1] = 7  # one sample with a unit: the per-sample path
    mixed.ingest(variant[:-1], ts[:-1], rt[:-1], outcome[:-1], START, unit_one[:-1])
    mixed.ingest(variant[-1:], ts[-1:], rt[-1:], outcome[-1:], START, unit_one[-1:])
    other = fresh()
    other.ingest(variant, ts, rt, outcome, START, unit_one)
    for name in ("baseline", "canary"):
        a, b = mixed.snapshot(START)[name].units, other.snapshot(START)[name].units
        assert a is not None and b is not None
        np.testing.assert_array_equal(a.rows[:, :3], b.rows[:, :3])
        np.testing.assert_allclose(a.rows, b.rows, rtol=1e-12)
    assert alone.snapshot(START)["canary"].units is not None
