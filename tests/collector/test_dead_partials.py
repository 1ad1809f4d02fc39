"""Dead collectors' partial windows leave the stats hash once out of every window.

The decision (`expired_partials`) is a pure function, tested as a table; the removal
runs in a live collector's publish, on the in-process bus and on real Redis.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from controlplane.collector.second_partials import own_fields
from controlplane.collector.service import MERGED_EVERY_SEC, Collector
from controlplane.collector.sharding import (
    EXPIRY_MARGIN_SEC,
    Partial,
    expired_partials,
    export_partial,
    last_second,
    merge_snapshots,
    parse_partials,
    part_field,
    read_merged_snapshots,
)
from controlplane.collector.windows import MAX_WINDOW_SEC, ExperimentWindow, WindowConfig
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.streams import SampleStream, SnapshotBoard
from controlplane.kernel.streams_factory import open_streams
from tests.collector.test_service import EXPERIMENT, SERVICE, make_batches
from tests.collector.test_windows import batch

NOW = 1_800_000_100.5
WINDOW_SEC = 30
# what a collector's ring holds for a 30 s rule: the window, ceil(skew 2 s) and 2
RETAINED_SEC = WINDOW_SEC + 2 + 2
HORIZON = math.floor(NOW) - RETAINED_SEC - EXPIRY_MARGIN_SEC  # last seconds below it: dead


def partial(
    collector: str,
    seconds: list[int],
    *,
    ts: float | None = None,
    window_sec: Any = WINDOW_SEC,
) -> Partial:
    """A partial as parse_partials returns it (only what the decision reads)."""
    if ts is None:
        ts = float(max(seconds)) if seconds else NOW
    return Partial(
        collector,
        {
            "v": 1,
            "collector": collector,
            "ts": ts,
            "window_sec": window_sec,
            "variants": {"canary": {"sec": seconds}, "baseline": {"sec": []}},
        },
    )


def expired_names(partials: list[Partial], *, own: str = "live") -> list[str]:
    return [
        p.collector for p in expired_partials(partials, NOW, own=own, retained_sec=RETAINED_SEC)
    ]


# --- the decision, pure ------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "dead", "expired"),
    [
        ("newest second one below the horizon", partial("d", [HORIZON - 3, HORIZON - 1]), True),
        ("newest second on the horizon", partial("d", [HORIZON - 3, HORIZON]), False),
        ("newest second inside the window", partial("d", [math.floor(NOW) - 5]), False),
        ("out of the window, within the margin", partial("d", [HORIZON + 2]), False),
        ("no bucket left, published long ago", partial("d", [], ts=HORIZON - 0.5), True),
        ("no bucket left, published recently", partial("d", [], ts=NOW - 4), False),
        ("old buckets, published recently", partial("d", [HORIZON - 9], ts=NOW - 1), False),
        ("its own rule was longer", partial("d", [HORIZON - 1], window_sec=300), False),
        ("its window_sec unreadable", partial("d", [HORIZON - 1], window_sec="300"), True),
    ],
)
def test_a_partial_expires_once_its_newest_second_is_below_the_horizon(
    case: str, dead: Partial, expired: bool
) -> None:
    assert expired_names([partial("live", [math.floor(NOW)]), dead]) == (
        ["d"] if expired else []
    ), case


def test_the_horizon_is_the_longest_window_retained_plus_the_margin() -> None:
    assert math.floor(NOW) - 39 == HORIZON
    assert last_second(partial("d", [HORIZON - 1, HORIZON - 7])) == HORIZON - 1
    assert last_second(partial("d", [], ts=NOW)) == math.floor(NOW)


def test_a_longer_rule_seen_by_another_collector_keeps_the_partial() -> None:
    dead = partial("d", [HORIZON - 100])
    longer = partial("other", [math.floor(NOW)], window_sec=300)

    assert expired_names([dead]) == ["d"]
    assert expired_names([dead, longer]) == []


def test_an_absurd_window_in_a_partial_is_capped_at_the_longest_rule() -> None:
    now_second = math.floor(NOW)
    horizon = now_second - MAX_WINDOW_SEC - EXPIRY_MARGIN_SEC
    huge = partial("huge", [now_second], window_sec=10**9)

    assert expired_names([huge, partial("d", [horizon])]) == []
    assert expired_names([huge, partial("d", [horizon - 1])]) == ["d"]


def test_the_own_partial_is_never_expired() -> None:
    assert expired_names([partial("live", [HORIZON - 1000])], own="live") == []


@pytest.mark.parametrize(
    "data",
    [
        {"v": 1, "ts": 1.0, "window_sec": 5},  # no variants
        {"v": 1, "ts": "yesterday", "variants": {}},
        {"v": 1, "ts": float("inf"), "variants": {}},
        {"v": 1, "ts": 1.0, "variants": {"canary": {"count": [1]}}},  # no seconds
        {"v": 1, "ts": 1.0, "variants": {"canary": {"sec": ["x"]}}},
    ],
)
def test_a_malformed_partial_is_never_judged_dead(data: dict[str, Any]) -> None:
    assert last_second(Partial("junk", data)) is None
    assert expired_names([Partial("junk", data)]) == []


def test_fields_of_another_version_or_not_json_are_never_judged() -> None:
    fields = {
        part_field("v2"): json.dumps({"v": 2, "ts": 1.0, "variants": {}}),
        part_field("junk"): "{not json",
        part_field("d"): json.dumps(partial("d", [HORIZON - 1]).data),
    }
    assert expired_names(parse_partials(fields)) == ["d"]


def test_an_expired_partial_adds_nothing_to_any_window_a_reader_may_ask() -> None:
    """The law behind the horizon, on a real exported partial."""
    old = math.floor(NOW) - 60
    window = ExperimentWindow(
        EXPERIMENT, WindowConfig(window_sec=WINDOW_SEC), clock_now=old, seed=3
    )
    window.record(batch(np.full(300, 20_000), float(old) + 0.5), float(old) + 0.5)
    dead = parse_partials(
        {part_field("d"): json.dumps(export_partial(window, old + 0.6, collector="d", unacked=[]))}
    )
    # the newest second at which it is still kept, then the first at which it is not
    kept_until = old + RETAINED_SEC + EXPIRY_MARGIN_SEC
    for now in (kept_until + 0.9, kept_until + 1.0):
        judged = expired_partials(dead, now, own="live", retained_sec=RETAINED_SEC)
        assert (judged == dead) is (now >= kept_until + 1)
    for reader_window in range(1, RETAINED_SEC + 1):
        snapshots = merge_snapshots(EXPERIMENT, dead, kept_until + 1.0, window_sec=reader_window)
        assert sum(s.count for s in snapshots.values()) == 0
    # while it was inside the longest window, it did count
    just_kept = merge_snapshots(EXPERIMENT, dead, old + RETAINED_SEC - 0.5, window_sec=RETAINED_SEC)
    assert sum(s.count for s in just_kept.values()) == 300


# --- the removal, in a live collector, on both backends ------------------------


class RecordingBoard:
    """The board under test, remembering the fields of each publish."""

    def __init__(self, board: SnapshotBoard) -> None:
        self.board = board
        self.published: list[dict[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.board, name)

    async def publish(
        self, experiment: str, per_variant: Mapping[str, str], decision: Mapping[str, str]
    ) -> None:
        self.published.append(dict(per_variant))
        await self.board.publish(experiment, per_variant, decision)

    async def write_many(self, fields: Mapping[str, Mapping[str, str]]) -> None:
        self.published.extend(dict(values) for values in fields.values())
        await self.board.write_many(fields)


@dataclass
class World:
    clock: FakeClock
    streams: SampleStream
    board: RecordingBoard
    kv: KeyValueStore
    collectors: list[Collector]

    def collector(self, name: str) -> Collector:
        c = Collector(
            self.streams,
            self.board,  # type: ignore[arg-type]
            self.kv,
            EtcdKeys("/t"),
            consumer_name=name,
            clock=self.clock,
            block_ms=0,
            claim_idle_ms=5_000,
        )
        self.collectors.append(c)
        return c

    async def send(self, batches: int, *, first_seq: int) -> int:
        rt = np.full(512 * batches, 2_000, np.uint32)
        await self.streams.append(
            SERVICE,
            make_batches(rt, self.clock.now(), first_seq=first_seq),
            maxlen=10_000,
        )
        return int(rt.shape[0])

    async def total(self) -> int:
        snapshots = await read_merged_snapshots(self.board, EXPERIMENT, self.clock.now())  # type: ignore[arg-type]
        return sum(s.count for s in snapshots.values())


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.real)])
async def world(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    clock = FakeClock()
    if request.param == "redis":
        streams, board = open_streams(
            request.getfixturevalue("redis_url"),
            namespace=request.getfixturevalue("redis_namespace"),
        )
    else:
        streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    rule = {"service": SERVICE, "threshold_ms": 100, "window_sec": WINDOW_SEC}
    await kv.put(EtcdKeys("/t").rule(SERVICE), json.dumps(rule).encode())
    w = World(clock, streams, RecordingBoard(board), kv, [])
    try:
        yield w
    finally:
        for c in w.collectors:
            await c.stop_watching()
        await streams.close()
        await kv.close()


async def start_two_and_kill_b(w: World) -> tuple[Collector, Collector, int]:
    """a and b each apply 2 batches and publish them; then b is dead (never steps)."""
    a, b = w.collector("a"), w.collector("b")
    sent = 0
    for seq, c in ((1, a), (3, b)):
        await c.load_config()
        sent += await w.send(2, first_seq=seq)
        await c.step()  # discovery, then the 2 new entries, published at once
        assert c.metrics.publishes._value.get() == 1
    fields = await w.board.read(EXPERIMENT)
    assert {part_field("a"), part_field("b")} <= set(fields)
    assert await w.total() == sent
    return a, b, sent


async def test_a_dead_partial_stays_and_counts_until_the_horizon_then_is_removed(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    w = world
    caplog.set_level(logging.INFO, logger="canary.collector")
    a, _, first = await start_two_and_kill_b(w)
    dead_value = (await w.board.read(EXPERIMENT))[part_field("b")]
    dead_fields = own_fields(await w.board.read(EXPERIMENT), part_field("b"))
    dead_second = last_second(parse_partials({part_field("b"): dead_value})[0])
    assert dead_second == math.floor(w.clock.now())

    # within the window: b's field stays and its samples still count
    w.clock.advance(10)
    fresh = await w.send(2, first_seq=10)
    await a.step()
    fields = await w.board.read(EXPERIMENT)
    assert fields[part_field("b")] == dead_value
    assert await w.total() == first + fresh

    # out of the window, not past the horizon yet: still there (counting nothing)
    w.clock.advance(dead_second + RETAINED_SEC + EXPIRY_MARGIN_SEC + 0.5 - w.clock.now())
    await a.step()  # a heartbeat publish
    assert (await w.board.read(EXPERIMENT))[part_field("b")] == dead_value
    assert a.metrics.partials_removed._value.get() == 0

    # past the horizon: a publish of the partial alone reads no other field and
    # leaves it; the next one with the merged view (which reads them) removes it
    w.clock.advance(0.5)
    latest = await w.send(1, first_seq=20)
    await a.step()
    assert "canary" not in w.board.published[-1]
    assert (await w.board.read(EXPERIMENT))[part_field("b")] == dead_value
    w.clock.advance(MERGED_EVERY_SEC)
    await a.step()  # a heartbeat, with the merged view
    assert "canary" in w.board.published[-1]
    after = await w.board.read(EXPERIMENT)
    assert part_field("b") not in after
    assert after[part_field("a")] == w.board.published[-1][part_field("a")]
    # besides a's seconds written by earlier publishes (format 2), what the last wrote
    seconds_of_a = part_field("a") + "#"
    assert {k for k in after if not k.startswith(seconds_of_a)} == {
        k for k in w.board.published[-1] if not k.startswith(seconds_of_a)
    }
    now = w.clock.now()
    merged = await read_merged_snapshots(w.board, EXPERIMENT, now)  # type: ignore[arg-type]
    with_dead = merge_snapshots(
        EXPERIMENT, parse_partials({**after, **dead_fields}), now
    )
    assert merged == with_dead
    assert sum(s.count for s in merged.values()) == latest
    assert a.metrics.partials_removed._value.get() == 1
    removals = [r for r in caplog.records if "removed the partial window" in r.getMessage()]
    assert len(removals) == 1 and removals[0].levelno == logging.INFO
    assert "collector b" in removals[0].getMessage()

    # nothing left to remove: nothing more counted
    w.clock.advance(5.0)
    await a.step()
    assert a.metrics.partials_removed._value.get() == 1


async def test_an_owner_that_publishes_between_the_read_and_the_removal_keeps_its_field(
    world: World,
) -> None:
    w = world
    a, b, _ = await start_two_and_kill_b(w)
    dead_value = (await w.board.read(EXPERIMENT))[part_field("b")]
    w.clock.advance(RETAINED_SEC + EXPIRY_MARGIN_SEC + 1)
    latest = await w.send(1, first_seq=20)

    board = w.board.board
    remove = board.remove_if_unchanged

    async def b_resumes_first(experiment: str, expected: Mapping[str, str]) -> list[str]:
        # b was only paused: its publish lands after a read the hash, before the removal
        await b.publish(EXPERIMENT, w.clock.now())
        return await remove(experiment, expected)

    board.remove_if_unchanged = b_resumes_first  # type: ignore[method-assign]
    try:
        await a.step()
    finally:
        del board.remove_if_unchanged
    fields = await w.board.read(EXPERIMENT)
    resumed = fields[part_field("b")]
    assert resumed != dead_value
    assert json.loads(resumed)["ts"] == w.clock.now()
    assert a.metrics.partials_removed._value.get() == 0
    assert await w.total() == latest  # b's samples left the window: nothing counted twice
    # b republishes with every heartbeat, so it is never judged dead again
    w.clock.advance(5.0)
    await b.step()
    await a.step()
    assert part_field("b") in await w.board.read(EXPERIMENT)
    assert a.metrics.partials_removed._value.get() == 0


async def test_a_paused_collector_whose_field_was_removed_writes_it_again(world: World) -> None:
    w = world
    a, b, _ = await start_two_and_kill_b(w)
    w.clock.advance(RETAINED_SEC + EXPIRY_MARGIN_SEC + 1)
    latest = await w.send(1, first_seq=20)
    await a.step()
    assert part_field("b") not in await w.board.read(EXPERIMENT)

    await b.step()  # b wakes up: its heartbeat publish writes its field again
    assert part_field("b") in await w.board.read(EXPERIMENT)
    assert await w.total() == latest
    assert await w.streams.pending(SERVICE, "collectors") == 0
    assert a.metrics.partials_removed._value.get() == 1


async def test_fields_the_collector_cannot_read_are_left_alone(world: World) -> None:
    w = world
    a, _, _ = await start_two_and_kill_b(w)
    foreign = {
        part_field("newer"): json.dumps({"v": 2, "ts": 1.0, "variants": {}}),
        part_field("junk"): "{not json",
    }
    await w.board.publish(EXPERIMENT, foreign, {"experiment": EXPERIMENT})
    w.clock.advance(RETAINED_SEC + EXPIRY_MARGIN_SEC + 1)
    await w.send(1, first_seq=20)
    await a.step()
    fields = await w.board.read(EXPERIMENT)
    assert part_field("b") not in fields
    assert {name: fields[name] for name in foreign} == foreign
    assert a.metrics.partials_removed._value.get() == 1
