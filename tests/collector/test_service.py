"""The collector loop on the in-process bus and on real Redis + etcd."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import redis.asyncio as redis_async

from controlplane.collector.second_partials import own_fields
from controlplane.collector.service import Collector
from controlplane.collector.sharding import read_merged_snapshots, unacked_elsewhere
from controlplane.kernel.clock import FakeClock, SystemClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.keys import EtcdKeys, RedisKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.streams_factory import open_streams

SERVICE = "payment-api"
EXPERIMENT = "42"


def make_batches(
    rt_us: np.ndarray, now: float, *, source: str = "sc-1", size: int = 512, first_seq: int = 1
) -> list[dict[str, bytes]]:
    batches = []
    for k, lo in enumerate(range(0, rt_us.shape[0], size)):
        builder = BatchBuilder()
        for i, rt in enumerate(rt_us[lo : lo + size]):
            builder.add(
                now, "canary" if i % 4 == 0 else "baseline", int(rt), 200 if rt < 900_000 else 503
            )
        meta = BatchMeta(EXPERIMENT, source, first_seq + k, len(builder))
        batches.append(entry_fields(meta, builder.encode()))
    return batches


async def memory_collector(**options: Any) -> tuple[Collector, Any, Any, FakeClock]:
    # (collector, streams, kv, clock): the caller stops and closes them
    """A collector on the in-process backends, the service's rule loaded."""
    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    keys = EtcdKeys("/t")
    await kv.put(
        keys.rule(SERVICE), b'{"service": "payment-api", "threshold_ms": 100, "window_sec": 30}'
    )
    collector = Collector(
        streams, board, kv, keys, consumer_name="c1", clock=clock, block_ms=0, **options
    )
    await collector.load_config()
    return collector, streams, kv, clock


@pytest.fixture
async def memory_setup() -> AsyncIterator[tuple[Collector, object, FakeClock]]:
    collector, streams, kv, clock = await memory_collector(claim_idle_ms=5000)
    yield collector, streams, clock
    await collector.stop_watching()
    await streams.close()
    await kv.close()


async def test_batches_are_applied_published_and_acked(memory_setup) -> None:  # type: ignore[no-untyped-def]
    collector, streams, clock = memory_setup
    rt = np.random.default_rng(1).lognormal(np.log(50_000), 1.0, 5_000).astype(np.uint32)
    await streams.append(SERVICE, make_batches(rt, clock.now()), maxlen=10_000)
    await collector.step()
    clock.advance(0.2)
    await collector.step()
    snaps = await read_merged_snapshots(streams, EXPERIMENT, clock.now())
    assert snaps["baseline"].count + snaps["canary"].count == rt.shape[0]
    assert snaps["baseline"].threshold_ms == 100
    fields = await streams.read(EXPERIMENT)
    assert "baseline" in fields and "canary" in fields
    assert await streams.pending(SERVICE, "collectors") == 0
    assert streams.decisions_length() >= 1


async def test_corrupt_entry_is_skipped_acked_and_counted(memory_setup) -> None:  # type: ignore[no-untyped-def]
    collector, streams, clock = memory_setup
    batches = make_batches(np.full(1_536, 1_000, np.uint32), clock.now())
    corrupt = dict(batches[1])
    corrupt["data"] = corrupt["data"][:-3] + b"xyz"
    await streams.append(SERVICE, [batches[0], corrupt, batches[2]], maxlen=100)
    await collector.step()
    clock.advance(0.2)
    await collector.step()
    snaps = await read_merged_snapshots(streams, EXPERIMENT, clock.now())
    assert sum(s.count for s in snaps.values()) == 1_024
    assert collector.metrics.corrupt._value.get() == 1
    assert await streams.pending(SERVICE, "collectors") == 0


async def test_redelivered_batch_is_not_counted_twice(memory_setup) -> None:  # type: ignore[no-untyped-def]
    collector, streams, clock = memory_setup
    batches = make_batches(np.full(1_024, 1_000, np.uint32), clock.now())
    await streams.append(SERVICE, batches, maxlen=100)
    # a resend the stream took again (its source's last seq expired, or a writer
    # that does not check): the collector still counts the batch once
    streams.add_raw(SERVICE, batches[0])
    await collector.step()
    clock.advance(0.2)
    await collector.step()
    snaps = await read_merged_snapshots(streams, EXPERIMENT, clock.now())
    assert sum(s.count for s in snaps.values()) == 1_024
    assert collector.metrics.duplicates._value.get() == 1


async def test_rule_changes_apply_live_and_malformed_rules_are_rejected(memory_setup) -> None:  # type: ignore[no-untyped-def]
    collector, streams, clock = memory_setup
    await streams.append(
        SERVICE, make_batches(np.full(512, 1_000, np.uint32), clock.now()), maxlen=100
    )
    await collector.step()
    kv = collector.kv
    await kv.put(collector.keys.rule(SERVICE), b"{not json")
    await kv.put(
        collector.keys.rule(SERVICE),
        b'{"service": "payment-api", "threshold_ms": 100, "window_sec": 5}',
    )
    for _ in range(50):
        clock.advance(0.2)
        await asyncio.sleep(0)  # let the watch task run: the bus answers without waiting
        await collector.step()
        if collector.windows[EXPERIMENT].config.window_sec == 5:
            break
    assert collector.windows[EXPERIMENT].config.window_sec == 5
    assert collector.metrics.config_rejected._value.get() == 1
    clock.advance(6)
    await collector.step()
    snaps = await read_merged_snapshots(streams, EXPERIMENT, clock.now())
    assert snaps["baseline"].count == 0 and snaps["baseline"].window_sec == 5


async def test_two_collectors_merge_exactly_and_a_dead_ones_entries_are_claimed_once() -> None:
    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    keys = EtcdKeys("/t")
    a = Collector(
        streams,
        board,
        kv,
        keys,
        consumer_name="a",
        clock=clock,
        block_ms=0,
        count=3,
        claim_idle_ms=1000,
    )
    b = Collector(
        streams,
        board,
        kv,
        keys,
        consumer_name="b",
        clock=clock,
        block_ms=0,
        count=3,
        claim_idle_ms=1000,
    )
    try:
        await streams.append(
            SERVICE, make_batches(np.full(512 * 12, 2_000, np.uint32), clock.now()), maxlen=100
        )
        for c in (a, b):
            await c.load_config()
            await c.step()  # discovery, claim, read 3 entries each
        clock.advance(0.2)
        await a.step()  # a publishes and acks its first entries, then reads 3 more …
        await a._claim()
        # … and "dies": 3 entries pending on it, of which none published; b goes on
        await a.publish(EXPERIMENT, clock.now())  # published but never acked: listed as unacked
        for _ in range(30):
            clock.advance(0.2)
            await b.step()
        snaps = await read_merged_snapshots(board, EXPERIMENT, clock.now())
        assert sum(s.count for s in snaps.values()) == 512 * 12
        assert await streams.pending(SERVICE, "collectors") == 0
    finally:
        for c in (a, b):
            await c.stop_watching()
        await streams.close()
        await kv.close()


@pytest.mark.real
async def test_real_redis_and_etcd_ingest_and_publish(
    redis_url: str, redis_namespace: str, etcd_endpoint: str, etcd_prefix: str
) -> None:
    clock = SystemClock()
    streams, board = open_streams(redis_url, namespace=redis_namespace)
    kv = open_kv(etcd_endpoint)
    keys = EtcdKeys(etcd_prefix)
    await kv.put(
        keys.rule(SERVICE), b'{"service": "payment-api", "threshold_ms": 100, "window_sec": 60}'
    )
    collector = Collector(
        streams, board, kv, keys, consumer_name="real-1", clock=clock, block_ms=20
    )
    try:
        await collector.load_config()
        rt = np.random.default_rng(2).lognormal(np.log(50_000), 1.0, 20_000).astype(np.uint32)
        batches = make_batches(rt, clock.now())
        corrupt = dict(batches[3])
        corrupt["data"] = b"garbage"
        corrupt["seq"] = str(len(batches) + 1).encode()  # a seq of its own: appended
        await streams.append(SERVICE, [*batches, corrupt], maxlen=10_000)
        # a resend from a writer that does not check seqs (XADD straight)
        raw = redis_async.Redis.from_url(redis_url)
        await raw.xadd(RedisKeys(redis_namespace).samples(SERVICE), batches[0])  # type: ignore[arg-type]
        await raw.aclose()
        expected = rt.shape[0]
        total = 0
        for _ in range(200):
            await collector.step()
            snaps = await read_merged_snapshots(board, EXPERIMENT, clock.now())
            total = sum(s.count for s in snaps.values())
            if total == expected and await streams.pending(SERVICE, "collectors") == 0:
                break
        assert total == expected
        assert collector.metrics.corrupt._value.get() == 1
        assert collector.metrics.duplicates._value.get() == 1
        merged = snaps["baseline"]
        baseline_rt = np.concatenate(
            [
                rt[lo : lo + 512][[i % 4 != 0 for i in range(len(rt[lo : lo + 512]))]]
                for lo in range(0, len(rt), 512)
            ]
        )
        exact = np.percentile(baseline_rt, 95, method="inverted_cdf") / 1000
        assert merged.p95_ms is not None and abs(merged.p95_ms - exact) / exact <= 0.01
        assert merged.above_threshold == int(np.count_nonzero(baseline_rt > 100_000))
    finally:
        await collector.stop_watching()
        await streams.close()
        await kv.close()


class _BoardDownOnce:
    """The real in-process board, unreachable for the first publish (an outage)."""

    def __init__(self, board: object) -> None:
        self._board = board
        self.failures = 1

    def __getattr__(self, name: str) -> object:
        return getattr(self._board, name)

    async def publish(self, *args: object, **kwargs: object) -> None:
        from controlplane.kernel.errors import BackendUnavailable

        if self.failures:
            self.failures -= 1
            raise BackendUnavailable("redis unavailable")
        await self._board.publish(*args, **kwargs)  # type: ignore[attr-defined]


async def test_entries_held_across_a_failed_publish_are_not_claimed_and_counted_twice() -> None:
    from controlplane.kernel.errors import BackendUnavailable

    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    flaky = _BoardDownOnce(board)
    kv = open_kv("memory://", clock=clock)
    keys = EtcdKeys("/t")
    a = Collector(
        streams,
        flaky,
        kv,
        keys,
        consumer_name="a",
        clock=clock,
        block_ms=0,  # type: ignore[arg-type]
        claim_idle_ms=1000,
    )
    b = Collector(
        streams, board, kv, keys, consumer_name="b", clock=clock, block_ms=0, claim_idle_ms=1000
    )
    try:
        await streams.append(
            SERVICE, make_batches(np.full(512 * 4, 2_000, np.uint32), clock.now()), maxlen=100
        )
        await a.load_config()
        with pytest.raises(BackendUnavailable):
            await a.step()  # reads every entry; Redis away when it publishes
        clock.advance(0.2)
        await a.publish(EXPERIMENT, clock.now())  # back: the partial counts every entry
        # a dies here; b claims whatever a left pending
        await b.load_config()
        for _ in range(30):
            clock.advance(0.2)
            await b.step()
        snaps = await read_merged_snapshots(board, EXPERIMENT, clock.now())
        assert sum(s.count for s in snaps.values()) == 512 * 4
        assert await streams.pending(SERVICE, "collectors") == 0
    finally:
        for c in (a, b):
            await c.stop_watching()
        await streams.close()
        await kv.close()


async def test_a_malformed_partial_is_a_codec_error_for_its_experiment_only() -> None:
    from controlplane.collector.sharding import PART_PREFIX, read_merged_snapshots
    from controlplane.kernel.errors import CodecError
    from controlplane.kernel.streams_memory import MemoryStreams

    board = MemoryStreams()
    bad = json.dumps({"v": 1, "ts": 1.0, "window_sec": 5, "variants": {"canary": {}}})
    await board.publish("7", {f"{PART_PREFIX}c1": bad}, {"experiment": "7"})
    with pytest.raises(CodecError, match="experiment 7"):
        await read_merged_snapshots(board, "7", 10.0)
    assert await read_merged_snapshots(board, "8", 10.0) == {}


async def test_the_partial_goes_out_with_every_publish_the_merged_view_every_few_seconds(
    memory_setup,  # type: ignore[no-untyped-def]
) -> None:
    from dataclasses import asdict

    from controlplane.collector.service import MERGED_EVERY_SEC

    collector, streams, clock = memory_setup
    rng = np.random.default_rng(5)
    seq = 1
    sent = 0

    async def send_and_publish(n: int) -> None:
        nonlocal seq, sent
        rt = rng.lognormal(np.log(50_000), 1.0, n).astype(np.uint32)
        batches = make_batches(rt, clock.now(), first_seq=seq)
        seq += len(batches)
        sent += n
        await streams.append(SERVICE, batches, maxlen=10_000)
        await collector.step()
        clock.advance(0.2)
        await collector.step()

    async def exact_count() -> int:
        snaps = await read_merged_snapshots(streams, EXPERIMENT, clock.now())
        return sum(s.count for s in snaps.values())

    await send_and_publish(1_000)  # the first publish carries the merged view
    first = await streams.read(EXPERIMENT)
    assert await exact_count() == sent
    assert streams.decisions_length() == 1
    merged = WindowSnapshot.from_json(first["canary"])
    # field by field, the same JSON as dataclasses.asdict gave (the snapshot's form)
    reference = asdict(merged) | {
        "reservoir_ms": list(merged.reservoir_ms),
        "reservoir_units": list(merged.reservoir_units),
        "units": merged.units.to_dict() if merged.units is not None else None,
        "first_byte": merged.first_byte.to_dict() if merged.first_byte is not None else None,
        "failure_ratio": merged.failure_ratio,
        "above_threshold_fraction": merged.above_threshold_fraction,
        "shed_share": merged.shed_share,
    }
    assert merged.units is not None and merged.first_byte is not None
    assert merged.to_dict() == reference
    assert merged.to_json() == first["canary"]

    # within MERGED_EVERY_SEC: each publish writes the partial (the controller's exact
    # read counts every sample at once), the plain view and the decisions stay
    for _ in range(3):
        await send_and_publish(500)
        fields = await streams.read(EXPERIMENT)
        assert await exact_count() == sent
        assert fields["canary"] == first["canary"] and fields["baseline"] == first["baseline"]
        assert streams.decisions_length() == 1
    assert collector.metrics.publishes._value.get() == 4

    clock.advance(MERGED_EVERY_SEC)
    await send_and_publish(500)
    fields = await streams.read(EXPERIMENT)
    assert streams.decisions_length() == 2
    plain = sum(WindowSnapshot.from_json(fields[v]).count for v in ("canary", "baseline"))
    assert plain == await exact_count() == sent


async def test_behind_its_streams_a_collector_publishes_partials_only_and_no_heartbeats() -> None:
    from controlplane.collector.service import HEARTBEAT_SEC

    collector, streams, kv, clock = await memory_collector(count=2)
    try:
        rt = np.full(64, 40_000, np.uint32)
        await streams.append(SERVICE, make_batches(rt, clock.now(), size=8), maxlen=100)
        await collector.step()  # discovery; a full read of 2 of the 8 entries
        clock.advance(0.2)
        await collector.step()  # another full read: behind, the partial alone
        fields = await streams.read(EXPERIMENT)
        # the partial alone: its head and its seconds (format 2)
        assert set(fields) == set(own_fields(fields, "@part:c1")) and "@part:c1" in fields
        assert streams.decisions_length() == 0
        for _ in range(3):
            clock.advance(0.2)
            await collector.step()  # full reads: each publish is the partial alone
            fields = await streams.read(EXPERIMENT)
            assert set(fields) == set(own_fields(fields, "@part:c1"))
        assert collector.metrics.publishes._value.get() == 4
        clock.advance(HEARTBEAT_SEC)
        await collector.step()  # an empty read: caught up, a heartbeat with the merged view
        assert collector.metrics.publishes._value.get() == 5
        fields = await streams.read(EXPERIMENT)
        assert {"canary", "baseline"} <= set(fields) and streams.decisions_length() == 1
        snaps = await read_merged_snapshots(streams, EXPERIMENT, clock.now())
        assert sum(s.count for s in snaps.values()) == 64
        assert await streams.pending(SERVICE, "collectors") == 0
    finally:
        await collector.stop_watching()
        await streams.close()
        await kv.close()


async def test_a_canary_that_turns_bad_raises_one_alarm_per_half_second(memory_setup) -> None:  # type: ignore[no-untyped-def]
    """Decision 0070: the collector screens each experiment it publishes and writes an
    alarm beside the partial; a healthy one raises none, a bad one at most one per
    ALARM_EVERY_SEC, and the metric says on what."""
    from controlplane.collector.service import ALARM_EVERY_SEC

    collector, streams, clock = memory_setup
    rng = np.random.default_rng(3)
    seq = 1

    async def second(bad: bool) -> None:
        nonlocal seq
        for _ in range(4):  # a batch and a publish every 0.25 s
            rt = rng.lognormal(np.log(20_000), 0.4, 40).astype(np.uint32)
            if bad:
                rt[::4] = 950_000  # every canary sample (one in four) fails
            await streams.append(SERVICE, make_batches(rt, clock.now(), first_seq=seq),
                                 maxlen=10_000)  # fmt: skip
            seq += 1
            await collector.step()
            clock.advance(0.25)

    for _ in range(12):
        await second(bad=False)
    assert await streams.alarms_since(-float("inf")) == ({}, 0)
    turned = clock.now()
    await second(bad=True)  # raised within the second it turned
    found, _ = await streams.alarms_since(-float("inf"))
    assert list(found) == [int(EXPERIMENT)] and found[int(EXPERIMENT)] >= turned
    await second(bad=True)
    raised = collector.metrics.alarms.labels("failures")._value.get()
    assert 1 <= raised <= 2 / ALARM_EVERY_SEC


async def test_an_experiment_that_raised_an_alarm_is_written_first(memory_setup) -> None:  # type: ignore[no-untyped-def]
    """Decision 0070: a tick's partials are written in chunks, an experiment that
    raised an alarm first, so its seconds and its alarm are on the board before the
    export of every other experiment is done."""
    collector, streams, clock = memory_setup
    rng = np.random.default_rng(5)
    experiments = ["7", "8", "9"]
    seqs = dict.fromkeys(experiments, 0)
    writes: list[list[str]] = []
    write_many = streams.write_many

    async def recorded(fields: Any) -> None:
        writes.append(list(fields))
        await write_many(fields)

    streams.write_many = recorded

    async def tick(bad: str | None) -> None:
        for experiment in experiments:
            builder = BatchBuilder()
            for i, rt in enumerate(rng.lognormal(np.log(20_000), 0.4, 40).astype(int)):
                canary = i % 4 == 0
                failing = canary and experiment == bad
                builder.add(clock.now(), "canary" if canary else "baseline", int(rt),
                            503 if failing else 200)  # fmt: skip
            seqs[experiment] += 1
            meta = BatchMeta(experiment, f"sc-{experiment}", seqs[experiment], len(builder))
            await streams.append(SERVICE, [entry_fields(meta, builder.encode())], maxlen=10_000)
        await collector.step()
        clock.advance(0.25)

    for _ in range(48):
        await tick(bad=None)
    writes.clear()
    while not (await streams.alarms_since(-float("inf")))[0]:
        assert len(writes) < 40, "no alarm raised"
        await tick(bad="9")
    # the tick that raised it wrote "9" alone, then the others
    raised_at = max(i for i, written in enumerate(writes) if written == ["9"])
    assert writes[raised_at + 1] == ["7", "8"]


@pytest.mark.parametrize(
    ("partial_format", "head_version"), [(None, 4), (4, 4), (3, 3), (2, 2), (1, 1)]
)
async def test_each_partial_format_is_written_and_read_back_whole(
    partial_format: int | None, head_version: int
) -> None:
    options = {} if partial_format is None else {"partial_format": partial_format}
    collector, streams, kv, clock = await memory_collector(**options)
    try:
        rt = np.random.default_rng(2).lognormal(np.log(50_000), 1.0, 2_000).astype(np.uint32)
        await streams.append(SERVICE, make_batches(rt, clock.now()), maxlen=10_000)
        await collector.step()
        clock.advance(0.2)
        await collector.step()
        fields = await streams.read(EXPERIMENT)
        assert json.loads(fields["@part:c1"])["v"] == head_version
        snaps = await read_merged_snapshots(streams, EXPERIMENT, clock.now())
        assert snaps["baseline"].count + snaps["canary"].count == rt.shape[0]
    finally:
        await collector.stop_watching()
        await streams.close()
        await kv.close()


def test_a_partial_format_other_than_1_to_4_is_refused() -> None:
    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    with pytest.raises(ValueError, match="1, 2, 3 or 4"):
        Collector(streams, board, kv, EtcdKeys("/t"), consumer_name="c1", clock=clock,
                  partial_format=5)  # fmt: skip


@pytest.mark.parametrize(
    "damaged",
    [
        {"v": 1, "ts": 1e12, "window_sec": 30, "variants": {"canary": {}}, "unacked": 5},
        {"v": 1, "ts": 1e12, "window_sec": 30, "variants": [], "unacked": [["x"]]},
        {"v": 1, "ts": 1e12, "window_sec": 30, "variants": {"canary": {"sec": ["a"]}},
         "unacked": "1-0"},
        # a format 3 head that does not read (before: skipped, and not counted)
        {"v": 3, "collector": "c9", "ts": 1e12, "cap": -1, "variants": {},
         "unacked": ["x-1"]},
    ],
)
async def test_another_collectors_damaged_partial_is_counted_and_stops_nothing(
    damaged: dict[str, Any], memory_setup,  # type: ignore[no-untyped-def]
) -> None:
    from controlplane.collector.sharding import PART_PREFIX

    collector, streams, clock = memory_setup
    await streams.publish(EXPERIMENT, {f"{PART_PREFIX}c9": json.dumps(damaged)},
                          {"experiment": EXPERIMENT})  # fmt: skip
    rt = np.random.default_rng(3).lognormal(np.log(50_000), 1.0, 1_000).astype(np.uint32)
    await streams.append(SERVICE, make_batches(rt, clock.now()), maxlen=10_000)
    await collector.step()  # the first publish of the experiment builds the merged view
    clock.advance(0.2)
    await collector.step()
    assert collector.metrics.malformed_partials._value.get() >= 1
    fields = await streams.read(EXPERIMENT)
    # the merged view holds this collector's window; its own partial went out whole
    assert WindowSnapshot.from_json(fields["baseline"]).count + WindowSnapshot.from_json(
        fields["canary"]
    ).count == rt.shape[0]
    assert json.loads(fields["@part:c1"])["v"] == 4
    assert await streams.pending(SERVICE, "collectors") == 0
    # a claimer reads the damaged field's unacked list as no list at all
    assert unacked_elsewhere(fields, own="c1") == frozenset()


@pytest.mark.parametrize(
    ("key", "value"), [("alpha", 1e-9), ("alpha", float("nan")), ("bins", 1e400)]
)
async def test_a_partial_naming_absurd_bins_is_a_codec_error_not_an_allocation(
    key: str, value: float
) -> None:
    from controlplane.collector.sharding import PART_PREFIX
    from controlplane.kernel.errors import CodecError
    from controlplane.kernel.streams_memory import MemoryStreams

    board = MemoryStreams()
    partial = {"v": 1, "ts": 1.0, "window_sec": 5, "alpha": 0.01, "bins": 1147,
               "variants": {"canary": {"sec": [], "count": [], "fail": [], "sum": [],
                                       "above": [], "stale": [], "hist": [],
                                       "res_k": "", "res_v": "", "res_s": ""}}}  # fmt: skip
    partial[key] = value
    await board.publish("7", {f"{PART_PREFIX}c1": json.dumps(partial)}, {"experiment": "7"})
    with pytest.raises(CodecError, match="experiment 7"):
        await read_merged_snapshots(board, "7", 10.0)
