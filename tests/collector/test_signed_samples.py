"""Signed sample batches end to end: reporter → Redis → collector, on real Redis.

With keys configured a collector counts only batches signed with one of them; the
rest is dropped under its reason, acked, and leaves the snapshot as it was.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis.asyncio as redis_async

from controlplane.collector.admin import serve_admin
from controlplane.collector.service import Collector
from controlplane.collector.sharding import read_merged_snapshots
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.keys import COLLECTOR_GROUP, EtcdKeys, RedisKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.sample_auth import SampleSigner
from controlplane.kernel.sample_keys import SampleKey, SampleKeys
from controlplane.kernel.streams_factory import open_streams
from sidecar.reporter import SampleReporter

SERVICE = "checkout"
EXPERIMENT = "42"
OLD = SampleKeys((SampleKey("2024-old", secrets.token_bytes(32)),))
NEW = SampleKeys((SampleKey("2025-new", secrets.token_bytes(32)),))
ROTATING = SampleKeys((NEW.current, OLD.current))  # new signs, both verify
Fields = dict[str, bytes]


@dataclass
class Bus:
    url: str
    namespace: str
    clock: FakeClock
    streams: Any
    board: Any
    client: redis_async.Redis

    def collector(self, keys: SampleKeys | None, name: str = "c1") -> Collector:
        kv = open_kv("memory://", clock=self.clock)
        return Collector(
            self.streams, self.board, kv, EtcdKeys("/t"), consumer_name=name,
            clock=self.clock, block_ms=0, sample_keys=keys,
        )  # fmt: skip

    def reporter(self, keys: SampleKeys | None, source: str) -> SampleReporter:
        signer = SampleSigner(keys) if keys is not None else None
        return SampleReporter(
            self.streams, SERVICE, clock=self.clock, source=source, signer=signer
        )

    async def xadd(self, fields: Fields) -> None:
        await self.client.xadd(RedisKeys(self.namespace).samples(SERVICE), fields)  # type: ignore[arg-type]


@pytest.fixture
async def bus(redis_url: str, redis_namespace: str) -> AsyncIterator[Bus]:
    clock = FakeClock()
    streams, board = open_streams(redis_url, namespace=redis_namespace, clock=clock)
    await streams.ensure_group(SERVICE, COLLECTOR_GROUP)
    client = redis_async.Redis.from_url(redis_url)
    yield Bus(redis_url, redis_namespace, clock, streams, board, client)
    await streams.close()
    await client.aclose()


def record(reporter: SampleReporter, clock: FakeClock, n: int, rt_us: int = 2_000) -> None:
    for i in range(n):
        reporter.record(clock.now() - 0.5, EXPERIMENT, "canary" if i % 2 else "baseline",
                        rt_us, 200, i)  # fmt: skip


async def drain(bus: Bus, collector: Collector) -> int:
    await collector.load_config()
    for _ in range(6):
        await collector.step()
        bus.clock.advance(0.2)
    await collector.stop_watching()
    snaps = await read_merged_snapshots(bus.board, EXPERIMENT, bus.clock.now())
    return sum(s.count for s in snaps.values())


def dropped(collector: Collector, reason: str) -> float:
    value: float = collector.metrics.dropped.labels(reason)._value.get()
    return value


def forged(clock: FakeClock, n: int = 50, rt_us: int = 9_000_000) -> Fields:
    """A well-formed batch of terrible latencies, as anyone with Redis access can write."""
    builder = BatchBuilder()
    for i in range(n):
        builder.add(clock.now() - 0.5, "canary", rt_us, 503, i)
    return entry_fields(BatchMeta(EXPERIMENT, "forger", 1, n), builder.encode())


@pytest.mark.real
async def test_signed_round_trip_counts_every_sample(bus: Bus) -> None:
    reporter = bus.reporter(OLD, "sc-1")
    record(reporter, bus.clock, 1_300)
    assert await reporter.flush()
    collector = bus.collector(OLD)
    assert await drain(bus, collector) == reporter.stats.samples_sent == 1_300
    assert collector.metrics.authenticated._value.get() == 1
    assert sum(dropped(collector, r) for r in ("unsigned", "bad_signature", "unknown_key")) == 0


@pytest.mark.real
async def test_unsigned_wrong_key_and_tampered_batches_are_dropped_and_counted(
    bus: Bus,
) -> None:
    good = bus.reporter(OLD, "sc-good")
    record(good, bus.clock, 200)
    assert await good.flush()
    unsigned = forged(bus.clock)
    same_kid_other_secret = SampleKeys((SampleKey(OLD.current.kid, NEW.current.secret),))
    wrong_key = SampleSigner(same_kid_other_secret).sign(SERVICE, forged(bus.clock))
    other_kid = SampleSigner(NEW).sign(SERVICE, forged(bus.clock))
    signed = SampleSigner(OLD).sign(SERVICE, {**forged(bus.clock), "src": b"sc-2"})
    flipped = bytearray(signed["data"])
    flipped[30] ^= 0x04
    tampered_payload = {**signed, "data": bytes(flipped)}
    tampered_experiment = {**signed, "exp": b"43"}
    unknown_kid = {**signed, "kid": b"nobody"}
    for fields in (
        unsigned, wrong_key, other_kid, tampered_payload, tampered_experiment, unknown_kid
    ):
        await bus.xadd(fields)
    collector = bus.collector(OLD)
    assert await drain(bus, collector) == 200  # only the reporter's batch
    assert dropped(collector, "unsigned") == 1
    assert dropped(collector, "bad_signature") == 3
    assert dropped(collector, "unknown_key") == 2
    assert await bus.streams.pending(SERVICE, COLLECTOR_GROUP) == 0
    assert "43" not in collector.windows  # the tampered experiment made no window


@pytest.mark.real
async def test_a_forged_unsigned_batch_does_not_move_the_snapshot(bus: Bus) -> None:
    reporter = bus.reporter(OLD, "sc-1")
    record(reporter, bus.clock, 400, rt_us=2_000)
    assert await reporter.flush()
    collector = bus.collector(OLD)
    await drain(bus, collector)
    before = await read_merged_snapshots(bus.board, EXPERIMENT, bus.clock.now())
    await bus.xadd(forged(bus.clock))  # 50 canary samples of 9 s, all 503
    await drain(bus, collector)
    after = await read_merged_snapshots(bus.board, EXPERIMENT, bus.clock.now())
    for variant in ("baseline", "canary"):
        assert (after[variant].count, after[variant].failures, after[variant].p99_ms) == (
            before[variant].count, before[variant].failures, before[variant].p99_ms,
        )  # fmt: skip
    assert dropped(collector, "unsigned") == 1
    # the same forgery is counted by a collector without keys: that is what keys prevent
    open_collector = bus.collector(None, name="c-open")
    await bus.xadd({**forged(bus.clock), "seq": b"2"})
    await drain(bus, open_collector)
    assert open_collector.windows[EXPERIMENT].counters.ingested == 50


@pytest.mark.real
async def test_rotation_old_kid_still_accepted_new_kid_signs(bus: Bus) -> None:
    late = bus.reporter(OLD, "sc-not-yet-rotated")
    rotated = bus.reporter(ROTATING, "sc-rotated")
    record(late, bus.clock, 300)
    record(rotated, bus.clock, 500)
    assert await late.flush() and await rotated.flush()
    entries = await bus.client.xrange(RedisKeys(bus.namespace).samples(SERVICE))
    assert {fields[b"kid"] for _, fields in entries} == {b"2024-old", b"2025-new"}
    collector = bus.collector(ROTATING)
    assert await drain(bus, collector) == 800
    # once the old key is retired, its batches are refused
    after = bus.collector(NEW, name="c-after")
    record(late, bus.clock, 100)
    assert await late.flush()
    await drain(bus, after)
    assert dropped(after, "unknown_key") == 1


async def test_readyz_and_metrics_say_when_samples_are_unauthenticated() -> None:
    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    for keys, body, gauge in ((None, "ready (samples unauthenticated)\n", 0.0),
                              (OLD, "ready\n", 1.0)):  # fmt: skip
        collector = Collector(streams, board, kv, EtcdKeys("/t"), consumer_name="c",
                              clock=clock, block_ms=0, sample_keys=keys)  # fmt: skip
        await collector.load_config()
        await collector.step()
        server = serve_admin(collector, "127.0.0.1", 0)
        port = server.port
        try:
            async with httpx.AsyncClient() as client:
                ready = await client.get(f"http://127.0.0.1:{port}/readyz")
                metrics = await client.get(f"http://127.0.0.1:{port}/metrics")
        finally:
            server.stop()
            await collector.stop_watching()
        assert ready.status_code == 200 and ready.text == body
        assert f"canary_collector_samples_authenticated {gauge}" in metrics.text
        assert 'canary_collector_batches_dropped_total{reason="bad_signature"} 0.0' in metrics.text
        assert OLD.current.secret.hex() not in metrics.text
    await streams.close()
    await kv.close()
