"""The shared list-then-watch loop: snapshot, events, relist by difference, bounded backoff.

Runs against the shared etcd (own prefix), the in-process store, an etcd of its own
(compaction) and an address where nothing answers (backoff). Waits are injected:
the backoff's sleep is a recorder, never a real delay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from controlplane.kernel.backoff import BackoffPolicy
from controlplane.kernel.informer import PrefixInformer, Stored, diff_listing
from controlplane.kernel.kv import KeyValue, KeyValueStore
from controlplane.kernel.kv_etcd import EtcdKV
from controlplane.kernel.kv_memory import MemoryKV
from tests.support.outage import Outage, open_outage
from tests.support.processes import EtcdProcess, free_port

WAIT = 15.0  # an upper bound so a broken loop fails instead of hanging; no speed claim


# ------------------------------------------------------------------ the difference, pure


def kv(key: str, value: bytes, revision: int) -> KeyValue:
    return KeyValue(key, value, revision, revision)


def test_a_relist_puts_changed_and_new_keys_and_deletes_missing_ones() -> None:
    known = {
        "/p/same": Stored(b"1", 3),
        "/p/changed": Stored(b"1", 4),
        "/p/gone": Stored(b"1", 5),
    }
    listed = [kv("/p/changed", b"2", 9), kv("/p/new", b"n", 10), kv("/p/same", b"1", 3)]
    diff = diff_listing(known, listed)
    assert [item.key for item in diff.puts] == ["/p/changed", "/p/new"]
    assert diff.deletes == ["/p/gone"]


def test_same_revision_but_other_bytes_is_a_change() -> None:
    # a store restored from a backup can reuse revisions
    diff = diff_listing({"/p/k": Stored(b"old", 7)}, [kv("/p/k", b"new", 7)])
    assert [item.value for item in diff.puts] == [b"new"]


def test_the_first_listing_is_the_whole_snapshot() -> None:
    listed = [kv("/p/a", b"a", 2), kv("/p/b", b"b", 3)]
    diff = diff_listing({}, listed)
    assert diff.puts == listed and diff.deletes == []


# ------------------------------------------------------------------ against the stores


class Recorder:
    """A consumer that writes down what it is told, and a view of the keys it holds."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bytes | None]] = []
        self.view: dict[str, bytes] = {}
        self.failures: list[tuple[Exception, float]] = []
        self.lists: list[bool] = []
        self._changed = asyncio.Event()

    def on_put(self, key: str, value: bytes, mod_revision: int) -> None:
        self.calls.append(("put", key, value))
        self.view[key] = value
        self._changed.set()

    def on_delete(self, key: str) -> None:
        self.calls.append(("delete", key, None))
        self.view.pop(key, None)
        self._changed.set()

    def listed(self, *, relist: bool) -> None:
        self.lists.append(relist)

    def failed(self, error: Exception, *, retry_in: float) -> None:
        self.failures.append((error, retry_in))

    async def until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT):
            while not condition():
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture(params=["memory", "etcd"])
async def store(request: pytest.FixtureRequest, etcd_endpoint: str) -> AsyncIterator[KeyValueStore]:
    opened: KeyValueStore = MemoryKV() if request.param == "memory" else EtcdKV(etcd_endpoint)
    yield opened
    await opened.close()


@contextlib.asynccontextmanager
async def informing(
    kv: KeyValueStore,
    prefix: str,
    recorder: Recorder,
    *,
    accept: Callable[[str], bool] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    policy: BackoffPolicy | None = None,
) -> AsyncIterator[PrefixInformer]:
    informer = PrefixInformer(
        kv, prefix, recorder, name="test", accept=accept, observer=recorder, sleep=sleep,
        policy=policy,
    )  # fmt: skip
    informer.start()
    try:
        yield informer
    finally:
        await informer.stop()


async def test_the_snapshot_then_every_put_and_delete_reach_the_consumer(
    store: KeyValueStore, etcd_prefix: str
) -> None:
    prefix = etcd_prefix + "/items/"
    await store.put(prefix + "a", b"1")
    await store.put(prefix + "b", b"2")
    await store.put(etcd_prefix + "/other", b"not ours")
    recorder = Recorder()
    async with informing(store, prefix, recorder) as informer:
        assert await informer.wait_synced(WAIT)
        assert recorder.view == {prefix + "a": b"1", prefix + "b": b"2"}
        await store.put(prefix + "c", b"3")
        await store.put(prefix + "a", b"1b")
        await store.delete(prefix + "b")
        await recorder.until(lambda: len(recorder.calls) == 5)
        assert recorder.calls[2:] == [
            ("put", prefix + "c", b"3"),
            ("put", prefix + "a", b"1b"),
            ("delete", prefix + "b", None),
        ]
        assert recorder.view == {prefix + "a": b"1b", prefix + "c": b"3"}
        assert recorder.lists == [False] and recorder.failures == []
        assert informer.stats.events == 3
    for key in (prefix + "a", prefix + "c", etcd_prefix + "/other"):
        await store.delete(key)


async def test_every_key_of_a_lease_revoked_at_once_is_delivered_as_deleted(
    store: KeyValueStore, etcd_prefix: str
) -> None:
    # the keys of one lease go in one revision: each of them is news to the consumer
    prefix = etcd_prefix + "/leased/"
    session = store.lease_session(ttl=30)
    await session.open()
    for name in ("a", "b", "c"):
        assert await session.create(prefix + name, b"held") is not None
    recorder = Recorder()
    async with informing(store, prefix, recorder) as informer:
        assert await informer.wait_synced(WAIT)
        assert len(recorder.view) == 3
        await session.close()
        await recorder.until(lambda: not recorder.view)
        assert sorted(recorder.calls[3:]) == [("delete", prefix + n, None) for n in "abc"]


async def test_keys_the_consumer_does_not_accept_are_neither_kept_nor_delivered(
    store: KeyValueStore, etcd_prefix: str
) -> None:
    key = etcd_prefix + "/routes/svc"
    await store.put(key + "-2", b"someone else's")
    recorder = Recorder()
    async with informing(store, key, recorder, accept=lambda k: k == key) as informer:
        assert await informer.wait_synced(WAIT)
        await store.put(key + "-2", b"again")
        await store.delete(key + "-2")
        await store.put(key, b"ours")
        await recorder.until(lambda: bool(recorder.calls))
        assert recorder.calls == [("put", key, b"ours")]
        assert set(informer.known) == {key}
    await store.delete(key)


async def test_a_consumer_that_raises_is_counted_and_the_loop_goes_on() -> None:
    store = MemoryKV()
    recorder = Recorder()

    class Failing(Recorder):
        def on_put(self, key: str, value: bytes, mod_revision: int) -> None:
            if value == b"boom":
                raise RuntimeError("consumer bug")
            recorder.on_put(key, value, mod_revision)

        def on_delete(self, key: str) -> None:
            recorder.on_delete(key)

    informer = PrefixInformer(store, "/p/", Failing(), name="test")
    informer.start()
    try:
        assert await informer.wait_synced(WAIT)
        await store.put("/p/a", b"boom")
        await store.put("/p/b", b"fine")
        await recorder.until(lambda: "/p/b" in recorder.view)
        assert informer.stats.handler_errors == 1
        assert informer.stats.watch_errors == 0
    finally:
        await informer.stop()
        await store.close()


# ------------------------------------------------------------------ relist after compaction


@pytest.fixture(scope="module")
def own_etcd() -> Iterator[EtcdProcess]:
    proc = EtcdProcess()
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


@pytest.fixture(params=["memory", "etcd"])
async def outage(
    request: pytest.FixtureRequest, own_etcd: EtcdProcess
) -> AsyncIterator[Outage]:
    async with open_outage(request.param, own_etcd) as opened:
        yield opened


async def test_a_compacted_watch_relists_and_delivers_only_the_difference(
    outage: Outage, etcd_prefix: str
) -> None:
    prefix = etcd_prefix + "/"
    writer = outage.writer
    for name, value in (("same", b"s"), ("changed", b"c1"), ("gone", b"g")):
        await writer.put(prefix + name, value)
    recorder = Recorder()
    async with informing(outage.consumer_kv, prefix, recorder) as informer:
        assert await informer.wait_synced(WAIT)
        assert len(recorder.calls) == 3

        async def change(kv: KeyValueStore) -> None:
            await kv.delete(prefix + "gone")
            await kv.put(prefix + "changed", b"c2")
            await kv.put(prefix + "new", b"n")

        await outage.while_away(change)
        await recorder.until(lambda: len(recorder.calls) == 6)
        assert sorted(recorder.calls[3:], key=str) == sorted(
            [
                ("delete", prefix + "gone", None),
                ("put", prefix + "changed", b"c2"),
                ("put", prefix + "new", b"n"),
            ],
            key=str,
        )
        assert recorder.view == {prefix + "same": b"s", prefix + "changed": b"c2",
                                 prefix + "new": b"n"}  # fmt: skip
        assert informer.stats.relists >= 1
        if isinstance(outage.consumer_kv, MemoryKV):
            assert informer.stats.compactions >= 1
        # etcd: the resumed watch is refused as compacted, or the dropped connection
        # already ended it with an error the adapter does not resume; a relist either way
        assert recorder.lists[0] is False and True in recorder.lists[1:]

        # and it follows again after the relist
        await writer.put(prefix + "after", b"a")
        await recorder.until(lambda: prefix + "after" in recorder.view)


# ------------------------------------------------------------------ backoff in the loop


@pytest.mark.parametrize("kind", ["closed memory", "nothing listening"])
async def test_while_the_store_does_not_answer_the_waits_grow_and_stay_bounded(
    kind: str,
) -> None:
    store: KeyValueStore
    if kind == "closed memory":
        store = MemoryKV()
        await store.close()
    else:
        store = EtcdKV(f"127.0.0.1:{free_port()}")
    waits: list[float] = []
    enough = asyncio.Event()

    async def recorded_sleep(delay: float) -> None:
        waits.append(delay)
        if len(waits) >= 10:
            enough.set()
        await asyncio.sleep(0)  # let the test run; the delay itself is not waited

    policy = BackoffPolicy(initial=0.1, maximum=1.0, jitter=0.5)
    recorder = Recorder()
    try:
        async with informing(store, "/p/", recorder, sleep=recorded_sleep, policy=policy) as inf:
            async with asyncio.timeout(WAIT):
                await enough.wait()
            assert not inf.synced.is_set()
    finally:
        await store.close()
    assert all(0.05 <= w <= 1.0 for w in waits)
    assert waits[0] <= 0.1 and min(waits[5:]) >= 0.5  # grew to the cap, then stayed
    assert len(recorder.failures) >= 10 and recorder.calls == []
    assert [retry for _, retry in recorder.failures[:10]] == waits[:10]
