"""Server-Sent Events through the proxy: each event reaches the client as it is sent.

The upstream sends event n+1 only after the client has received event n (explicit
sequencing, no timing): a proxy that held events back until more arrived, or until
the stream ended, would never deliver the first one and the test would stop at its
time bound.
"""

from __future__ import annotations

import asyncio

import pytest

from sidecar.proxy import ProxyOptions, ProxyServer
from tests.sidecar.proxy_harness import HeaderChooser, ListRecorder

EVENTS = 20


class SseUpstream:
    """Streams EVENTS events, each once the client has confirmed the one before."""

    def __init__(self, framing: str) -> None:
        self.framing = framing  # "chunked" or "close" (no length, ends with the connection)
        self.delivered = [asyncio.Event() for _ in range(EVENTS)]
        self.sent = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        framing = b"Transfer-Encoding: chunked\r\n" if self.framing == "chunked" else b""
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            + framing
            + b"\r\n"
        )
        for n in range(EVENTS):
            event = b"id: %d\ndata: event %d\n\n" % (n, n)
            writer.write(b"%x\r\n%s\r\n" % (len(event), event) if framing else event)
            await writer.drain()
            self.sent += 1
            await self.delivered[n].wait()
        if framing:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.mark.parametrize("framing", ["chunked", "close"])
async def test_each_event_reaches_the_client_before_the_next_is_sent(framing: str) -> None:
    upstream = SseUpstream(framing)
    url = await upstream.start()
    recorder = ListRecorder()
    proxy = ProxyServer(HeaderChooser({"baseline": url}), recorder, options=ProxyOptions())
    await proxy.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET /events HTTP/1.1\r\nHost: a\r\nAccept: text/event-stream\r\n\r\n")
        received = b""
        async with asyncio.timeout(20):  # an upper bound: a buffering proxy stops here
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"text/event-stream" in head
            assert b"Transfer-Encoding: chunked" in head  # re-framed for an HTTP/1.1 client
            for n in range(EVENTS):
                while b"data: event %d\n\n" % n not in received:
                    data = await reader.read(65536)
                    assert data, f"stream ended before event {n}"
                    received += data
                # the upstream has sent exactly this event and waits for us
                assert upstream.sent == n + 1
                upstream.delivered[n].set()
            while not received.endswith(b"0\r\n\r\n"):
                received += await reader.read(65536)
        writer.close()
        (sample,) = await recorder.wait_for(1)
        assert sample.outcome == 200
    finally:
        await proxy.stop(timeout=1)
        await upstream.stop()
