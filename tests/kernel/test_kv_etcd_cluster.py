"""The etcd store against a real 3-member cluster: failover when a member is killed.

Every client is given all three members (`h1:p1,h2:p2,h3:p3`). A member is killed
with SIGKILL, as a crashed machine would be; the fixture starts it again for the
next test.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator

import pytest

from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore, WatchEvent
from controlplane.kernel.kv_etcd import EtcdKV
from controlplane.kernel.routes import RouteState
from tests.support.etcd_cluster import EtcdCluster
from tests.support.routes import two_way_route

WRITES = 120
KILL_AT = 40


@pytest.fixture
async def kv(etcd_cluster: EtcdCluster) -> AsyncIterator[EtcdKV]:
    async with etcd_cluster.client() as store:
        yield store


@pytest.fixture
async def writer(etcd_cluster: EtcdCluster) -> AsyncIterator[EtcdKV]:
    async with etcd_cluster.client() as store:
        yield store


async def put_until_done(kv: KeyValueStore, key: str, value: bytes, timeout: float = 15.0) -> int:
    """A write refused while a member is lost is made again (possibly twice: a put
    that committed but whose answer was lost is not told apart here)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await kv.put(key, value)
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def collect(
    kv: KeyValueStore, prefix: str, *, after: int, until: int, into: list[WatchEvent]
) -> None:
    async for event in kv.watch_prefix(prefix, start_revision=after):
        into.append(event)
        if event.mod_revision >= until:
            return


async def test_writes_reads_and_watches_go_through_the_member_list(
    kv: EtcdKV, writer: EtcdKV, etcd_prefix: str
) -> None:
    seen: list[WatchEvent] = []
    _, start = await kv.get_prefix(etcd_prefix)
    revisions = [await writer.put(f"{etcd_prefix}/k{i}", b"%d" % i) for i in range(9)]
    await asyncio.wait_for(
        collect(kv, etcd_prefix, after=start, until=revisions[-1], into=seen), 10
    )
    assert [event.mod_revision for event in seen] == revisions
    values, _ = await kv.get_prefix(etcd_prefix)
    assert sorted(v.value for v in values) == [b"%d" % i for i in range(9)]


async def test_a_watch_whose_member_is_killed_resumes_on_another_with_no_gap(
    kv: EtcdKV, writer: EtcdKV, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    key = EtcdKeys(etcd_prefix).route("checkout")
    _, start = await kv.get_prefix(etcd_prefix)
    seen: list[WatchEvent] = []
    watching = asyncio.create_task(
        collect(kv, etcd_prefix, after=start, until=2**62, into=seen)
    )
    written: list[int] = []
    try:
        written.append(await writer.put(key, b"warm-up"))
        victim = await asyncio.to_thread(etcd_cluster.watched_member)
        for n in range(WRITES):
            if n == KILL_AT:
                etcd_cluster.kill(victim)
            route = two_way_route(n + 1, experiment=1, canary_bp=n * 50,
                                  state=RouteState.RUNNING)
            written.append(await put_until_done(writer, key, route.to_json().encode()))
            await asyncio.sleep(0.01)
        deadline = time.monotonic() + 10
        while (not seen or seen[-1].mod_revision < written[-1]) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        # the watch was on the killed member and now is on another one
        survivor = await asyncio.to_thread(etcd_cluster.watched_member)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    assert survivor is not victim
    # etcd's own history of the prefix, read afterwards by a fresh watch
    history: list[WatchEvent] = []
    await asyncio.wait_for(
        collect(writer, etcd_prefix, after=start, until=written[-1], into=history), 10
    )
    assert [e.mod_revision for e in seen] == [e.mod_revision for e in history]
    assert [e.value for e in seen] == [e.value for e in history]
    assert set(written) <= {e.mod_revision for e in seen}


async def test_a_lease_outlives_the_loss_of_the_raft_leader(
    kv: EtcdKV, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    ttl = 3
    leadership = kv.leadership(f"{etcd_prefix}/election", identity="one", ttl=ttl)
    fence = await leadership.campaign()
    etcd_cluster.kill(etcd_cluster.leader())
    lapses = 0
    # longer than the TTL: only renewals through the surviving members keep it
    for _ in range(int(ttl * 1.5 / 0.1)):
        await asyncio.sleep(0.1)
        lapses += not leadership.is_leader
    assert lapses == 0
    await kv.put(f"{etcd_prefix}/fenced", b"still leading", fence=fence)
    await leadership.resign()


async def test_a_watch_on_a_member_without_a_leader_is_ended_by_the_member(
    kv: EtcdKV, writer: EtcdKV, etcd_cluster: EtcdCluster, etcd_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The member left alone (its peers frozen, as behind a partition) loses its
    leader and ends the watch ("no leader"), rather than keep it open and silent."""
    _, start = await kv.get_prefix(etcd_prefix)
    seen: list[WatchEvent] = []
    watching = asyncio.create_task(
        collect(kv, etcd_prefix, after=start, until=2**62, into=seen)
    )
    frozen = []
    try:
        await writer.put(f"{etcd_prefix}/a", b"1")
        alone = await asyncio.to_thread(etcd_cluster.watched_member)
        caplog.set_level(logging.WARNING, logger="controlplane.kernel.kv_etcd")
        frozen = [m for m in etcd_cluster.members if m is not alone]
        for member in frozen:
            assert member.proc is not None
            member.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(
            "lost" in r.getMessage() and "UNAVAILABLE" in r.getMessage() for r in caplog.records
        ):
            await asyncio.sleep(0.1)
    finally:
        for member in frozen:
            assert member.proc is not None
            member.proc.send_signal(signal.SIGCONT)
    try:
        assert any("no leader" in r.getMessage() for r in caplog.records)
        await asyncio.to_thread(etcd_cluster.wait_healthy)
        revision = await put_until_done(writer, f"{etcd_prefix}/a", b"2")
        deadline = time.monotonic() + 10
        while (not seen or seen[-1].mod_revision < revision) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert [e.value for e in seen] == [b"1", b"2"]
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


async def test_a_lease_outlives_a_member_that_stops_answering(
    kv: EtcdKV, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    """A frozen member keeps its connections open and answers nothing: a renewal
    sent to it must give way to one sent to another member before the TTL runs out."""
    ttl = 3
    leadership = kv.leadership(f"{etcd_prefix}/election", identity="one", ttl=ttl)
    fence = await leadership.campaign()
    frozen = etcd_cluster.follower()
    assert frozen.proc is not None
    frozen.proc.send_signal(signal.SIGSTOP)
    lapses = 0
    try:
        for _ in range(int(ttl * 2 / 0.1)):
            await asyncio.sleep(0.1)
            lapses += not leadership.is_leader
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    assert lapses == 0
    await kv.put(f"{etcd_prefix}/fenced", b"still leading", fence=fence)
    await leadership.resign()


async def test_calls_go_on_while_a_member_stops_answering(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    """Round-robin sends every third call to the frozen member: the attempt that
    gets no answer in half the call's time is made again on another member."""
    key = f"{etcd_prefix}/frozen"
    async with etcd_cluster.client(timeout=2.0) as kv:
        await kv.put(key, b"0")
        frozen = etcd_cluster.follower()
        assert frozen.proc is not None
        frozen.proc.send_signal(signal.SIGSTOP)
        try:
            for n in range(1, 7):
                await kv.put(key, b"%d" % n)
                got = await kv.get(key)
                assert got is not None and got.value == b"%d" % n
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
