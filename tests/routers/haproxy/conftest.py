"""A real HAProxy per test on private ports, tiny variant upstreams, a UDP log sink."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from tests.support.haproxy_proc import (
    HaproxyProcess,
    LogSink,
    VariantUpstream,
    variant_upstreams,
)


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


@pytest.fixture
def log_sink() -> Iterator[LogSink]:
    sink = LogSink()
    yield sink
    sink.sock.close()
