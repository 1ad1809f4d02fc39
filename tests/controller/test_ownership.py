"""Shard ownership on the real backends (etcd + PostgreSQL, then memory + SQLite):
replicas share the shards without overlap, hand them over on join and leave, and the
SQL fence of every shard names the replica that holds it in etcd."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from controlplane.controller.ownership import (
    ControllersView,
    Membership,
    OwnershipStats,
    ShardOwnership,
    member_value,
    parse_member,
    parse_shard_key,
)
from controlplane.controller.shards import ASSIGNMENT_VERSION, assign, shard_of
from controlplane.db.migrate import upgrade
from controlplane.db.shards import shard_fences
from controlplane.kernel.clock import utc_now
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.settings import Settings
from controlplane.kernel.tasks import cancel_and_wait
from controlplane.runtime import Backends, open_backends

SHARDS = 16
TTL = 30  # no lease runs out by accident here; leaving is a close


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # a replica of the release before assignment versions: plain HRW
        (b'{"shards":256}', Membership(256, 1)),
        (b'{"shards":256,"assignment":2}', Membership(256, 2)),
        (member_value(16), Membership(16, ASSIGNMENT_VERSION)),
        (b'{"shards":0}', None),
        (b'{"shards":5000}', None),
        (b'{"shards":true}', None),
        (b'{"shards":16,"x":1}', None),
        (b'{"shards":16,"assignment":0}', None),
        (b'{"shards":16,"assignment":"2"}', None),
        (b'{"shards":16,"assignment":1e3}', None),
        (b'{"shards":16,"assignment":1001}', None),
        (b'{"assignment":2}', None),
        (b"[16]", None),
        (b"\xff", None),
        (b'{"shards":' + b"1" * 300 + b"}", None),
    ],
)
def test_a_member_key_says_its_shards_and_assignment_or_nothing(
    value: bytes, expected: Membership | None
) -> None:
    assert parse_member(value) == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [("/c/controllers/shards/0003", 3), ("/c/controllers/shards/0016", None),
     ("/c/controllers/shards/3", None), ("/c/controllers/shards/00x3", None),
     ("/c/controllers/shards/../0001", None)],
)
def test_an_owner_key_names_a_shard_within_the_count(key: str, expected: int | None) -> None:
    assert parse_shard_key(key, "/c/controllers/shards/", SHARDS) == expected


def test_the_view_counts_keys_it_cannot_read_and_ignores_them() -> None:
    stats = OwnershipStats()
    view = ControllersView(EtcdKeys("/c"), SHARDS, stats)
    view.on_put("/c/controllers/members/a-1", member_value(SHARDS), 1)
    view.on_put("/c/controllers/members/b-2", b"garbage", 2)
    view.on_put("/c/controllers/shards/0001", b"a-1", 3)
    view.on_put("/c/controllers/shards/0002", b"not/an identity", 4)
    view.on_put("/c/controllers/shards/0099", b"a-1", 5)
    assert view.members == {"a-1": Membership(SHARDS)}
    assert view.holders == {1: "a-1"}
    assert stats.malformed_keys == 3
    view.on_delete("/c/controllers/shards/0001")
    view.on_delete("/c/controllers/members/a-1")
    assert view.members == {} and view.holders == {}


@dataclass
class Fleet:
    backends: Backends
    replicas: dict[str, ShardOwnership] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def start(self, identity: str, *, shards: int = SHARDS) -> ShardOwnership:
        owner = ShardOwnership(
            kv=self.backends.kv, keys=self.backends.keys, store=self.backends.store,
            clock=self.backends.clock, identity=identity, shards=shards, ttl=TTL,
            resync=0.2,
        )
        self.replicas[identity] = owner
        self.tasks[identity] = asyncio.create_task(owner.run())
        return owner

    async def stop(self, identity: str) -> None:
        await cancel_and_wait(self.tasks.pop(identity))
        del self.replicas[identity]

    async def holders(self) -> dict[int, str]:
        items, _ = await self.backends.kv.get_prefix(self.backends.keys.controller_shards_prefix)
        return {int(kv.key.rsplit("/", 1)[1]): kv.value.decode() for kv in items}

    async def settled(self, what: str, timeout: float = 15.0) -> dict[int, str]:
        """Wait until every shard is held, in etcd and in memory, as assigned."""
        wanted = assign(SHARDS, list(self.replicas))
        deadline = time.monotonic() + timeout
        while True:
            held = {s: i for i, o in self.replicas.items() for s in o.held}
            if held == wanted and await self.holders() == wanted:
                return wanted
            for identity, task in self.tasks.items():
                if task.done():
                    task.result()
                    raise AssertionError(f"{identity} stopped")
            assert time.monotonic() < deadline, f"not settled: {what}: {held} vs {wanted}"
            await asyncio.sleep(0.02)


@pytest.fixture
async def fleet(backend_settings: Settings) -> AsyncIterator[Fleet]:
    upgrade(backend_settings.database_url)
    backends = await open_backends(backend_settings, streams=False)
    made = Fleet(backends)
    try:
        yield made
    finally:
        for identity in list(made.tasks):
            with contextlib.suppress(Exception):
                await made.stop(identity)
        await backends.close()


async def sql_fences(backends: Backends) -> dict[int, tuple[int, str]]:
    async with backends.database.transaction() as tx:
        return await tx.run(shard_fences)


async def test_replicas_share_every_shard_once_and_fence_each_in_sql(fleet: Fleet) -> None:
    for identity in ("ctl-a", "ctl-b", "ctl-c"):
        fleet.start(identity)
    owners = await fleet.settled("three replicas")
    assert set(owners.values()) == {"ctl-a", "ctl-b", "ctl-c"}

    fences = await sql_fences(fleet.backends)
    for shard, owner in owners.items():
        held = fleet.replicas[owner].held[shard]
        assert fences[shard] == (held.create_revision, owner)
    some = next(iter(owners))
    experiment = next(e for e in range(1, 10_000) if shard_of(e, SHARDS) == some)
    judged = [o for o in fleet.replicas.values() if o.fence_of(experiment) is not None]
    assert [o.identity for o in judged] == [owners[some]]


async def test_a_replica_that_leaves_hands_over_only_its_own_shards(fleet: Fleet) -> None:
    for identity in ("ctl-a", "ctl-b", "ctl-c"):
        fleet.start(identity)
    before = await fleet.settled("three replicas")
    kept = {s: fleet.replicas[o].held[s] for s, o in before.items() if o != "ctl-b"}

    await fleet.stop("ctl-b")
    after = await fleet.settled("ctl-b gone")

    assert "ctl-b" not in after.values()
    # the survivors' shards were never released: the same keys, the same fences
    assert all(fleet.replicas[after[s]].held[s] == fence for s, fence in kept.items())
    fences = await sql_fences(fleet.backends)
    taken_over = [s for s, o in before.items() if o == "ctl-b"]
    assert taken_over
    for shard in taken_over:
        assert fences[shard] == (fleet.replicas[after[shard]].held[shard].create_revision,
                                 after[shard])


async def test_a_replica_that_joins_takes_its_shards_from_their_holders(fleet: Fleet) -> None:
    fleet.start("ctl-a")
    alone = await fleet.settled("one replica")
    assert set(alone.values()) == {"ctl-a"}

    fleet.start("ctl-d")
    shared = await fleet.settled("two replicas")

    moved = {s for s in range(SHARDS) if shared[s] == "ctl-d"}
    assert moved and all(alone[s] == "ctl-a" for s in moved)
    assert fleet.replicas["ctl-a"].stats.releases == len(moved)
    assert fleet.replicas["ctl-d"].stats.claims == len(moved)


async def test_replicas_that_disagree_on_the_shard_count_judge_nothing(fleet: Fleet) -> None:
    a = fleet.start("ctl-a")
    await fleet.settled("one replica")
    fleet.start("ctl-z", shards=SHARDS * 2)

    await until(lambda: not a.held and a.stats.disagreements > 0, "ctl-a let go")
    assert fleet.replicas["ctl-z"].held == {}


async def test_a_replica_of_the_release_before_assignment_versions_is_waited_out(
    fleet: Fleet,
) -> None:
    # a rolling upgrade: the old release assigns by plain HRW and announces no version;
    # the new one judges nothing beside it, and takes every shard once it is gone
    a = fleet.start("ctl-a")
    await fleet.settled("one replica")
    old = fleet.backends.kv.lease_session(ttl=TTL)
    await old.open()
    try:
        member = fleet.backends.keys.controller_member("ctl-old")
        assert await old.create(member, b'{"shards":%d}' % SHARDS) is not None
        await until(lambda: not a.held and a.stats.disagreements > 0, "ctl-a let go")
    finally:
        await old.close()
    await fleet.settled("ctl-a alone again")
    assert a.stats.members == 1


async def until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_a_shard_fenced_by_a_newer_owner_in_sql_is_let_go_and_the_rest_are_held(
    fleet: Fleet,
) -> None:
    # as after an etcd restored from an old backup: SQL has seen a greater fence
    async with fleet.backends.store.transaction() as tx:
        await tx.hold_shard(shard=3, fence=10**15, owner="ghost", now=utc_now(fleet.backends.clock))
    a = fleet.start("ctl-a")

    await until(lambda: len(a.held) == SHARDS - 1 and a.stats.refused_claims > 0,
                "every shard but 3 held")
    assert 3 not in a.held
    assert (await sql_fences(fleet.backends))[3] == (10**15, "ghost")


async def test_an_owner_key_of_its_name_it_does_not_hold_is_cleared_then_claimed(
    fleet: Fleet,
) -> None:
    # a release that never reached etcd leaves such a key; so does a former process
    leftover = fleet.backends.kv.lease_session(ttl=TTL)
    await leftover.open()
    stale = await leftover.create(fleet.backends.keys.controller_shard(5), b"ctl-a")
    assert stale is not None
    try:
        a = fleet.start("ctl-a")
        await fleet.settled("ctl-a holds every shard")
        assert a.held[5].create_revision > stale.create_revision
        assert (await sql_fences(fleet.backends))[5] == (a.held[5].create_revision, "ctl-a")
    finally:
        await leftover.close()
