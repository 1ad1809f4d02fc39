"""A watch lost for longer than the store keeps history, on etcd and on the in-process store.

`while_away(change)` makes the consumer's watch miss `change` and every revision it
could resume from, so the consumer can only catch up by reading the prefix again:
- etcd: the consumer talks to its own etcd through a relay that is cut; the test
  writes to etcd directly, then compacts etcd's history and heals the relay;
- memory: a store with a short history; the change and enough filler writes run
  without yielding to the event loop, so the consumer's watch wakes up compacted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from etcd3aio import Etcd3Client

from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_etcd import EtcdKV
from controlplane.kernel.kv_memory import MemoryKV
from tests.support.processes import EtcdProcess
from tests.support.tcp_cut import TcpCut

Change = Callable[[KeyValueStore], Awaitable[None]]
MEMORY_HISTORY = 4
READY_WAIT = 20.0
FILLER = "/filler-for-compaction"


class Outage:
    consumer_kv: KeyValueStore  # what the consumer under test reads through
    writer: KeyValueStore  # what the test writes with

    async def while_away(self, change: Change) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class MemoryOutage(Outage):
    def __init__(self) -> None:
        self.kv = MemoryKV(history=MEMORY_HISTORY)
        self.consumer_kv = self.writer = self.kv

    async def while_away(self, change: Change) -> None:
        # no await below suspends: MemoryKV writes complete without yielding
        await change(self.kv)
        for i in range(MEMORY_HISTORY + 1):
            await self.kv.put(f"{FILLER}/{i}", b"")

    async def close(self) -> None:
        await self.kv.close()


class EtcdOutage(Outage):
    def __init__(self, etcd: EtcdProcess) -> None:
        self.etcd = etcd
        self.relay = TcpCut("127.0.0.1", etcd.port)
        self.consumer_kv = EtcdKV(self.relay.endpoint)
        self.writer = EtcdKV(etcd.endpoint)

    async def open(self) -> None:
        await self.relay.heal()
        # a freshly started etcd listens before it serves
        async with asyncio.timeout(READY_WAIT):
            while True:
                try:
                    await self.writer.ping()
                    return
                except BackendUnavailable:
                    await asyncio.sleep(0.1)

    async def while_away(self, change: Change) -> None:
        await self.relay.cut()
        await change(self.writer)
        latest = await self.writer.put(f"{FILLER}/latest", b"")
        async with Etcd3Client([self.etcd.endpoint]) as raw:
            assert raw.kv is not None
            await raw.kv.compact(latest, physical=True)
        await self.relay.heal()

    async def close(self) -> None:
        await self.consumer_kv.close()
        await self.writer.close()
        await self.relay.cut()


@contextlib.asynccontextmanager
async def open_outage(kind: str, etcd: EtcdProcess | None) -> AsyncIterator[Outage]:
    """An outage of one kind ("memory" or "etcd"), closed on the way out."""
    outage: Outage
    if kind == "memory":
        outage = MemoryOutage()
    else:
        assert etcd is not None
        etcd_outage = EtcdOutage(etcd)
        await etcd_outage.open()
        outage = etcd_outage
    try:
        yield outage
    finally:
        await outage.close()


async def until(condition: Callable[[], bool], what: str, *, within: float = 15.0) -> None:
    """Poll what a consumer's watch (real store I/O, not a clock) has applied; `within`
    is an upper bound so a broken watch fails the test, no speed claim."""
    try:
        async with asyncio.timeout(within):
            while not condition():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not seen within {within} s: {what}") from None
