"""The collector's read path: packed stream reads, raw batch views, prefetching."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.collector.service import Collector
from controlplane.collector.windows import ExperimentWindow, WindowConfig
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import (
    BatchBuilder,
    BatchMeta,
    CodecError,
    decode,
    decode_raw,
    entry_fields,
    parse_entry_raw,
)
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.streams_factory import open_streams
from controlplane.kernel.streams_redis import RedisStreams

START = 1_800_000_000.0
GROUP = "collectors"


def payload(
    rng: np.random.Generator,
    n: int,
    t0: float,
    names: tuple[str, ...] = ("baseline", "canary"),
    *,
    span: float = 0.9,
) -> bytes:
    builder = BatchBuilder()
    for i in range(n):
        builder.add(
            t0 + span * i / max(1, n),
            names[int(rng.integers(0, len(names)))],
            int(rng.lognormal(np.log(40_000), 1.0)),
            int(rng.choice([200, 200, 200, 503, 0, 2])),
        )
    return builder.encode()


def test_raw_views_decode_like_decode() -> None:
    raw_payload = payload(np.random.default_rng(1), 300, START)
    raw, owned = decode_raw(raw_payload), decode(raw_payload)
    assert raw.variants == owned.variants
    np.testing.assert_array_equal(raw.t0 + raw.dt_us.astype(np.float64) / 1e6, owned.ts)
    for name in ("variant", "rt_us", "outcome", "unit"):
        np.testing.assert_array_equal(getattr(raw, name), getattr(owned, name))
    with pytest.raises(CodecError):
        decode_raw(raw_payload[:-1] + bytes([raw_payload[-1] ^ 1]))
    fields = entry_fields(BatchMeta("e", "s", 1, 300), raw_payload)
    meta, batch = parse_entry_raw(fields)
    assert (meta.n, len(batch)) == (300, 300)


def test_raw_batches_give_the_snapshot_decoded_ones_give() -> None:
    """Concatenated raw views (several variant tables, several seconds) = one by one."""
    rng = np.random.default_rng(2)
    tables = [("baseline", "canary"), ("canary", "baseline"), ("canary",), ("a", "baseline")]
    payloads = [
        payload(rng, int(rng.integers(1, 700)), START - 5 + 0.4 * i, tables[i % 4])
        for i in range(24)
    ]
    config = WindowConfig(window_sec=30, threshold_ms=60.0)
    together = ExperimentWindow("e", config, clock_now=START, seed=1)
    together.record_many([decode_raw(p) for p in payloads], START)
    apart = ExperimentWindow("e", config, clock_now=START, seed=1)
    for p in payloads:
        apart.record(decode(p), START)
    got, want = together.snapshot(START), apart.snapshot(START)
    assert set(got) == set(want)
    for name, snap in want.items():
        for field in ("count", "failures", "above_threshold", "p50_ms", "p99_ms", "p999_ms"):
            assert getattr(got[name], field) == getattr(snap, field), (name, field)
        assert got[name].mean_ms == pytest.approx(snap.mean_ms, rel=1e-12)


def test_reservoir_of_large_reads_is_uniform() -> None:
    """Whole reads into fresh seconds (the sampled key path) keep a uniform sample."""
    window = ExperimentWindow("e", WindowConfig(window_sec=60), clock_now=START, seed=3)
    n = 60_000
    window._variant_index("v")  # ingest takes ring indices
    for second in range(40):
        ts = np.full(n, START - 45 + second + 0.5)
        rt = np.arange(n, dtype=np.uint32) + 1  # rank = value
        window.ingest(np.zeros(n, np.int64), ts, rt, np.full(n, 200, np.uint16), START)
    totals = window.totals("v", START)
    assert totals.count == 40 * n
    ranks = totals.res_us.astype(np.float64) / n
    assert ranks.shape[0] == 512
    assert 0.44 < float(ranks.mean()) < 0.56
    assert 0.20 < float(np.mean(ranks < 0.25)) < 0.30


async def test_reads_return_binary_entries_unchanged(redis_url: str, redis_namespace: str) -> None:
    streams = RedisStreams(redis_url, namespace=redis_namespace)
    try:
        await streams.ensure_group("pay", GROUP)
        await streams.ensure_group("cart", GROUP)
        big = bytes(range(256)) * 40  # binary, longer than the inline limit
        sent = [
            {"v": b"1", "data": big, "empty": b"", "n": b"7"},
            {"only": b"x" * 64},
            {"only": b"y" * 65},
        ]
        await streams.append("pay", sent, maxlen=100)
        await streams.append("cart", [{"data": b"\x00\r\n" * 50}], maxlen=100)
        got = await streams.read_group(["pay", "cart"], GROUP, "c1", count=10, block_ms=0)
        assert [(e.service, dict(e.fields)) for e in got] == [
            ("pay", sent[0]),
            ("pay", sent[1]),
            ("pay", sent[2]),
            ("cart", {"data": b"\x00\r\n" * 50}),
        ]
        assert await streams.read_group(["pay"], GROUP, "c1", count=10, block_ms=0) == []
    finally:
        await streams.close()


async def test_a_prefetched_read_is_applied_before_shutdown() -> None:
    clock = FakeClock(START)
    streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    collector = Collector(
        streams, board, kv, EtcdKeys("/t"), consumer_name="c1", clock=clock, block_ms=0, count=4
    )
    await collector.load_config()
    rng = np.random.default_rng(4)
    batches = [
        entry_fields(BatchMeta("x", "src", seq, 100), payload(rng, 100, clock.now() - 1))
        for seq in range(1, 11)
    ]
    await streams.ensure_group("svc", GROUP)
    await streams.append("svc", batches, maxlen=100)
    await collector.step()  # a full read: the next one is started before applying it
    assert collector._prefetch is not None
    await collector.flush()
    assert collector._prefetch is None
    assert collector.windows["x"].counters.ingested == 800
    assert await streams.pending("svc", GROUP) == 0
    await collector.stop_watching()
    await streams.close()
    await kv.close()


def test_a_filling_bucket_short_of_sampled_keys_draws_them_all() -> None:
    """If too few keys fall under a filling bucket's bound, every sample gets a key."""

    class NoHits:
        def __init__(self, rng: np.random.Generator) -> None:
            self._rng = rng

        def binomial(self, n: int, p: float) -> int:
            return 0

        def __getattr__(self, name: str) -> object:
            return getattr(self._rng, name)

    window = ExperimentWindow("e", WindowConfig(window_sec=60), clock_now=START, seed=5)
    window._rng = NoHits(window._rng)  # type: ignore[assignment]
    window._variant_index("v")
    n = 20_000
    rt = np.arange(n, dtype=np.uint32)
    window.ingest(
        np.zeros(n, np.int64), np.full(n, START - 1.5), rt, np.full(n, 200, np.uint16), START
    )
    ring = window.ring("v")
    slot = int(np.flatnonzero(ring.second == int(START) - 2)[0])
    assert int(ring.res_fill[slot]) == 64
