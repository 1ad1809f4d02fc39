"""One contract for the configuration store, run against etcd and the in-process store.

The etcd cases use the shared etcd, each test under its own key prefix; the fault
cases (restart, outage, compaction) run their own etcd on their own ports.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
from etcd3aio import Etcd3Client, prefix_range_end

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.errors import (
    BackendUnavailable,
    ConfigError,
    NotLeader,
    RevisionConflict,
)
from controlplane.kernel.kv import (
    EventKind,
    Fence,
    KeyValueStore,
    Leadership,
    RevisionCompacted,
    WatchEvent,
)
from controlplane.kernel.kv_etcd import EtcdKV
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.kv_memory import MemoryKV
from tests.support.processes import EtcdProcess, free_port

# An upper bound for what should happen promptly, so a broken store fails the test
# instead of hanging it; never a speed assertion.
WAIT = 10.0
TTL = 5


@dataclass
class Backend:
    """A store under test, with the means to open a second client on the same data."""

    kind: str
    prefix: str
    endpoint: str = ""
    clock: FakeClock = field(default_factory=FakeClock)
    stores: list[KeyValueStore] = field(default_factory=list)

    def open(self) -> KeyValueStore:
        if self.kind == "memory":
            if not self.stores:
                self.stores.append(MemoryKV(clock=self.clock))
            return self.stores[0]
        store = EtcdKV(self.endpoint)
        self.stores.append(store)
        return store

    async def expire_lease_of(self, store: KeyValueStore, election: str) -> None:
        """Make the leader's lease run out, as it does when its keepalives stop."""
        if self.kind == "memory":
            self.clock.advance(TTL + 1)
            return
        # etcd keeps its own time: revoking the lease out of band has the same effect
        # on the server as its expiry (the key goes, the fence breaks).
        async with Etcd3Client([self.endpoint]) as raw:
            assert raw.kv is not None and raw.lease is not None
            held = await raw.kv.get(election)
            await raw.lease.revoke(held.kvs[0].lease)

    async def aclose(self) -> None:
        for store in self.stores:
            await store.close()
        if self.kind == "etcd":
            async with Etcd3Client([self.endpoint]) as raw:
                assert raw.kv is not None
                await raw.kv.delete(self.prefix, range_end=prefix_range_end(self.prefix))


@pytest.fixture(params=["memory", "etcd"])
async def backend(
    request: pytest.FixtureRequest, etcd_endpoint: str, etcd_prefix: str
) -> AsyncIterator[Backend]:
    b = Backend(kind=request.param, prefix=etcd_prefix + "/", endpoint=etcd_endpoint)
    try:
        yield b
    finally:
        await b.aclose()


@pytest.fixture(scope="module")
def own_etcd() -> Iterator[EtcdProcess]:
    proc = EtcdProcess()
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


@contextlib.asynccontextmanager
async def watching(
    store: KeyValueStore, prefix: str, *, start_revision: int
) -> AsyncIterator[AsyncIterator[WatchEvent]]:
    events = store.watch_prefix(prefix, start_revision=start_revision)
    try:
        yield events
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def take(events: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
    async with asyncio.timeout(WAIT):
        return [await anext(events) for _ in range(count)]


def summary(events: list[WatchEvent]) -> list[tuple[EventKind, str, bytes | None]]:
    return [(e.kind, e.key, e.value) for e in events]


async def until_answers(store: KeyValueStore) -> None:
    async with asyncio.timeout(WAIT):
        while True:
            try:
                await store.ping()
                return
            except BackendUnavailable:
                await asyncio.sleep(0.1)


# -- keys and revisions --


async def test_put_get_and_delete_track_revisions(backend: Backend) -> None:
    kv = backend.open()
    key = backend.prefix + "rules/payment-api"

    assert await kv.get(key) is None
    first = await kv.put(key, b"v1")
    second = await kv.put(key, b"v2")

    item = await kv.get(key)
    assert item is not None
    assert (item.key, item.value) == (key, b"v2")
    assert second > first
    assert (item.create_revision, item.mod_revision) == (first, second)
    assert await kv.delete(key) is True
    assert await kv.get(key) is None
    assert await kv.delete(key) is False


async def test_get_prefix_returns_sorted_items_and_the_read_revision(backend: Backend) -> None:
    kv = backend.open()
    p = backend.prefix
    await kv.put(p + "routes/b", b"2")
    await kv.put(p + "routes/a", b"1")
    last = await kv.put(p + "rules/a", b"r")

    items, revision = await kv.get_prefix(p + "routes/")

    assert [(i.key, i.value) for i in items] == [(p + "routes/a", b"1"), (p + "routes/b", b"2")]
    assert revision >= last
    assert await kv.get_prefix(p + "nothing/") == ([], (await kv.get_prefix(p + "nothing/"))[1])


async def test_compare_and_swap_writes_only_at_the_expected_revision(backend: Backend) -> None:
    kv = backend.open()
    key = backend.prefix + "routes/payment-api"

    created = await kv.compare_and_swap(key, b"v1", expected_mod_revision=0)
    with pytest.raises(RevisionConflict):
        await kv.compare_and_swap(key, b"again", expected_mod_revision=0)
    updated = await kv.compare_and_swap(key, b"v2", expected_mod_revision=created)
    with pytest.raises(RevisionConflict):
        await kv.compare_and_swap(key, b"stale", expected_mod_revision=created)

    item = await kv.get(key)
    assert item is not None
    assert (item.value, item.mod_revision, item.create_revision) == (b"v2", updated, created)


async def test_create_only_compare_and_swap_fails_after_a_delete_too(backend: Backend) -> None:
    kv = backend.open()
    key = backend.prefix + "k"
    revision = await kv.put(key, b"v")
    await kv.delete(key)

    with pytest.raises(RevisionConflict):
        await kv.compare_and_swap(key, b"w", expected_mod_revision=revision)
    assert await kv.compare_and_swap(key, b"w", expected_mod_revision=0) > revision


# -- watches --


async def test_watch_yields_puts_and_deletes_under_the_prefix_in_order(backend: Backend) -> None:
    kv = backend.open()
    p = backend.prefix + "routes/"
    _, revision = await kv.get_prefix(p)

    async with watching(kv, p, start_revision=revision) as events:
        await kv.put(p + "a", b"1")
        await kv.put(backend.prefix + "rules/a", b"not watched")
        await kv.put(p + "b", b"2")
        await kv.delete(p + "a")
        await kv.put(p + "b", b"3")
        seen = await take(events, 4)

    assert summary(seen) == [
        (EventKind.PUT, p + "a", b"1"),
        (EventKind.PUT, p + "b", b"2"),
        (EventKind.DELETE, p + "a", None),
        (EventKind.PUT, p + "b", b"3"),
    ]
    revisions = [e.mod_revision for e in seen]
    assert revisions == sorted(set(revisions))
    assert revisions[0] > revision


async def test_watch_resumes_after_the_given_revision(backend: Backend) -> None:
    kv = backend.open()
    p = backend.prefix
    first = await kv.put(p + "a", b"1")
    second = await kv.put(p + "b", b"2")
    await kv.delete(p + "a")

    async with watching(kv, p, start_revision=first) as events:
        seen = await take(events, 2)

    assert summary(seen) == [(EventKind.PUT, p + "b", b"2"), (EventKind.DELETE, p + "a", None)]
    assert seen[0].mod_revision == second


async def test_two_watchers_see_the_same_events(backend: Backend) -> None:
    writer, reader = backend.open(), backend.open()
    p = backend.prefix
    _, revision = await writer.get_prefix(p)

    async with (
        watching(writer, p, start_revision=revision) as one,
        watching(reader, p, start_revision=revision) as two,
    ):
        for i in range(5):
            await writer.put(f"{p}{i}", str(i).encode())
        assert await take(one, 5) == await take(two, 5)


async def test_memory_watch_of_forgotten_history_raises_compacted() -> None:
    kv = MemoryKV(history=2)
    first = await kv.put("/k/0", b"0")
    for i in range(1, 6):
        await kv.put(f"/k/{i}", b"x")

    async with watching(kv, "/k/", start_revision=first) as events:
        with pytest.raises(RevisionCompacted):
            await anext(events)
    await kv.close()


async def test_etcd_watch_of_compacted_history_raises_compacted(own_etcd: EtcdProcess) -> None:
    kv = EtcdKV(own_etcd.endpoint)
    try:
        await until_answers(kv)
        first = await kv.put("/k/0", b"0")
        await kv.put("/k/1", b"1")
        latest = await kv.put("/k/2", b"2")
        async with Etcd3Client([own_etcd.endpoint]) as raw:
            assert raw.kv is not None
            await raw.kv.compact(latest, physical=True)

        async with watching(kv, "/k/", start_revision=first) as events:
            with pytest.raises(RevisionCompacted):
                await take(events, 1)
    finally:
        await kv.close()


async def test_etcd_watch_sees_every_event_once_across_an_etcd_restart(
    own_etcd: EtcdProcess,
) -> None:
    kv = EtcdKV(own_etcd.endpoint)
    try:
        await until_answers(kv)
        _, revision = await kv.get_prefix("/restart/")
        async with watching(kv, "/restart/", start_revision=revision) as events:
            await kv.put("/restart/1", b"1")
            await kv.put("/restart/2", b"2")
            before = await take(events, 2)

            own_etcd.stop()
            with pytest.raises(BackendUnavailable):
                await kv.ping()
            own_etcd.start()
            await until_answers(kv)

            await kv.put("/restart/3", b"3")
            await kv.delete("/restart/1")
            await kv.put("/restart/4", b"4")
            after = await take(events, 3)

        assert summary(before + after) == [
            (EventKind.PUT, "/restart/1", b"1"),
            (EventKind.PUT, "/restart/2", b"2"),
            (EventKind.PUT, "/restart/3", b"3"),
            (EventKind.DELETE, "/restart/1", None),
            (EventKind.PUT, "/restart/4", b"4"),
        ]
        revisions = [e.mod_revision for e in before + after]
        assert revisions == sorted(set(revisions))
    finally:
        await kv.close()


async def test_etcd_ping_raises_backend_unavailable_when_nothing_answers() -> None:
    kv = EtcdKV(f"127.0.0.1:{free_port()}")
    try:
        with pytest.raises(BackendUnavailable):
            await kv.ping()
        with pytest.raises(BackendUnavailable):
            await kv.get("/k")
    finally:
        await kv.close()


async def test_ping_answers_while_the_store_is_up(backend: Backend) -> None:
    await backend.open().ping()


# -- leadership --


async def campaign(leadership: Leadership) -> asyncio.Task[Fence]:
    task: asyncio.Task[Fence] = asyncio.create_task(leadership.campaign())
    await asyncio.sleep(0)
    return task


async def test_one_candidate_leads_and_the_other_takes_over_after_resign(
    backend: Backend,
) -> None:
    election = backend.prefix + "election/controller"
    a = backend.open().leadership(election, identity="a", ttl=TTL)
    b = backend.open().leadership(election, identity="b", ttl=TTL)

    fence_a = await a.campaign()
    waiting = await campaign(b)
    holder = await backend.open().get(election)

    assert a.is_leader and not b.is_leader
    assert holder is not None and holder.value == b"a"
    assert not waiting.done()

    await a.resign()
    async with asyncio.timeout(WAIT):
        fence_b = await waiting
        await a.lost()

    assert b.is_leader and not a.is_leader
    assert fence_b.create_revision > fence_a.create_revision
    await b.resign()


async def test_a_deposed_leader_cannot_write_and_its_successor_can(backend: Backend) -> None:
    election = backend.prefix + "election/controller"
    route = backend.prefix + "routes/payment-api"
    kv_a, kv_b = backend.open(), backend.open()
    a = kv_a.leadership(election, identity="a", ttl=TTL)
    b = kv_b.leadership(election, identity="b", ttl=TTL)
    fence_a = await a.campaign()
    written = await kv_a.put(route, b"from a", fence=fence_a)
    waiting = await campaign(b)

    await backend.expire_lease_of(kv_a, election)
    async with asyncio.timeout(WAIT):
        await a.lost()
        fence_b = await waiting

    assert not a.is_leader and b.is_leader
    with pytest.raises(NotLeader):
        await kv_a.put(route, b"stale", fence=fence_a)
    with pytest.raises(NotLeader):
        await kv_a.compare_and_swap(route, b"stale", expected_mod_revision=written, fence=fence_a)
    item = await kv_b.get(route)
    assert item is not None and (item.value, item.mod_revision) == (b"from a", written)

    moved = await kv_b.compare_and_swap(
        route, b"from b", expected_mod_revision=written, fence=fence_b
    )
    with pytest.raises(RevisionConflict):
        await kv_b.compare_and_swap(
            route, b"late", expected_mod_revision=written, fence=fence_b
        )
    assert moved > written
    await b.resign()


# -- lease sessions --


async def test_keys_created_under_a_lease_exist_once_and_fence_their_writes(
    backend: Backend,
) -> None:
    shard = backend.prefix + "controllers/shards/007"
    target = backend.prefix + "routes/payment-api"
    kv_a, kv_b = backend.open(), backend.open()
    a, b = kv_a.lease_session(ttl=TTL), kv_b.lease_session(ttl=TTL)
    await a.open()
    await b.open()

    fence = await a.create(shard, b"a")
    assert fence is not None and a.alive
    assert await a.create(shard, b"a again") is None
    assert await b.create(shard, b"b") is None
    held = await kv_b.get(shard)
    assert held is not None and (held.value, held.create_revision) == (b"a", fence.create_revision)
    assert await kv_a.put(target, b"from a", fence=fence) > fence.create_revision

    await a.close()
    assert not a.alive
    assert await kv_b.get(shard) is None
    with pytest.raises(NotLeader):
        await kv_a.put(target, b"stale", fence=fence)
    with pytest.raises(NotLeader):
        await a.create(backend.prefix + "controllers/shards/008", b"a")
    taken = await b.create(shard, b"b")
    assert taken is not None and taken.create_revision > fence.create_revision
    await b.close()


async def test_every_key_of_an_expired_lease_goes_at_once_and_its_holder_knows(
    backend: Backend,
) -> None:
    shards = [backend.prefix + f"controllers/shards/{n:03d}" for n in range(3)]
    kv = backend.open()
    session = kv.lease_session(ttl=TTL)
    await session.open()
    fences = [await session.create(key, b"a") for key in shards]
    assert all(f is not None for f in fences)
    _, start = await kv.get_prefix(backend.prefix + "controllers/")
    async with watching(kv, backend.prefix + "controllers/", start_revision=start) as events:
        await backend.expire_lease_of(kv, shards[0])
        async with asyncio.timeout(WAIT):
            await session.lost()
        gone = await take(events, 3)
    assert not session.alive
    assert sorted((e.kind, e.key) for e in gone) == [(EventKind.DELETE, k) for k in shards]
    # one revision for all: etcd deletes a lease's keys in one step
    assert len({e.mod_revision for e in gone}) == 1
    await session.close()


async def test_etcd_leader_steps_down_when_etcd_is_gone(own_etcd: EtcdProcess) -> None:
    kv = EtcdKV(own_etcd.endpoint)
    try:
        await until_answers(kv)
        leadership = kv.leadership("/election/controller", identity="a", ttl=2)
        await leadership.campaign()
        assert leadership.is_leader

        own_etcd.stop()
        try:
            async with asyncio.timeout(WAIT):
                await leadership.lost()
            assert not leadership.is_leader
        finally:
            own_etcd.start()
    finally:
        await kv.close()


# -- choosing the store --


def test_memory_url_opens_the_in_process_store() -> None:
    assert isinstance(open_kv("memory://"), MemoryKV)


def test_endpoint_lists_open_etcd() -> None:
    assert isinstance(open_kv("127.0.0.1:2379,127.0.0.1:22379"), EtcdKV)
    assert isinstance(open_kv("etcd.internal:2379"), EtcdKV)
    assert isinstance(open_kv("https://etcd.internal:2379"), EtcdKV)


@pytest.mark.parametrize(
    "url",
    ["", "localhost", "127.0.0.1:notaport", "127.0.0.1:70000", "grpc://etcd:2379",
     "memory://elsewhere", "etcd-a:2379,etcd-a:2379", "127.0.0.1:2379,",
     "https://10.0.0.1:2379,10.0.0.2:2379"],
)
def test_bad_urls_raise_config_error_on_one_line(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        open_kv(url)
    assert "\n" not in str(caught.value)


async def test_closing_the_store_ends_its_watches(backend: Backend) -> None:
    kv = backend.open()
    _, revision = await kv.get_prefix(backend.prefix)
    events = kv.watch_prefix(backend.prefix, start_revision=revision)
    await kv.put(backend.prefix + "a", b"1")
    assert summary(await take(events, 1)) == [(EventKind.PUT, backend.prefix + "a", b"1")]

    pending = asyncio.create_task(take(events, 1))
    await kv.close()
    with pytest.raises(StopAsyncIteration):
        await pending


async def test_closing_an_etcd_leaders_client_hands_the_leadership_over(
    etcd_endpoint: str, etcd_prefix: str
) -> None:
    # A TTL far beyond WAIT: only the release on close can make this pass in time.
    election = etcd_prefix + "/election/controller"
    kv_a, kv_b = EtcdKV(etcd_endpoint), EtcdKV(etcd_endpoint)
    try:
        await kv_a.leadership(election, identity="a", ttl=60).campaign()
        b = kv_b.leadership(election, identity="b", ttl=60)
        waiting = await campaign(b)

        await kv_a.close()
        async with asyncio.timeout(WAIT):
            await waiting
        await b.resign()
    finally:
        await kv_a.close()
        await kv_b.close()


async def test_memory_leader_holds_while_the_clock_stays_within_its_ttl() -> None:
    clock = FakeClock()
    kv = MemoryKV(clock=clock)
    leadership = kv.leadership("/election/controller", identity="a", ttl=TTL)
    fence = await leadership.campaign()

    clock.advance(TTL - 1)
    assert leadership.is_leader
    await kv.put("/routes/x", b"1", fence=fence)
    clock.advance(2)
    assert not leadership.is_leader
    with pytest.raises(NotLeader):
        await kv.put("/routes/x", b"2", fence=fence)
    await kv.close()
