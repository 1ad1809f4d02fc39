"""No batch stops a collector: each poison class is dropped, counted under its reason,
acked, and the good batches of the same read are counted exactly.

Poison entries are written raw (redis-py XADD on real Redis, or the in-process bus)
between two good batches; the collector runs its loop (`step`, the body of `run`)
on a fake clock, so the batches' times are whatever the case says relative to it.
"""

from __future__ import annotations

import asyncio
import math
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as redis_async

from controlplane.collector.service import Collector
from controlplane.collector.sharding import read_merged_snapshots
from controlplane.kernel.clock import FakeClock, SystemClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.keys import COLLECTOR_GROUP, EtcdKeys, RedisKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.streams_factory import open_streams

SERVICE = "checkout"
EXPERIMENT = "42"
GOOD = 100  # samples per good batch
Fields = dict[str, bytes]


def good(
    clock_now: float, seq: int, *, variants: tuple[str, ...] = ("baseline", "canary")
) -> Fields:
    builder = BatchBuilder()
    for i in range(GOOD):
        builder.add(clock_now - 0.5 + i / 1000, variants[i % len(variants)], 2_000 + i, 200)
    return entry_fields(BatchMeta(EXPERIMENT, "sc-good", seq, GOOD), builder.encode())


def payload(
    now: float,
    *,
    t0: float | None = None,
    names: tuple[bytes, ...] = (b"baseline", b"canary"),
    n: int = 3,
    header_n: int | None = None,
    variant: int = 0,
    rt_us: int = 1_000,
    outcome: int = 200,
    version: int = 1,
    magic: bytes = b"CSB",
    first_byte_us: int | None = None,
) -> bytes:
    """A payload written byte for byte, with a valid checksum: a forger's batch."""
    table = b"".join(bytes([len(name)]) + name for name in names)
    body = struct.pack("<3sBIB", magic, version, n if header_n is None else header_n, len(names))
    body += table + struct.pack("<d", now if t0 is None else t0)
    body += struct.pack(f"<{n}I", *range(n))
    body += bytes([variant] * n)
    body += struct.pack(f"<{n}I", *([rt_us] * n))
    body += struct.pack(f"<{n}H", *([outcome] * n))
    body += struct.pack(f"<{n}I", *([0] * n))
    if first_byte_us is not None:  # the version 2 column
        body += struct.pack(f"<{n}I", *([first_byte_us] * n))
    return body + struct.pack("<I", zlib.crc32(body))


def entry(now: float, *, exp: bytes = b"42", n: bytes = b"3", **fields: bytes) -> Fields:
    base = {"v": b"1", "exp": exp, "src": b"sc-evil", "seq": b"1", "n": n, "data": payload(now)}
    base.update(fields)
    return base


@dataclass(frozen=True)
class Poison:
    reason: str
    build: Callable[[float], Fields]


POISON: dict[str, Poison] = {
    "t0 NaN": Poison("bad_timestamp", lambda now: entry(now, data=payload(now, t0=math.nan))),
    "t0 +inf": Poison("bad_timestamp", lambda now: entry(now, data=payload(now, t0=math.inf))),
    "t0 -inf": Poison("bad_timestamp", lambda now: entry(now, data=payload(now, t0=-math.inf))),
    "t0 negative": Poison("bad_timestamp", lambda now: entry(now, data=payload(now, t0=-5.0))),
    "t0 two days ago": Poison(
        "bad_timestamp", lambda now: entry(now, data=payload(now, t0=now - 2 * 86_400))
    ),
    "t0 a day ahead": Poison(
        "bad_timestamp", lambda now: entry(now, data=payload(now, t0=now + 86_400))
    ),
    "more samples than bytes": Poison(
        "bad_count", lambda now: entry(now, data=payload(now, header_n=1_000))
    ),
    "count 0": Poison("bad_count", lambda now: entry(now, n=b"0", data=payload(now, n=0))),
    "count huge": Poison(
        "bad_count",
        lambda now: entry(now, n=b"4000000000", data=payload(now, header_n=4_000_000_000)),
    ),
    "entry count differs": Poison("bad_count", lambda now: entry(now, n=b"4")),
    "unknown variant index": Poison(
        "bad_variant", lambda now: entry(now, data=payload(now, variant=7))
    ),
    "unprintable variant": Poison(
        "bad_variant", lambda now: entry(now, data=payload(now, names=(b"ca\x1bnary",)))
    ),
    "too many variants": Poison(
        "too_many_variants",
        lambda now: entry(now, data=payload(now, names=tuple(f"v{i}".encode() for i in range(40)))),
    ),
    "status 1017": Poison("bad_outcome", lambda now: entry(now, data=payload(now, outcome=1017))),
    "status 42": Poison("bad_outcome", lambda now: entry(now, data=payload(now, outcome=42))),
    "truncated": Poison("truncated", lambda now: entry(now, data=payload(now)[:10])),
    "cut short": Poison("bad_checksum", lambda now: entry(now, data=payload(now)[:-7])),
    "oversized": Poison("oversized", lambda now: entry(now, data=b"\0" * (2 * 1024 * 1024))),
    "payload version 4": Poison(
        "bad_version", lambda now: entry(now, data=payload(now, version=4))
    ),
    "a shed tally in a version 1 batch": Poison(
        "bad_outcome", lambda now: entry(now, data=payload(now, outcome=3))
    ),
    "a shed tally in a version 2 batch": Poison(
        "bad_outcome",
        lambda now: entry(now, v=b"2", data=payload(now, version=2, outcome=3, first_byte_us=10)),
    ),
    "payload version 2 in a version 1 entry": Poison(
        "bad_version", lambda now: entry(now, data=payload(now, version=2, first_byte_us=10))
    ),
    "first byte after the total": Poison(
        "bad_first_byte",
        lambda now: entry(now, v=b"2", data=payload(now, version=2, first_byte_us=1_001)),
    ),
    "version 2 without its first byte column": Poison(
        "bad_count", lambda now: entry(now, v=b"2", data=payload(now, version=2))
    ),
    "entry version 9": Poison("bad_version", lambda now: entry(now, v=b"9")),
    "bad magic": Poison("malformed", lambda now: entry(now, data=payload(now, magic=b"XYZ"))),
    "missing field": Poison(
        "malformed", lambda now: {k: v for k, v in entry(now).items() if k != "seq"}
    ),
    "seq with underscores": Poison("malformed", lambda now: entry(now, seq=b"1_0")),
    "experiment path": Poison("bad_experiment", lambda now: entry(now, exp=b"../../etc")),
    "experiment braces": Poison("bad_experiment", lambda now: entry(now, exp=b"x}{y")),
    "experiment 10 KB": Poison("bad_experiment", lambda now: entry(now, exp=b"e" * 10_240)),
    "experiment empty": Poison("bad_experiment", lambda now: entry(now, exp=b"")),
    "source 10 KB": Poison("bad_source", lambda now: entry(now, src=b"s" * 10_240)),
}


@dataclass
class Setup:
    collector: Collector
    streams: Any
    clock: FakeClock
    add_raw: Callable[[list[Fields]], Any]
    # real Redis: every stats key of the test's namespace (SCAN), and the one expected
    stats_keys: Callable[[], Any] | None = None
    expected_stats: str = ""


async def make_setup(
    backend: str, request: pytest.FixtureRequest, **collector_args: Any
) -> AsyncIterator[Setup]:
    clock = FakeClock()
    kv = open_kv("memory://", clock=clock)
    client: redis_async.Redis | None = None
    if backend == "memory":
        streams, board = open_streams("memory://", clock=clock)

        async def add_raw(batches: list[Fields]) -> None:
            # as a hostile writer would: around the append's seq check
            for batch in batches:
                streams.add_raw(SERVICE, batch)

        stats_keys = None
        expected_stats = ""
    else:
        url = request.getfixturevalue("redis_url")
        namespace = request.getfixturevalue("redis_namespace")
        streams, board = open_streams(url, namespace=namespace, clock=clock)
        client = redis_async.Redis.from_url(url)
        stream_key = RedisKeys(namespace).samples(SERVICE)

        async def add_raw(batches: list[Fields]) -> None:
            assert client is not None
            for fields in batches:  # raw XADD: nothing of ours in between
                await client.xadd(stream_key, fields)  # type: ignore[arg-type]

        async def stats_keys() -> list[str]:
            assert client is not None
            found = [k.decode() async for k in client.scan_iter(match=f"{namespace}:*")]
            return sorted(k for k in found if k.startswith(f"{namespace}:stats:"))

        expected_stats = RedisKeys(namespace).stats(EXPERIMENT)

    collector = Collector(
        streams, board, kv, EtcdKeys("/t"), consumer_name="c1", clock=clock, block_ms=0,
        **collector_args,
    )  # fmt: skip
    await collector.load_config()
    await streams.ensure_group(SERVICE, COLLECTOR_GROUP)
    try:
        yield Setup(collector, streams, clock, add_raw, stats_keys, expected_stats)
    finally:
        await collector.stop_watching()
        await streams.close()
        await kv.close()
        if client is not None:
            await client.aclose()


@pytest.fixture(params=["memory", "redis"])
async def setup(request: pytest.FixtureRequest) -> AsyncIterator[Setup]:
    async for made in make_setup(request.param, request):
        yield made


async def run_until_drained(setup: Setup, rounds: int = 6) -> None:
    for _ in range(rounds):
        await setup.collector.step()
        setup.clock.advance(0.2)


async def counted(setup: Setup) -> int:
    snaps = await read_merged_snapshots(setup.streams, EXPERIMENT, setup.clock.now())
    return sum(s.count for s in snaps.values())


def dropped(collector: Collector, reason: str) -> float:
    value: float = collector.metrics.dropped.labels(reason)._value.get()
    return value


@pytest.mark.parametrize("case", list(POISON))
async def test_poison_is_dropped_counted_and_acked_between_good_batches(
    setup: Setup, case: str
) -> None:
    poison = POISON[case]
    now = setup.clock.now()
    await setup.add_raw([good(now, 1), poison.build(now), good(now, 2)])
    await run_until_drained(setup)
    assert await counted(setup) == 2 * GOOD  # the good ones of the same read, exactly
    assert setup.collector.metrics.ingested._value.get() == 2 * GOOD
    assert dropped(setup.collector, poison.reason) == 1
    assert setup.collector.metrics.corrupt._value.get() == 1
    assert await setup.streams.pending(SERVICE, COLLECTOR_GROUP) == 0
    # still running: the next good batch is counted too
    await setup.add_raw([good(setup.clock.now(), 3)])
    await run_until_drained(setup)
    assert await counted(setup) == 3 * GOOD
    if setup.stats_keys is not None:  # no key made of a malformed experiment id
        assert await setup.stats_keys() == [setup.expected_stats]


async def test_every_poison_in_one_read_leaves_the_good_batches_exact(setup: Setup) -> None:
    now = setup.clock.now()
    batches: list[Fields] = []
    for seq, poison in enumerate(POISON.values(), start=1):
        batches += [good(now, seq), poison.build(now)]
    await setup.add_raw(batches)
    await run_until_drained(setup, rounds=10)
    assert await counted(setup) == len(POISON) * GOOD
    for reason in {p.reason for p in POISON.values()}:
        expected = sum(1 for p in POISON.values() if p.reason == reason)
        assert dropped(setup.collector, reason) == expected, reason
    assert await setup.streams.pending(SERVICE, COLLECTOR_GROUP) == 0


@pytest.mark.real
async def test_the_run_loop_survives_poison_on_real_redis(
    redis_url: str, redis_namespace: str
) -> None:
    """`run` itself (system clock, real Redis): poison in, the task still alive, good counted."""
    clock = SystemClock()
    streams, board = open_streams(redis_url, namespace=redis_namespace)
    kv = open_kv("memory://")
    client = redis_async.Redis.from_url(redis_url)
    collector = Collector(
        streams, board, kv, EtcdKeys("/t"), consumer_name="loop", clock=clock, block_ms=20
    )
    stop = asyncio.Event()
    try:
        await streams.ensure_group(SERVICE, COLLECTOR_GROUP)
        key = RedisKeys(redis_namespace).samples(SERVICE)
        now = clock.now()
        for seq, poison in enumerate(POISON.values(), start=1):
            await client.xadd(key, good(now, seq))  # type: ignore[arg-type]
            await client.xadd(key, poison.build(now))  # type: ignore[arg-type]
        task = asyncio.create_task(collector.run(stop))
        async with asyncio.timeout(20):
            while await streams.pending(SERVICE, COLLECTOR_GROUP) or collector.metrics.ingested._value.get() < len(POISON) * GOOD:  # noqa: E501
                assert not task.done(), task
                await asyncio.sleep(0.05)  # waiting for another task, not for time to pass
        assert not task.done()
        stop.set()
        await task  # returns cleanly: no poison raised out of the loop
        snaps = await read_merged_snapshots(board, EXPERIMENT, clock.now())
        assert sum(s.count for s in snaps.values()) == len(POISON) * GOOD
        assert sum(dropped(collector, p.reason) for p in POISON.values()) >= len(POISON)
    finally:
        stop.set()
        await streams.close()
        await kv.close()
        await client.aclose()
