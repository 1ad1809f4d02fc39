"""Streams through the real proxy: a first_byte rule judges the head, not the stream.

An SSE-like upstream sends its response head and then its events slowly. Every
request goes through the proxy, the sample reporter, real Redis, the collector's
screening and windows, and is judged with the breaker. Time is the injected clock:
the upstream moves it while it "takes" its time, so the figures are exact.

A slow stream with a fast head must not trip a first_byte rule (a total rule trips
on it: that is why streams want first_byte); a slow head trips both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from controlplane.collector.screening import screen_entry
from controlplane.collector.windows import ExperimentWindow, WindowConfig
from controlplane.decision.breaker import Verdict, evaluate
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import COLLECTOR_GROUP
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.streams import SampleStream
from controlplane.kernel.streams_factory import open_streams
from sidecar.proxy.options import ProxyOptions
from sidecar.proxy.server import ProxyServer
from sidecar.reporter import SampleReporter
from tests.sidecar.proxy_harness import EXPERIMENT, HeaderChooser

SERVICE = "stream-api"
REQUESTS = 30
EVENTS = 3
EVENT_EVERY_SEC = 1.0  # a token stream: the answer takes seconds whatever the service
EVENT = b"data: token\n\n"


class EventStreamUpstream:
    """Answers each request with an event-stream head after `head_sec`, then, once the
    test has seen the head, EVENTS events EVENT_EVERY_SEC apart (on the fake clock)."""

    def __init__(self, clock: FakeClock, head_sec: float) -> None:
        self.clock = clock
        self.head_sec = head_sec
        self.release: asyncio.Queue[None] = asyncio.Queue()
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                self.clock.advance(self.head_sec)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                await writer.drain()
                await self.release.get()
                for _ in range(EVENTS):
                    self.clock.advance(EVENT_EVERY_SEC)
                    writer.write(b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def stream_once(port: int, upstream: EventStreamUpstream) -> bytes:
    """One request as an SSE client makes it: the head first, then every event."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"GET /events HTTP/1.1\r\nhost: stream-api\r\naccept: text/event-stream\r\n"
            b"x-test-variant: canary\r\n\r\n"
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        upstream.release.put_nowait(None)  # the head is out: now the slow part
        body = await reader.readuntil(b"0\r\n\r\n")
        assert body.count(b"data: token") == EVENTS
        return head
    finally:
        writer.close()


async def windows_after(head_sec: float, redis: SampleStream) -> WindowSnapshot:
    """REQUESTS streams through the proxy, then the canary's window as collected."""
    clock = FakeClock()
    await redis.ensure_group(SERVICE, COLLECTOR_GROUP)
    reporter = SampleReporter(redis, SERVICE, clock=clock, source="sc-stream")
    upstream = EventStreamUpstream(clock, head_sec)
    await upstream.start()
    chooser = HeaderChooser({"baseline": upstream.url, "canary": upstream.url})
    proxy = ProxyServer(chooser, reporter, options=ProxyOptions(read_timeout=10), clock=clock)
    await proxy.start("127.0.0.1", 0)
    try:
        for _ in range(REQUESTS):
            await stream_once(proxy.port, upstream)
        async with asyncio.timeout(10):
            while reporter.snapshot().samples_recorded < REQUESTS:
                proxy.flush_samples()
                await asyncio.sleep(0.01)  # waiting for the proxy's own tasks
        assert await reporter.flush()
    finally:
        await proxy.stop(timeout=2)
        await upstream.stop()
        await reporter.close()
    entries = await redis.read_group([SERVICE], COLLECTOR_GROUP, "c1", count=100, block_ms=0)
    window = ExperimentWindow(EXPERIMENT, WindowConfig.from_rule(rule("total")), clock_now=0)
    for entry in entries:
        _, batch = screen_entry(entry, clock.now(), None)  # the collector's gate
        assert batch.version == 2 and batch.fb_us is not None
        window.record(batch, clock.now())
    return window.snapshot(clock.now())["canary"]


def rule(latency: str) -> BreakerRule:
    return BreakerRule(
        service=SERVICE, threshold_ms=500.0, min_samples=REQUESTS, latency=latency,
        failure_ratio=0.1, window_sec=600,
    )  # fmt: skip


@pytest.fixture
async def redis(redis_url: str, redis_namespace: str) -> AsyncIterator[SampleStream]:
    bus, _ = open_streams(redis_url, namespace=redis_namespace)
    yield bus
    await bus.close()


async def test_a_slow_stream_with_a_fast_head_trips_only_a_total_rule(
    redis: SampleStream,
) -> None:
    canary = await windows_after(0.02, redis)
    assert canary.count == REQUESTS and canary.first_byte is not None
    assert canary.first_byte.count == REQUESTS and canary.missing_first_byte == 0
    assert canary.first_byte.p95_ms == pytest.approx(20.0, rel=0.01)
    assert canary.p95_ms == pytest.approx(3_020.0, rel=0.01)
    assert evaluate(canary, None, rule("first_byte")).verdict is Verdict.PASS
    assert evaluate(canary, None, rule("total")).verdict is Verdict.BREACH


async def test_a_slow_head_trips_a_first_byte_rule(redis: SampleStream) -> None:
    canary = await windows_after(2.0, redis)
    assert canary.first_byte is not None
    assert canary.first_byte.p95_ms == pytest.approx(2_000.0, rel=0.01)
    judged = evaluate(canary, None, rule("first_byte"))
    assert judged.verdict is Verdict.BREACH, judged.reason
    assert judged.variants["canary"]["first_byte"]["p95_ms"] == pytest.approx(2_000, rel=0.01)
    assert judged.variants["canary"]["total"]["p95_ms"] == pytest.approx(5_000, rel=0.01)
