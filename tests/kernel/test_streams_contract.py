"""One contract for SampleStream and SnapshotBoard, run on Redis and on the in-process twin."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import redis.asyncio as redis_async

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.errors import BackendUnavailable, ConfigError
from controlplane.kernel.keys import COLLECTOR_GROUP, RedisKeys
from controlplane.kernel.streams import PendingSummary, SampleStream, SnapshotBoard
from controlplane.kernel.streams_factory import open_streams
from controlplane.kernel.streams_memory import MemoryStreams
from controlplane.kernel.streams_redis import RedisStreams
from tests.conftest import unique
from tests.support.processes import RedisProcess
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_sentinel import SentinelSet

GROUP = COLLECTOR_GROUP
LONG_IDLE_MS = 60_000


@dataclass
class Backend:
    """The adapter under test plus the few things only its backend can observe."""

    name: str
    stream: SampleStream
    board: SnapshotBoard
    clock: FakeClock | None
    raw: redis_async.Redis | redis_async.RedisCluster | None
    keys: RedisKeys

    async def length(self, service: str) -> int:
        if self.raw is not None:
            return int(await self.raw.xlen(self.keys.samples(service)))
        assert isinstance(self.stream, MemoryStreams)
        return self.stream.length(service)

    async def decisions_length(self) -> int:
        if self.raw is not None:
            return int(await self.raw.xlen(self.keys.decisions))
        assert isinstance(self.board, MemoryStreams)
        return self.board.decisions_length()

    def idle_threshold_after(self, idle_ms: int) -> int:
        """Let entries idle for idle_ms; return the min_idle_ms that now claims them.

        The memory bus runs on a FakeClock; Redis idles on its own clock, so there
        min_idle_ms=0 stands in for "idle long enough" without sleeping.
        """
        if self.clock is not None:
            self.clock.advance(idle_ms / 1000)
            return idle_ms
        return 0


@pytest.fixture(params=["redis", "memory", "redis-cluster", "redis-sentinel"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        clock = FakeClock()
        stream, board = open_streams("memory://", clock=clock)
        try:
            yield Backend("memory", stream, board, clock, None, RedisKeys())
        finally:
            await stream.close()
        return
    raw: redis_async.Redis | redis_async.RedisCluster
    if request.param == "redis-sentinel":
        sentinels: SentinelSet = request.getfixturevalue("redis_sentinel")
        namespace, url = unique("canary-test"), sentinels.url
        raw = redis_async.Redis(host="127.0.0.1", port=sentinels.primary_port())
    elif request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        namespace, url = unique("canary-test"), cluster.url
        raw = redis_async.RedisCluster(host="127.0.0.1", port=cluster.alive()[0].port)
    else:
        namespace = request.getfixturevalue("redis_namespace")
        url = request.getfixturevalue("redis_url")
        raw = redis_async.Redis.from_url(url)
    stream, board = open_streams(url, namespace=namespace)
    try:
        yield Backend(request.param, stream, board, None, raw, RedisKeys(namespace))
    finally:
        await raw.aclose()
        await stream.close()


def batch(n: int) -> dict[str, bytes]:
    return {"v": b"1", "exp": b"7", "src": b"sidecar-a", "seq": str(n).encode(), "data": b"x"}


async def test_appended_batches_are_read_through_a_group(backend: Backend) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    ids = await s.append("pay", [batch(1), batch(2), batch(3)], maxlen=1000)

    got = await s.read_group(["pay"], GROUP, "c1", count=10, block_ms=0)

    assert [e.entry_id for e in got] == ids
    assert [e.fields["seq"] for e in got] == [b"1", b"2", b"3"]
    assert {e.service for e in got} == {"pay"}
    assert all(e.deliveries == 1 for e in got)
    assert await s.pending("pay", GROUP) == 3


def sourced(source: str, seq: int) -> dict[str, bytes]:
    return {"src": source.encode(), "seq": str(seq).encode(), "payload": b"\x00"}


async def test_a_resent_batch_is_not_appended_twice(backend: Backend) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    first = await s.append("pay", [sourced("sc-1", 1), sourced("sc-1", 2)], maxlen=1000)
    # the reply to the first send was lost: the same batches again, then a new one
    again = await s.append(
        "pay", [sourced("sc-1", 1), sourced("sc-1", 2), sourced("sc-1", 3)], maxlen=1000
    )

    got = await s.read_group(["pay"], GROUP, "c1", count=10, block_ms=0)

    assert all(first) and again[:2] == ["", ""] and again[2]
    assert [(e.fields["src"], e.fields["seq"]) for e in got] == [
        (b"sc-1", b"1"), (b"sc-1", b"2"), (b"sc-1", b"3"),
    ]  # fmt: skip


async def test_seqs_are_per_source_and_per_stream(backend: Backend) -> None:
    s = backend.stream
    await s.append("pay", [sourced("sc-1", 10)], maxlen=1000)

    other_source = await s.append("pay", [sourced("sc-2", 1)], maxlen=1000)
    other_stream = await s.append("cart", [sourced("sc-1", 1)], maxlen=1000)
    older = await s.append("pay", [sourced("sc-1", 9)], maxlen=1000)

    assert other_source[0] and other_stream[0] and older == [""]
    assert await backend.length("pay") == 2


async def test_seqs_compare_exactly_beyond_double_precision(backend: Backend) -> None:
    s = backend.stream
    big = 10**18 + 1  # 2^53 < big: a float would call it equal to big + 1
    await s.append("pay", [sourced("sc-1", big)], maxlen=1000)

    assert (await s.append("pay", [sourced("sc-1", big + 1)], maxlen=1000))[0]
    assert await s.append("pay", [sourced("sc-1", big)], maxlen=1000) == [""]
    assert (await s.append("pay", [sourced("sc-1", 10**19 - 1)], maxlen=1000))[0]


async def test_entries_without_a_well_formed_source_are_appended_as_they_are(
    backend: Backend,
) -> None:
    s = backend.stream
    odd = {"src": b"{x}", "seq": b"1", "payload": b"\x00"}

    unsourced = {"seq": b"1", "payload": b"\x00"}

    ids = await s.append("pay", [odd, odd, unsourced, unsourced], maxlen=1000)

    assert all(ids) and await backend.length("pay") == 4


async def test_entry_ids_increase_within_a_stream(backend: Backend) -> None:
    first = await backend.stream.append("pay", [batch(1), batch(2)], maxlen=1000)
    second = await backend.stream.append("pay", [batch(3)], maxlen=1000)

    parsed = [tuple(int(part) for part in i.split("-")) for i in first + second]
    assert parsed == sorted(parsed)
    assert len(set(parsed)) == 3


async def test_ensure_group_is_idempotent_and_keeps_the_position(backend: Backend) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    await s.append("pay", [batch(1)], maxlen=1000)
    assert len(await s.read_group(["pay"], GROUP, "c1", count=10, block_ms=0)) == 1

    await s.ensure_group("pay", GROUP)

    assert await s.read_group(["pay"], GROUP, "c1", count=10, block_ms=0) == []


async def test_group_created_before_appends_sees_every_entry(backend: Backend) -> None:
    await backend.stream.ensure_group("pay", GROUP)
    assert await backend.stream.services() == ["pay"]
    await backend.stream.append("pay", [batch(1)], maxlen=1000)

    got = await backend.stream.read_group(["pay"], GROUP, "c1", count=10, block_ms=0)

    assert [e.fields["seq"] for e in got] == [b"1"]


async def test_one_read_spans_several_services(backend: Backend) -> None:
    s = backend.stream
    for service in ("pay", "cart"):
        await s.ensure_group(service, GROUP)
    await s.append("pay", [batch(1)], maxlen=1000)
    await s.append("cart", [batch(2), batch(3)], maxlen=1000)

    got = await s.read_group(["pay", "cart"], GROUP, "c1", count=10, block_ms=0)

    assert sorted((e.service, e.fields["seq"]) for e in got) == [
        ("cart", b"2"),
        ("cart", b"3"),
        ("pay", b"1"),
    ]


async def test_two_consumers_split_the_entries_without_overlap(backend: Backend) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    ids = await s.append("pay", [batch(n) for n in range(10)], maxlen=1000)

    first = await s.read_group(["pay"], GROUP, "c1", count=4, block_ms=0)
    second = await s.read_group(["pay"], GROUP, "c2", count=100, block_ms=0)
    third = await s.read_group(["pay"], GROUP, "c1", count=100, block_ms=0)

    assert len(first) == 4
    assert len(second) == 6
    assert third == []
    seen = [e.entry_id for e in first + second]
    assert sorted(seen) == sorted(ids)
    assert len(set(seen)) == len(ids)


async def test_unacked_entries_are_not_redelivered_but_claimable_once_idle(
    backend: Backend,
) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    ids = await s.append("pay", [batch(1), batch(2)], maxlen=1000)
    assert len(await s.read_group(["pay"], GROUP, "crashed", count=10, block_ms=0)) == 2

    assert await s.read_group(["pay"], GROUP, "c2", count=10, block_ms=0) == []
    assert await s.claim_idle("pay", GROUP, "c2", min_idle_ms=LONG_IDLE_MS, count=10) == []

    threshold = backend.idle_threshold_after(LONG_IDLE_MS)
    claimed = await s.claim_idle("pay", GROUP, "c2", min_idle_ms=threshold, count=10)

    assert [e.entry_id for e in claimed] == ids
    assert [e.fields["seq"] for e in claimed] == [b"1", b"2"]
    assert all(e.deliveries == 2 for e in claimed)
    assert all(e.service == "pay" for e in claimed)
    assert await s.pending("pay", GROUP) == 2


async def test_a_claim_resets_the_idle_time_and_counts_the_delivery(backend: Backend) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    await s.append("pay", [batch(1)], maxlen=1000)
    await s.read_group(["pay"], GROUP, "crashed", count=10, block_ms=0)
    threshold = backend.idle_threshold_after(LONG_IDLE_MS)
    assert len(await s.claim_idle("pay", GROUP, "c2", min_idle_ms=threshold, count=10)) == 1

    assert await s.claim_idle("pay", GROUP, "c3", min_idle_ms=LONG_IDLE_MS, count=10) == []

    threshold = backend.idle_threshold_after(LONG_IDLE_MS)
    again = await s.claim_idle("pay", GROUP, "c3", min_idle_ms=threshold, count=10)
    assert [e.deliveries for e in again] == [3]


async def test_claim_takes_at_most_count_entries(backend: Backend) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    await s.append("pay", [batch(n) for n in range(5)], maxlen=1000)
    await s.read_group(["pay"], GROUP, "crashed", count=10, block_ms=0)
    threshold = backend.idle_threshold_after(LONG_IDLE_MS)

    claimed = await s.claim_idle("pay", GROUP, "c2", min_idle_ms=threshold, count=3)

    assert [e.fields["seq"] for e in claimed] == [b"0", b"1", b"2"]


async def test_acked_entries_are_neither_pending_nor_claimable(backend: Backend) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    await s.append("pay", [batch(1), batch(2)], maxlen=1000)
    got = await s.read_group(["pay"], GROUP, "c1", count=10, block_ms=0)

    assert await s.ack("pay", GROUP, [got[0].entry_id]) == 1
    assert await s.ack("pay", GROUP, [got[0].entry_id]) == 0
    assert await s.pending("pay", GROUP) == 1

    threshold = backend.idle_threshold_after(LONG_IDLE_MS)
    claimed = await s.claim_idle("pay", GROUP, "c2", min_idle_ms=threshold, count=10)
    assert [e.entry_id for e in claimed] == [got[1].entry_id]

    assert await s.ack("pay", GROUP, [got[1].entry_id]) == 1
    assert await s.pending("pay", GROUP) == 0
    assert await s.claim_idle("pay", GROUP, "c3", min_idle_ms=0, count=10) == []


async def test_approximate_trimming_keeps_the_stream_bounded(backend: Backend) -> None:
    for start in range(0, 2000, 200):
        await backend.stream.append(
            "pay", [batch(n) for n in range(start, start + 200)], maxlen=100
        )

    length = await backend.length("pay")

    assert 100 <= length < 400


async def test_binary_payloads_round_trip_unchanged(backend: Backend) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    payloads = [bytes(range(256)), b"", b"\x00\r\n\xff" * 1000, "ü€".encode()]
    await s.append("pay", [{"v": b"1", "data": p} for p in payloads], maxlen=1000)

    got = await s.read_group(["pay"], GROUP, "c1", count=10, block_ms=0)

    assert [e.fields["data"] for e in got] == payloads
    assert all(isinstance(name, str) for e in got for name in e.fields)


async def test_services_lists_every_samples_stream(backend: Backend) -> None:
    assert await backend.stream.services() == []
    await backend.stream.append("pay", [batch(1)], maxlen=10)
    await backend.stream.append("cart-api", [batch(1)], maxlen=10)
    await backend.stream.ensure_group("search", GROUP)
    await backend.board.publish("7", {"canary": "{}"}, {"exp": "7"})

    assert await backend.stream.services() == ["cart-api", "pay", "search"]


async def test_blocking_read_returns_empty_after_block_ms(backend: Backend) -> None:
    await backend.stream.ensure_group("pay", GROUP)

    got = await backend.stream.read_group(["pay"], GROUP, "c1", count=10, block_ms=50)

    assert got == []


async def test_blocking_read_wakes_up_on_append(backend: Backend) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    reader = asyncio.create_task(
        s.read_group(["pay"], GROUP, "c1", count=10, block_ms=10_000)
    )
    await asyncio.sleep(0.05)  # let the reader block before the append
    await s.append("pay", [batch(1)], maxlen=10)

    got = await asyncio.wait_for(reader, timeout=10)

    assert [e.fields["seq"] for e in got] == [b"1"]


async def test_read_recreates_a_group_whose_stream_vanished(backend: Backend) -> None:
    s = backend.stream
    await s.ensure_group("pay", GROUP)
    if backend.raw is not None:
        await backend.raw.delete(backend.keys.samples("pay"))
    else:
        assert isinstance(s, MemoryStreams)
        s._streams.clear()

    assert await s.read_group(["pay"], GROUP, "c1", count=10, block_ms=0) == []
    await s.append("pay", [batch(1)], maxlen=10)
    got = await s.read_group(["pay"], GROUP, "c1", count=10, block_ms=0)

    assert [e.fields["seq"] for e in got] == [b"1"]


async def test_snapshot_board_publish_and_read(backend: Backend) -> None:
    b = backend.board
    assert await b.read("7") == {}
    canary = json.dumps({"count": 120, "failures": 3, "p95_ms": 412.5})
    baseline = json.dumps({"count": 2400, "failures": 10, "p95_ms": 300.0})

    await b.publish("7", {"canary": canary, "baseline": baseline}, {"exp": "7", "kind": "snap"})
    newer = json.dumps({"count": 130, "failures": 3, "p95_ms": 420.0})
    await b.publish("7", {"canary": newer}, {"exp": "7", "kind": "snap"})

    assert await b.read("7") == {"canary": newer, "baseline": baseline}
    assert await b.read("8") == {}
    assert await backend.decisions_length() == 2


async def test_read_many_answers_each_experiments_hash_in_the_order_asked(
    backend: Backend,
) -> None:
    b = backend.board
    assert await b.read_many([]) == []
    await b.publish("7", {"canary": "{\"n\":7}"}, {"exp": "7"})
    await b.publish("9", {"canary": "{\"n\":9}", "@part:c1": "{}"}, {"exp": "9"})

    many = await b.read_many(["9", "8", "7"])
    assert many == [await b.read("9"), {}, await b.read("7")]
    assert many[0] == {"canary": '{"n":9}', "@part:c1": "{}"}


async def test_remove_if_unchanged_deletes_only_fields_still_holding_the_read_value(
    backend: Backend,
) -> None:
    b = backend.board
    big = json.dumps({"hist": "é" * 40_000})
    await b.publish("7", {"@part:a": big, "@part:b": "old-b", "canary": "{}"}, {"exp": "7"})
    await b.publish("7", {"@part:b": "new-b"}, {"exp": "7"})  # its owner wrote it again

    removed = await b.remove_if_unchanged(
        "7", {"@part:a": big, "@part:b": "old-b", "@part:never": "x"}
    )

    assert removed == ["@part:a"]
    assert await b.read("7") == {"@part:b": "new-b", "canary": "{}"}
    assert await b.remove_if_unchanged("7", {"@part:a": big}) == []
    assert await b.remove_if_unchanged("7", {}) == []
    assert await b.remove_if_unchanged("8", {"@part:b": "new-b"}) == []
    assert await b.read("7") == {"@part:b": "new-b", "canary": "{}"}


async def test_removing_the_last_fields_leaves_an_empty_hash(backend: Backend) -> None:
    b = backend.board
    await b.publish("7", {"@part:a": "a", "@part:b": "b"}, {"exp": "7"})

    assert sorted(await b.remove_if_unchanged("7", {"@part:a": "a", "@part:b": "b"})) == [
        "@part:a",
        "@part:b",
    ]
    assert await b.read("7") == {}
    await b.publish("7", {"@part:a": "again"}, {"exp": "7"})
    assert await b.read("7") == {"@part:a": "again"}


async def test_publish_refuses_an_empty_decision(backend: Backend) -> None:
    with pytest.raises(ValueError):
        await backend.board.publish("7", {"canary": "{}"}, {})


async def test_recent_decisions_are_the_newest_entries_newest_first(backend: Backend) -> None:
    b = backend.board
    assert await b.recent_decisions(10) == []
    for n in range(5):
        await b.publish(str(n % 2), {}, {"experiment": str(n % 2), "ts": str(n), "v": "é"})

    newest = await b.recent_decisions(3)

    assert newest == [
        {"experiment": "0", "ts": "4", "v": "é"},
        {"experiment": "1", "ts": "3", "v": "é"},
        {"experiment": "0", "ts": "2", "v": "é"},
    ]
    assert [e["ts"] for e in await b.recent_decisions(100)] == ["4", "3", "2", "1", "0"]
    assert await b.recent_decisions(0) == []


async def test_close_twice_is_harmless(backend: Backend) -> None:
    await backend.stream.close()
    await backend.board.close()


@pytest.mark.parametrize("url", ["", "etcd://127.0.0.1:2379", "memory", "redis:/x", "http://h"])
def test_factory_rejects_other_urls(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_streams(url)
    assert "\n" not in str(info.value)


async def test_factory_shares_one_object_per_url() -> None:
    stream, board = open_streams("memory://")
    assert id(stream) == id(board)
    assert isinstance(stream, MemoryStreams)
    other, _ = open_streams("memory://")
    assert other is not stream
    await stream.close()
    await other.close()


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    process = RedisProcess()
    process.start()
    try:
        yield process
    finally:
        process.close()


async def test_redis_down_raises_backend_unavailable_and_recovers(
    own_redis: RedisProcess,
) -> None:
    streams = RedisStreams(own_redis.url, namespace="fault")
    try:
        await streams.ensure_group("pay", GROUP)
        assert len(await streams.append("pay", [batch(1)], maxlen=10)) == 1
        assert await streams.remove_if_unchanged("7", {"canary": "{}"}) == []  # script cached

        own_redis.stop()
        with pytest.raises(BackendUnavailable):
            await streams.append("pay", [batch(2)], maxlen=10)
        with pytest.raises(BackendUnavailable):
            await streams.read_group(["pay"], GROUP, "c1", count=10, block_ms=50)
        with pytest.raises(BackendUnavailable):
            await streams.publish("7", {"canary": "{}"}, {"exp": "7"})
        with pytest.raises(BackendUnavailable):
            await streams.remove_if_unchanged("7", {"canary": "{}"})

        own_redis.start()
        assert len(await streams.append("pay", [batch(3)], maxlen=10)) == 1
        # The restarted server kept nothing (no persistence): the group comes back
        # with the next read instead of failing it.
        got = await streams.read_group(["pay"], GROUP, "c1", count=10, block_ms=0)
        assert [e.fields["seq"] for e in got] == [b"3"]
        # the restarted server lost the script cache too: it is loaded again
        await streams.publish("7", {"canary": "{}"}, {"exp": "7"})
        assert await streams.remove_if_unchanged("7", {"canary": "{}"}) == ["canary"]
    finally:
        await streams.close()



async def test_write_many_sets_each_experiments_fields_with_no_decision_entry(
    backend: Backend,
) -> None:
    b = backend.board
    await b.write_many({})
    await b.publish("7", {"@part:c1": "a", "canary": "{}"}, {"exp": "7"})
    await b.write_many({"7": {"@part:c1": "b"}, "9": {"@part:c1": "c", "@part:c2": "d"}, "8": {}})
    assert await b.read_many(["7", "8", "9"]) == [
        {"@part:c1": "b", "canary": "{}"}, {}, {"@part:c1": "c", "@part:c2": "d"},
    ]
    assert await backend.decisions_length() == 1


async def test_ack_many_acks_each_services_entries(backend: Backend) -> None:
    s = backend.stream
    for service in ("pay", "cart"):
        await s.ensure_group(service, GROUP)
        await s.append(service, [batch(1), batch(2)], maxlen=10)
    pay = await s.read_group(["pay"], GROUP, "c1", count=10, block_ms=0)
    cart = await s.read_group(["cart"], GROUP, "c1", count=10, block_ms=0)
    assert await s.ack_many(GROUP, {}) == 0
    acked = await s.ack_many(
        GROUP, {"pay": [e.entry_id for e in pay], "cart": [cart[0].entry_id], "none": ["1-0"]}
    )
    assert acked == 3
    assert await s.pending("pay", GROUP) == 0
    assert await s.pending("cart", GROUP) == 1


async def test_pending_many_counts_each_streams_pending_and_says_which_are_idle(
    backend: Backend,
) -> None:
    s = backend.stream
    for service in ("pay", "cart", "quiet"):
        await s.ensure_group(service, GROUP)
    await s.append("pay", [batch(1), batch(2)], maxlen=10)
    await s.append("cart", [batch(1)], maxlen=10)
    got = await s.read_group(["pay", "cart"], GROUP, "c1", count=10, block_ms=0)
    await s.ack("cart", GROUP, [e.entry_id for e in got if e.service == "cart"])
    assert await s.pending_many(GROUP, [], min_idle_ms=0) == {}

    fresh = await s.pending_many(GROUP, ["pay", "cart", "quiet", "none"],
                                 min_idle_ms=LONG_IDLE_MS)  # fmt: skip
    assert fresh == {
        "pay": PendingSummary(2, idle=False),
        "cart": PendingSummary(0, idle=False),
        "quiet": PendingSummary(0, idle=False),
        "none": PendingSummary(0, idle=False),  # no stream, no group: nothing pending
    }
    threshold = backend.idle_threshold_after(LONG_IDLE_MS)
    idle = await s.pending_many(GROUP, ["pay", "cart"], min_idle_ms=threshold)
    assert idle == {"pay": PendingSummary(2, idle=True), "cart": PendingSummary(0, idle=False)}


async def test_route_reports_are_read_back_newest_first_and_old_ones_forgotten(
    backend: Backend,
) -> None:
    from controlplane.kernel.route_reports import FORGET_SEC, RouteReports

    assert isinstance(backend.board, RouteReports)
    reports = backend.board
    now = 1_800_000_000.0
    await reports.report_route("pay", "sc-1", 3, now - FORGET_SEC - 1)  # gone
    await reports.report_route("pay", "sc-2", 4, now - 5)
    await reports.report_route("pay", "sc-2", 5, now)
    await reports.report_route("other", "sc-3", 9, now)
    got = await reports.route_reports("pay")
    # the sc-1 report was older than FORGET_SEC when sc-2 reported: removed
    assert [(r.instance, r.revision, r.seen_at) for r in got] == [
        ("sc-2", 5, now), ("sc-2", 4, now - 5),
    ]
    assert await reports.route_reports("nobody") == []


async def test_a_route_report_dated_ahead_is_forgotten_by_the_next_writer(
    backend: Backend,
) -> None:
    from controlplane.kernel.route_reports import CLOCK_SKEW_SEC, RouteReports

    assert isinstance(backend.board, RouteReports)
    reports = backend.board
    now = 1_800_000_000.0
    # a reporter whose clock runs a day ahead, then an honest one
    await reports.report_route("pay", "sc-ahead", 3, now + 86_400)
    await reports.report_route("pay", "sc-1", 4, now + CLOCK_SKEW_SEC - 1)
    await reports.report_route("pay", "sc-2", 4, now)
    got = await reports.route_reports("pay")
    assert sorted(r.instance for r in got) == ["sc-1", "sc-2"]


async def test_malformed_route_report_members_are_dropped(backend: Backend) -> None:
    from controlplane.kernel.route_reports import RouteReports

    if backend.raw is None:
        pytest.skip("only a Redis writer can put bytes the reporter never wrote")
    assert isinstance(backend.board, RouteReports)
    key = backend.keys.route_reports("pay")
    await backend.raw.zadd(key, {"no-revision": 1_800_000_000.0, "x@-1": 1_800_000_000.0,
                                 b"\xff@3": 1_800_000_000.0, "ok@7": 1_800_000_000.0})
    got = await backend.board.route_reports("pay")
    assert [(r.instance, r.revision) for r in got] == [("ok", 7)]


# --- Alarms (decision 0070) ------------------------------------------------------------


async def test_alarms_are_read_newest_after_a_time_and_move_only_forward(
    backend: Backend,
) -> None:
    from controlplane.kernel.alarms import KEEP_SEC, Alarms

    assert isinstance(backend.board, Alarms)
    alarms = backend.board
    now = 1_800_000_000.0
    await alarms.raise_alarms({"7": now - KEEP_SEC - 1}, now - KEEP_SEC - 1)
    await alarms.raise_alarms({"1": now - 2.0, "2": now - 1.0}, now)  # 7 is too old now
    await alarms.raise_alarms({"1": now - 5.0}, now)  # an older alarm never moves it back
    assert await alarms.alarms_since(-float("inf")) == ({1: now - 2.0, 2: now - 1.0}, 0)
    assert await alarms.alarms_since(now - 1.5) == ({2: now - 1.0}, 0)
    await alarms.raise_alarms({"1": now}, now)
    assert await alarms.alarms_since(now - 1.5) == ({1: now, 2: now - 1.0}, 0)
    await alarms.raise_alarms({}, now)  # nothing to raise: no write, no error
    assert await alarms.alarms_since(now) == ({}, 0)


async def test_an_alarm_dated_ahead_is_forgotten_by_the_next_writer(backend: Backend) -> None:
    from controlplane.kernel.alarms import CLOCK_SKEW_SEC, Alarms

    assert isinstance(backend.board, Alarms)
    now = 1_800_000_000.0
    # a collector whose clock runs a day ahead would hold the alarm "new" for a day
    await backend.board.raise_alarms({"9": now + 86_400}, now + 86_400)
    await backend.board.raise_alarms({"3": now + CLOCK_SKEW_SEC - 1, "4": now}, now)
    found, dropped = await backend.board.alarms_since(now - 60)
    assert found == {3: now + CLOCK_SKEW_SEC - 1, 4: now} and dropped == 0


async def test_alarms_no_collector_wrote_are_dropped_and_counted(backend: Backend) -> None:
    from controlplane.kernel.alarms import MAX_READ, Alarms

    assert isinstance(backend.board, Alarms)
    now = 1_800_000_000.0
    # ids a stats key allows but no numbered experiment has ("abc", "1e5", "٣": not
    # ASCII digits), and a number too long for a row id
    forged = {"not an id": now, "1{2}": now, "-3": now, "5": 0.0, "abc": now, "1e5": now,
              "\u0663": now, "9" * 19: now}
    if backend.raw is not None:
        await backend.raw.zadd(backend.keys.alarms, {**forged, b"\xff\xfe": now, "8": now})
    else:
        assert isinstance(backend.board, MemoryStreams)
        for member, at in {**forged, "8": now}.items():
            backend.board.add_raw_alarm(member, at)
    found, dropped = await backend.board.alarms_since(-float("inf"))
    assert found == {8: now}
    assert dropped == len(forged) + (1 if backend.raw is not None else 0)  # and the bytes
    # however many were written, a read takes at most MAX_READ, the newest
    await backend.board.raise_alarms({str(i): now + i / 1e4 for i in range(MAX_READ + 50)}, now)
    found, _ = await backend.board.alarms_since(now)
    assert len(found) == MAX_READ and min(found) == 50
