"""Windows keep two latencies: the total time and the time to the first byte.

The laws: the first-byte window is exactly the window a collector would keep over the
samples that carry a first byte, with that first byte as their latency; samples from
version 1 batches count in the total window only; and both windows merge exactly
however the samples are split over collectors and publishes, including partials from
a collector older than the first byte.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.collector.sharding import export_partial, merge_snapshots, parse_partials
from controlplane.collector.windows import ExperimentWindow, WindowConfig
from controlplane.kernel.codec import BatchBuilder, decode_raw
from controlplane.kernel.snapshots import WindowSnapshot

START = 1_800_000_000.0
CONFIG = WindowConfig(window_sec=20, threshold_ms=50.0)
EXACT = ("count", "failures", "above_threshold", "threshold_exact", "p50_ms", "p90_ms",
         "p95_ms", "p99_ms", "p999_ms")  # fmt: skip

Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def columns(seed: int, n: int) -> Columns:
    """Streams: a slow body after a head that comes fast (sometimes slow), 5xx now and then."""
    rng = np.random.default_rng(seed)
    variant = rng.integers(0, 2, n).astype(np.int64)
    ts = START - 15 + rng.uniform(0, 15, n)
    fb = rng.lognormal(np.log(20_000), 1.0, n).astype(np.uint32)
    body = rng.lognormal(np.log(900_000), 0.5, n).astype(np.uint32)
    rt = (fb.astype(np.uint64) + body).clip(0, 2**32 - 1).astype(np.uint32)
    outcome = rng.choice(np.array([200, 200, 503], dtype=np.uint16), n)
    unit = rng.integers(0, 50, n).astype(np.uint32)
    return variant, ts, rt, outcome, unit, fb


def fresh() -> ExperimentWindow:
    window = ExperimentWindow("e", CONFIG, clock_now=START, seed=1)
    window._variant_index("baseline")
    window._variant_index("canary")
    return window


def ingest(
    window: ExperimentWindow, cols: Columns, index: np.ndarray, known: np.ndarray | None
) -> None:
    variant, ts, rt, outcome, unit, fb = (c[index] for c in cols)
    if known is None:
        window.ingest(variant, ts, rt, outcome, START, unit, fb_us=fb)
    else:
        window.ingest(variant, ts, rt, outcome, START, unit, fb_us=fb, known=known[index])


def assert_same(got: WindowSnapshot, want: WindowSnapshot) -> None:
    for name in EXACT:
        assert getattr(got, name) == getattr(want, name), name
    if want.mean_ms is None:
        assert got.mean_ms is None
    else:
        assert got.mean_ms == pytest.approx(want.mean_ms, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 3_000),
    old_share=st.sampled_from([0.0, 0.3, 1.0]),
    shards=st.integers(1, 4),
    publishes=st.integers(1, 3),
)
def test_both_latencies_merge_exactly_across_shards_and_partials(
    seed: int, n: int, old_share: float, shards: int, publishes: int
) -> None:
    cols = columns(seed, n)
    rng = np.random.default_rng(seed + 1)
    known = rng.random(n) >= old_share  # the rest came from sidecars before version 2
    whole = fresh()
    ingest(whole, cols, np.arange(n), known)
    want = whole.snapshot(START)

    # the law behind the first-byte window: the window over the samples with a first
    # byte, that first byte as their latency
    reference = fresh()
    variant, ts, _, outcome, unit, fb = cols
    keep = np.flatnonzero(known)
    reference.ingest(variant[keep], ts[keep], fb[keep], outcome[keep], START, unit[keep])
    by_first_byte = reference.snapshot(START)

    owner = rng.integers(0, shards, n)
    fields: dict[str, str] = {}
    for shard in range(shards):
        window = fresh()
        mine = np.flatnonzero(owner == shard)
        for part in np.array_split(mine, publishes):
            ingest(window, cols, part, known)
            partial = export_partial(window, START, collector=f"c{shard}", unacked=())
            fields[f"@part:c{shard}"] = json.dumps(partial)
    got = merge_snapshots("e", parse_partials(fields), START, window_sec=CONFIG.window_sec)
    for name, snap in want.items():
        assert snap.first_byte is not None
        assert_same(snap.first_byte, replace(by_first_byte[name], first_byte=None))
        assert_same(got[name], snap)
        merged_fb = got[name].first_byte
        assert merged_fb is not None
        assert_same(merged_fb, snap.first_byte)
        assert got[name].missing_first_byte == snap.missing_first_byte
        in_variant = variant == (0 if name == "baseline" else 1)
        assert snap.missing_first_byte == int(np.count_nonzero(in_variant & ~known))
        assert set(merged_fb.reservoir_ms) <= {float(v) / 1000 for v in fb[in_variant & known]}
    assert whole.counters.without_first_byte == int(np.count_nonzero(~known))


def test_a_partial_from_a_collector_before_the_first_byte_counts_in_the_total_only() -> None:
    cols = columns(7, 1_000)
    new, old = fresh(), fresh()
    ingest(new, cols, np.arange(0, 600), None)
    ingest(old, cols, np.arange(600, 1_000), None)
    legacy = export_partial(old, START, collector="old", unacked=())
    for part in legacy["variants"].values():
        del part["fb"]  # what an older collector publishes
    fields = {
        "@part:new": json.dumps(export_partial(new, START, collector="new", unacked=())),
        "@part:old": json.dumps(legacy),
    }
    got = merge_snapshots("e", parse_partials(fields), START, window_sec=CONFIG.window_sec)
    mine = new.snapshot(START)
    for name, snap in got.items():
        assert snap.first_byte is not None and mine[name].first_byte is not None
        assert snap.first_byte.count == mine[name].first_byte.count
        assert snap.count == mine[name].count + old.snapshot(START)[name].count
        assert snap.missing_first_byte == old.snapshot(START)[name].count


def _batch(version: int, rt_us: int, fb_us: int, n: int) -> bytes:
    builder = BatchBuilder()
    for i in range(n):
        builder.add(START - 1 + i / (10 * n), "canary", rt_us, 200, 0, fb_us)
    return builder.encode(version=version)


def test_batches_of_both_versions_in_one_read() -> None:
    window = fresh()
    old = decode_raw(_batch(1, 900_000, 10_000, 30))
    new = decode_raw(_batch(2, 900_000, 10_000, 70))
    window.record_many([old, new, old], START)
    snap = window.snapshot(START)["canary"]
    assert snap.count == 130 and snap.missing_first_byte == 60
    assert snap.first_byte is not None and snap.first_byte.count == 70
    assert snap.p50_ms == pytest.approx(900, rel=0.01)
    assert snap.first_byte.p50_ms == pytest.approx(10, rel=0.01)
    assert snap.above_threshold == 130 and snap.first_byte.above_threshold == 0
    assert window.counters.without_first_byte == 60


def test_only_old_batches_leave_the_first_byte_window_empty() -> None:
    window = fresh()
    window.record(decode_raw(_batch(1, 5_000, 5_000, 40)), START)
    snap = window.snapshot(START)["canary"]
    assert snap.count == 40 and snap.first_byte is not None and snap.first_byte.count == 0
    assert snap.for_latency("first_byte").count == 0
    assert snap.for_latency("total") is snap


def test_both_windows_slide_and_follow_the_threshold_together() -> None:
    window = fresh()
    window.record(decode_raw(_batch(2, 900_000, 10_000, 50)), START)
    window.reconfigure(WindowConfig(window_sec=20, threshold_ms=5.0), START)
    snap = window.snapshot(START)["canary"]
    assert snap.first_byte is not None
    assert not snap.threshold_exact and not snap.first_byte.threshold_exact
    later = window.snapshot(START + 25)["canary"]
    assert later.count == 0 and later.first_byte is not None and later.first_byte.count == 0


# what each read holds: every sample with a first byte (version 2 batches only), some,
# none (version 1 only), or first bytes equal to the totals
READ_KINDS = st.sampled_from(["all", "some", "none", "equal"])


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 2_000),
    kinds=st.lists(READ_KINDS, min_size=1, max_size=6),
)
def test_reads_of_either_version_in_any_order_keep_the_first_byte_window_exact(
    seed: int, n: int, kinds: list[str]
) -> None:
    # reads that share seconds: a second filled from version 2 reads shares its
    # reservoir keys and distinct units between the two rings, one that also took
    # version 1 samples does not, and either way the windows are the law's
    variant, ts, rt, outcome, unit, fb = columns(seed, n)
    rng = np.random.default_rng(seed + 2)
    reads = np.array_split(np.arange(n), len(kinds))
    known = np.zeros(n, dtype=bool)
    window = fresh()
    for kind, part in zip(kinds, reads, strict=True):
        if kind == "equal":
            fb[part] = rt[part]
        mine = (
            rng.random(part.shape[0]) < 0.5
            if kind == "some"
            else np.full(part.shape[0], kind != "none")
        )
        known[part] = mine
        window.ingest(
            variant[part], ts[part], rt[part], outcome[part], START, unit[part],
            fb_us=None if kind == "none" else fb[part],
            known=mine if kind == "some" else None,
        )  # fmt: skip
    total, by_first_byte = fresh(), fresh()
    total.ingest(variant, ts, rt, outcome, START, unit)
    keep = np.flatnonzero(known)
    by_first_byte.ingest(variant[keep], ts[keep], fb[keep], outcome[keep], START, unit[keep])
    got, want_total, want_fb = (w.snapshot(START) for w in (window, total, by_first_byte))
    for name, snap in got.items():
        assert_same(snap, want_total[name])
        assert snap.first_byte is not None
        assert_same(snap.first_byte, replace(want_fb[name], first_byte=None))
        assert snap.units == want_total[name].units
        assert snap.first_byte.units == want_fb[name].units
        in_variant = variant == (0 if name == "baseline" else 1)
        assert set(snap.first_byte.reservoir_ms) <= {
            float(v) / 1000 for v in fb[in_variant & known]
        }
        assert set(snap.reservoir_ms) <= {float(v) / 1000 for v in rt[in_variant]}
        assert len(snap.first_byte.reservoir_ms) == min(
            int(np.count_nonzero(in_variant & known)), len(want_fb[name].reservoir_ms)
        )
    assert window.counters.without_first_byte == n - keep.shape[0]
