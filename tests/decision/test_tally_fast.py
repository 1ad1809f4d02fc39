"""The tally's add, thin, merge, union and hex codec against the plain implementations
they replace (kept below as the reference): the same values, field for field, and the
same stored JSON text, on generated tallies and windows (ties, reservoirs at and past
the cap, units present, absent or mismatched, counts of zero).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.decision import ramp_split
from controlplane.decision import tally as fast
from controlplane.decision.ramp_split import RampSplit
from controlplane.decision.tally import RESERVOIR_CAP, SrmTally, Tally, VariantTally
from controlplane.kernel.snapshots import PERCENTILE_FIELDS, WindowSnapshot
from controlplane.kernel.units import DISTINCT_K, UnitSummary, bottom_distinct

T0 = 1_800_000_000.0

# --- the reference: the implementation before it was vectorised -------------------


def ref_thin(values: tuple[Any, ...], keep: int) -> tuple[Any, ...]:
    if keep >= len(values):
        return values
    if keep <= 0:
        return ()
    step = len(values) / keep
    return tuple(values[int(i * step)] for i in range(keep))


def ref_merge_reservoirs(
    old: tuple[Any, ...], old_count: int, new: tuple[Any, ...], new_count: int
) -> tuple[Any, ...]:
    if len(old) + len(new) <= RESERVOIR_CAP:
        return old + new
    total = old_count + new_count
    keep_old = round(RESERVOIR_CAP * old_count / total) if total else 0
    keep_new = RESERVOIR_CAP - keep_old
    return ref_thin(old, keep_old) + ref_thin(new, keep_new)


def ref_merge_reservoir_units(
    old: tuple[int, ...],
    old_values: tuple[float, ...],
    old_count: int,
    new: tuple[int, ...],
    new_values: tuple[float, ...],
    new_count: int,
) -> tuple[int, ...]:
    if len(old) != len(old_values) or len(new) != len(new_values) or not new:
        return ()
    if old_count and not old:
        return ()
    return tuple(int(u) for u in ref_merge_reservoirs(old, old_count, new, new_count))


def ref_add(self: VariantTally, snap: WindowSnapshot) -> VariantTally:
    first = not self.percentiles_ms
    exact = snap.threshold_exact and (
        first
        or (self.threshold_exact and fast._same_threshold(self.threshold_ms, snap.threshold_ms))
    )
    return VariantTally(
        count=self.count + snap.count,
        failures=self.failures + snap.failures,
        above_threshold=self.above_threshold + snap.above_threshold,
        threshold_ms=snap.threshold_ms if first else self.threshold_ms,
        threshold_exact=exact,
        reservoir_ms=ref_merge_reservoirs(
            self.reservoir_ms, self.count, snap.reservoir_ms, snap.count
        ),
        percentiles_ms=tuple((q, snap.percentile_ms(q)) for q in PERCENTILE_FIELDS),
        reservoir_units=ref_merge_reservoir_units(
            self.reservoir_units,
            self.reservoir_ms,
            self.count,
            snap.reservoir_units,
            snap.reservoir_ms,
            snap.count,
        ),
        units=fast._add_units(self.units, first, snap.units),
    )


def ref_percentile(self: VariantTally, q: float) -> float | None:
    if self.reservoir_ms:
        ordered = sorted(self.reservoir_ms)
        rank = max(math.ceil(q / 100 * len(ordered)), 1)
        return ordered[rank - 1]
    return dict(self.percentiles_ms).get(q)


def ref_union(held: tuple[int, ...] | None, new: UnitSummary | None) -> tuple[int, ...] | None:
    if held is None or new is None:
        return None
    fresh = new.distinct.astype(np.int64).tolist()
    if not held:
        return tuple(fresh)
    merged = sorted(set(held).union(fresh))
    return tuple(merged[:DISTINCT_K])


def ref_hex(sketch: tuple[int, ...] | None) -> str | None:
    return None if sketch is None else "".join(f"{h:08x}" for h in sketch)


def ref_unhex(text: Any) -> tuple[int, ...] | None:
    if text is None:
        return None
    if not isinstance(text, str) or len(text) % 8 or len(text) > 8 * DISTINCT_K:
        raise ValueError("a unit sketch is up to 1,024 hashes of 8 hex digits")
    return tuple(int(text[i : i + 8], 16) for i in range(0, len(text), 8))


# --- generated values ---------------------------------------------------------------

# value regimes: continuous, heavy ties, a handful of distinct values
REGIMES = ("continuous", "ties", "few")


def _values(rng: np.random.Generator, n: int, regime: str) -> tuple[float, ...]:
    if regime == "continuous":
        return tuple(rng.lognormal(3.0, 1.0, n).tolist())
    if regime == "ties":
        return tuple(np.round(rng.lognormal(3.0, 0.3, n)).tolist())
    return tuple(rng.choice([1.0, 2.0, 2.0, 5.0], n).tolist())


def _units(rng: np.random.Generator, n: int, mode: str) -> tuple[int, ...]:
    if mode == "none":
        return ()
    if mode == "short":  # a producer whose units do not match its reservoir
        n = max(n - 1, 0)
    return tuple(rng.integers(0, 50, n).astype(np.int64).tolist())


def _summary(rng: np.random.Generator, n: int) -> UnitSummary:
    rows = np.zeros((65, 5))
    rows[:, 0] = rng.integers(0, 5, 65)
    distinct = bottom_distinct([rng.integers(1, 2**32, n, dtype=np.uint32)])
    return UnitSummary.from_arrays(rows, distinct)


def _window(
    rng: np.random.Generator, n: int, extra: int, regime: str, units: str, start: float
) -> WindowSnapshot:
    values = _values(rng, n, regime)
    return WindowSnapshot(
        experiment="e",
        variant="canary",
        count=n + extra,
        failures=int(rng.integers(0, n + extra + 1)),
        window_sec=10,
        ts=start + 10,
        window_start=start,
        window_end=start + 10,
        threshold_ms=float(rng.choice([300.0, 300.0 * (1 + 1e-12), 250.0])),
        above_threshold=int(rng.integers(0, n + extra + 1)),
        threshold_exact=bool(rng.random() < 0.9),
        reservoir_ms=values,
        reservoir_units=_units(rng, n, units),
        units=_summary(rng, int(rng.integers(0, 1500))) if units != "none" else None,
        p50_ms=float(rng.random()),
        p95_ms=None if rng.random() < 0.2 else float(rng.random()),
        p99_ms=float(rng.random()),
    )


def _windows(seed: int, looks: int, regime: str, units: str) -> list[WindowSnapshot]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(looks):
        # sizes around the cap: empty, small, a collector's 512, past the cap at once
        n = int(rng.choice([0, 1, 2, 7, 512, 1999, 2000, 2001, 2600]))
        extra = int(rng.choice([0, 0, 3, 10_000]))
        out.append(_window(rng, n, extra, regime, units, T0 + 10 * i))
    return out


def _same(a: VariantTally, b: VariantTally) -> None:
    assert a == b  # every field
    assert [type(v) for v in a.reservoir_ms] == [type(v) for v in b.reservoir_ms]
    assert [type(u) for u in a.reservoir_units] == [type(u) for u in b.reservoir_units]
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())
    for q in PERCENTILE_FIELDS:
        assert a.percentile_ms(q) == ref_percentile(b, q)


# --- the properties ------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    looks=st.integers(1, 12),
    regime=st.sampled_from(REGIMES),
    units=st.sampled_from(("full", "none", "short")),
)
def test_add_is_the_reference_add_look_after_look(
    seed: int, looks: int, regime: str, units: str
) -> None:
    new = old = VariantTally()
    for snap in _windows(seed, looks, regime, units):
        new, old = new.add(snap), ref_add(old, snap)
        _same(new, old)
        again = VariantTally.from_dict(json.loads(json.dumps(new.to_dict())))
        before = VariantTally.from_dict(json.loads(json.dumps(old.to_dict())))
        assert json.dumps(again.to_dict()) == json.dumps(before.to_dict())


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), looks=st.integers(1, 8), regime=st.sampled_from(REGIMES))
def test_the_step_tally_is_the_reference_one(seed: int, looks: int, regime: str) -> None:
    new = Tally.starting(T0)
    canary = baseline = VariantTally()
    for snap in _windows(seed, looks, regime, "full"):
        twin = WindowSnapshot(**{**snap.__dict__, "variant": "baseline", "count": 9 * snap.count})
        new = new.add(snap, twin)
        canary, baseline = ref_add(canary, snap), ref_add(baseline, twin)
        _same(new.canary, canary)
        _same(new.baseline, baseline)
    stored = Tally.from_dict(json.loads(json.dumps(new.to_dict())))
    assert stored.canary == VariantTally.from_dict(json.loads(json.dumps(canary.to_dict())))


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(0, 3000),
    keep=st.integers(-2, 3100),
    regime=st.sampled_from(REGIMES),
)
def test_thin_picks_the_reference_elements(length: int, keep: int, regime: str) -> None:
    values = _values(np.random.default_rng(length), length, regime)
    assert fast._thin(values, keep) == ref_thin(values, keep)
    units = tuple(range(length))  # the positions themselves: the same picks, not only values
    assert fast._thin(units, keep) == ref_thin(units, keep)


@settings(max_examples=200, deadline=None)
@given(
    old_len=st.integers(0, 2600),
    new_len=st.integers(0, 2600),
    old_extra=st.integers(0, 10**6),
    new_extra=st.integers(0, 10**6),
)
def test_merge_keeps_the_reference_positions_and_counts_the_cap(
    old_len: int, new_len: int, old_extra: int, new_extra: int
) -> None:
    old = tuple(range(old_len))
    new = tuple(range(10**6, 10**6 + new_len))
    merged = fast._merge_reservoirs(old, old_len + old_extra, new, new_len + new_extra)
    assert merged == ref_merge_reservoirs(old, old_len + old_extra, new, new_len + new_extra)
    assert len(merged) <= max(RESERVOIR_CAP, old_len + new_len) and (
        old_len + new_len <= RESERVOIR_CAP or len(merged) <= RESERVOIR_CAP
    )
    # counts of zero on both sides: the reference's "keep none of the old" stands
    assert fast._merge_reservoirs(old, 0, new, 0) == ref_merge_reservoirs(old, 0, new, 0)


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    held=st.integers(0, 1100),
    fresh=st.integers(0, 1500),
    overlap=st.booleans(),
)
def test_union_and_the_stored_sketch_are_the_reference_ones(
    seed: int, held: int, fresh: int, overlap: bool
) -> None:
    rng = np.random.default_rng(seed)
    high = 3000 if overlap else 2**32  # a small range: the sketches share hashes
    kept = tuple(sorted(set(rng.integers(1, high, held).tolist())))[:DISTINCT_K]
    summary = _summary(rng, 0)
    summary = UnitSummary.from_arrays(summary.rows, np.unique(rng.integers(1, high, fresh)))
    assert fast._union(kept, summary) == ref_union(kept, summary)
    assert fast._union(None, summary) is None and fast._union(kept, None) is None
    srm = SrmTally.starting(T0, T0).add(5, 7, T0 + 10, (summary, summary))
    srm = srm.add(3, 1, T0 + 20, (summary, UnitSummary.from_arrays(summary.rows, np.array(kept))))
    text = fast._hex(srm.canary_units)
    assert text == ref_hex(srm.canary_units)
    assert fast._unhex(text) == ref_unhex(text)
    assert SrmTally.from_dict(json.loads(json.dumps(srm.to_dict()))) == srm


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0000000100000002",
        "FFFFFFFFabcdef01",
        "-0000001",
        "+0000001",
        " 0000001",
        "0000 001",
        "0_000001",
        "0000000g",
        "00000001 ",
        "\u0661" * 8,
        "0x000001",
    ],
)
def test_unhex_reads_or_refuses_what_the_reference_did(text: str) -> None:
    try:
        expected: Any = ref_unhex(text)
    except ValueError:
        with pytest.raises(ValueError):
            fast._unhex(text)
        return
    assert fast._unhex(text) == expected


@pytest.mark.parametrize(
    "sketch", [(), (1,), (0, 2**32 - 1), (2**32,), (-1, 5), (2**40, 3), None]
)
def test_hex_writes_what_the_reference_wrote(sketch: tuple[int, ...] | None) -> None:
    assert fast._hex(sketch) == ref_hex(sketch)


@pytest.mark.parametrize(
    "values",
    [
        (),
        (3.0,),
        (2.0, 1.0, 2.0, 0.5),
        (0.0, -0.0, 0.0, -1.0),
        (1, 1.0, True, 0.5, 1),
        (2**53 + 1, float(2**53), 1.0),
        (float("nan"), 1.0, 0.5, float("nan")),
        (float("inf"), -float("inf"), 0.0),
        (1e308, -1e308, 5.0),
    ],
)
def test_the_sorted_reservoir_is_sorted_s(values: tuple[float, ...]) -> None:
    ordered = fast._sorted(values)
    expected = tuple(sorted(values))
    assert [repr(v) for v in ordered] == [repr(v) for v in expected]
    assert [id(v) for v in ordered] == [id(v) for v in expected]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 1, 1.0, 2.5, -3.0, 7, 1e-300]), max_size=60))
def test_ties_of_equal_numbers_keep_sorted_s_order(values: list[float]) -> None:
    ordered = fast._sorted(tuple(values))
    assert [id(v) for v in ordered] == [id(v) for v in sorted(values)]


# --- the ramp ledger's membership tests --------------------------------------------


def _sketches(rng: np.random.Generator, kind: str, n: int, dtype: Any) -> np.ndarray:
    raw = rng.integers(1, 3000 if kind != "wide" else 2**32, n)
    if kind == "duplicates":
        return raw.astype(dtype)
    if kind == "unsorted":
        return np.unique(raw).astype(dtype)[::-1].copy()
    return np.unique(raw).astype(dtype)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.tuples(st.integers(0, 1200), st.integers(0, 1200)),
    kinds=st.tuples(*[st.sampled_from(("sorted", "wide", "duplicates", "unsorted"))] * 2),
    dtypes=st.tuples(*[st.sampled_from((np.uint32, np.int64))] * 2),
)
def test_isin_is_numpy_s(
    seed: int, sizes: tuple[int, int], kinds: tuple[str, str], dtypes: tuple[Any, Any]
) -> None:
    rng = np.random.default_rng(seed)
    values = _sketches(rng, kinds[0], sizes[0], dtypes[0])
    among = _sketches(rng, kinds[1], sizes[1], dtypes[1])
    expected = np.isin(values, among, assume_unique=True)
    got = ramp_split._isin(values, among)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), looks=st.integers(1, 30), users=st.integers(50, 9000))
def test_the_ramp_ledger_is_the_one_isin_kept(seed: int, looks: int, users: int) -> None:
    rng = np.random.default_rng(seed)
    population = np.unique(rng.integers(1, 2**32, users, dtype=np.uint32))
    new = old = RampSplit()
    for _ in range(looks):
        weight = int(rng.choice([0, 100, 1000, 5000, 10_000]))
        active = population[rng.random(population.shape[0]) < 0.3]
        in_canary = active % 10_000 < weight
        if rng.random() < 0.1:  # a unit in both arms: the ledger counts it inconsistent
            in_canary[: 3] = True
        base = bottom_distinct([active[~in_canary]])
        canary = bottom_distinct([active[in_canary], active[:3]])
        new = new.observe(base, canary, weight, seconds=10.0)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                ramp_split, "_isin", lambda a, b: np.isin(a, b, assume_unique=True)
            )
            old = old.observe(base, canary, weight, seconds=10.0)
        assert json.dumps(new.to_dict()) == json.dumps(old.to_dict())
        assert new.to_evidence() == old.to_evidence()
