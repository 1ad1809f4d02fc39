"""A real HAProxy per test on private ports, tiny variant upstreams, a UDP log sink."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from tests.support.haproxy_proc import HaproxyProcess, VariantUpstream, variant_upstreams


@pytest.fixture
async def upstreams() -> AsyncIterator[dict[str, VariantUpstream]]:
    async with variant_upstreams("baseline", "canary", "green") as servers:
        yield servers


@pytest.fixture
def start_haproxy() -> Iterator[Callable[..., HaproxyProcess]]:
    started: list[HaproxyProcess] = []

    def start(**options: Any) -> HaproxyProcess:
        proc = HaproxyProcess(**options)
        started.append(proc)
        proc.start()
        return proc

    yield start
    for proc in started:
        proc.close()


class LogSink:
    """A UDP socket the test binds, to receive HAProxy's log datagrams."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    async def receive(self, count: int, *, timeout: float = 5.0) -> list[bytes]:
        loop = asyncio.get_running_loop()
        got: list[bytes] = []
        async with asyncio.timeout(timeout):
            while len(got) < count:
                got.append(await loop.sock_recv(self.sock, 65_536))
        return got

    def drain(self) -> None:
        while True:
            try:
                self.sock.recv(65_536)
            except BlockingIOError:
                return


@pytest.fixture
def log_sink() -> Iterator[LogSink]:
    sink = LogSink()
    yield sink
    sink.sock.close()
