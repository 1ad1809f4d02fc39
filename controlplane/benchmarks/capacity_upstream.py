"""An upstream with a fixed capacity, for `canary bench overload`.

At most `concurrency` requests are served at once, each for `service_ms` (a timer,
not CPU: the capacity holds on a busy machine); the rest wait in a FIFO queue with no
bound, as a thread pool or a worker queue does. A queued request whose connection has
closed is dropped when its turn comes (nobody can read its answer) and counted.

Control requests, answered at once without a place: `PUT /capacity/<n>` changes the
concurrency (a step change of capacity mid-run), `GET /stats` answers
`{"active", "queued", "served", "dropped", "concurrency"}`.

Requests on one connection are answered in the order they complete: the sidecar and
the benchmark's load generator never pipeline.

Run: `python -m controlplane.benchmarks.capacity_upstream PORT CONCURRENCY SERVICE_MS`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import deque
from typing import cast

import httptools

from controlplane.benchmarks.sidecar import HOST, _run_async, _until_sigterm

_OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n"
MAX_CONCURRENCY = 10_000


def _answer(status: int, body: bytes, content_type: str = "text/plain") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Capacity:
    """The places and the queue, shared by every connection."""

    def __init__(self, concurrency: int, service_s: float) -> None:
        self.concurrency = concurrency
        self.service_s = service_s
        self.active = 0
        self.waiting: deque[asyncio.Transport] = deque()
        self.served = 0
        self.dropped = 0

    def arrive(self, transport: asyncio.Transport) -> None:
        if self.active < self.concurrency and not self.waiting:
            self._start(transport)
        else:
            self.waiting.append(transport)

    def _start(self, transport: asyncio.Transport) -> None:
        self.active += 1
        asyncio.get_running_loop().call_later(self.service_s, self._finish, transport)

    def _finish(self, transport: asyncio.Transport) -> None:
        self.active -= 1
        if not transport.is_closing():
            transport.write(_OK)
            self.served += 1
        self.next()

    def next(self) -> None:
        while self.waiting and self.active < self.concurrency:
            transport = self.waiting.popleft()
            if transport.is_closing():
                self.dropped += 1
                continue
            self._start(transport)

    def stats(self) -> dict[str, int]:
        return {
            "active": self.active,
            "queued": len(self.waiting),
            "served": self.served,
            "dropped": self.dropped,
            "concurrency": self.concurrency,
        }


class _Connection(asyncio.Protocol):
    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(_answer(400, b"bad request\n"))
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_message_complete(self) -> None:
        transport = self.transport
        assert transport is not None
        url, self.url = self.url, b""
        method = self.parser.get_method()
        if url == b"/stats":
            body = json.dumps(self.capacity.stats()).encode()
            transport.write(_answer(200, body, "application/json"))
        elif url.startswith(b"/capacity/") and method == b"PUT":
            text = url.removeprefix(b"/capacity/")
            if not text.isdigit() or not 1 <= int(text) <= MAX_CONCURRENCY:
                transport.write(_answer(400, b"capacity: 1..10000\n"))
                return
            self.capacity.concurrency = int(text)
            self.capacity.next()
            transport.write(_answer(200, b"ok\n"))
        else:
            self.capacity.arrive(transport)


async def start(
    port: int, concurrency: int, service_ms: float
) -> tuple[asyncio.Server, Capacity]:
    """Listen on HOST:port (0: any free port) in the running loop; close the server
    to stop."""
    capacity = Capacity(concurrency, service_ms / 1000)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(capacity), HOST, port, backlog=4096)
    return server, capacity


async def serve(port: int, concurrency: int, service_ms: float) -> None:
    server, _ = await start(port, concurrency, service_ms)
    await _until_sigterm()
    server.close()


def _main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit("usage: python -m controlplane.benchmarks.capacity_upstream PORT CONCURRENCY "
                 "SERVICE_MS")  # fmt: skip
    _run_async(serve(int(argv[0]), int(argv[1]), float(argv[2])))


if __name__ == "__main__":
    _main(sys.argv[1:])
