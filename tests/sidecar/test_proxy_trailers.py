"""Trailer fields of chunked messages travel through the proxy both ways, with the
hop-by-hop and framing rules of heads; an HTTP/1.0 client gets the body without."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from sidecar.proxy import ProxyServer
from sidecar.proxy.trailers import (
    MAX_TRAILER_BYTES,
    request_last_chunk,
    response_trailers,
    trailer_section,
)
from tests.sidecar.proxy_harness import proxy_to as proxy_in_front

# --- the pure parts ----------------------------------------------------------


@pytest.mark.parametrize(
    ("tail", "section"),
    [
        (b"HTTP/1.1 200 OK\r\n\r\n3\r\nabc\r\n0\r\n\r\n", b""),
        (b"3\r\nabc\r\n0\r\nA: 1\r\nB: 2\r\n\r\n", b"A: 1\r\nB: 2\r\n"),
        (b"0;ext=1\r\n\r\n3\r\nabc\r\n000;x\r\nA: 1\r\n\r\n", b"A: 1\r\n"),
        # a body that contains what looks like a last chunk: the real one is the last
        (b"b\r\n\r\n0\r\nX: evil\r\n\r\n0\r\nA: 1\r\n\r\n", b"A: 1\r\n"),
        # the last chunk fell out of what was kept: nothing can be said
        (b"A: 1\r\nB: 2\r\n\r\n", None),
        (b"\r\n0\r\n" + b"A: " + b"x" * MAX_TRAILER_BYTES + b"\r\n\r\n", None),
    ],
)
def test_the_trailer_section_is_found_at_the_end_of_a_chunked_message(
    tail: bytes, section: bytes | None
) -> None:
    assert trailer_section(tail) == section


def test_trailers_lose_hop_by_hop_framing_and_named_fields() -> None:
    section = (
        b"Checksum: abc\r\nContent-Length: 5\r\nConnection: x\r\nX-Named: 1\r\n"
        b"Transfer-Encoding: chunked\r\nX-Canary-Variant: spoof\r\nProxy-Foo: 1\r\n"
    )
    assert response_trailers(section, frozenset({b"x-named"})) == (b"Checksum: abc\r\n", 6)
    fields = [
        (b"checksum", b"Checksum", b"abc"),
        (b"host", b"Host", b"evil"),
        (b"keep-alive", b"Keep-Alive", b"1"),
        (b"x-named", b"X-Named", b"1"),
    ]
    assert request_last_chunk(fields, frozenset({b"x-named"})) == (
        b"0\r\nChecksum: abc\r\n\r\n",
        3,
    )
    assert request_last_chunk([], None) == (b"0\r\n\r\n", 0)


# --- through the proxy ---------------------------------------------------------

BIG = b"abcdefgh" * 131072  # 1 MiB in one chunk, arriving over many reads
TRAILERS = (
    b"Grpc-Status: 0\r\nKeep-Alive: 5\r\nX-Canary-Variant: spoof\r\nX-Digest: sha-256=abc\r\n"
)


@dataclass
class RawUpstream:
    """Records each request's raw bytes up to its end; answers chunked with trailers,
    the last part of the answer written a byte at a time when `dribble`."""

    received: list[bytes] = field(default_factory=list)
    dribble: bool = False
    body: bytes = b"hello"
    server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                raw = head
                if b"chunked" in head.lower():
                    while not raw.endswith(b"\r\n\r\n") or raw == head:
                        raw += await reader.readuntil(b"\r\n")
                self.received.append(raw)
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                writer.write(b"%x\r\n%s\r\n" % (len(self.body), self.body))
                end = b"0\r\n" + TRAILERS + b"\r\n"
                if self.dribble:
                    for i in range(len(end)):
                        writer.write(end[i : i + 1])
                        await writer.drain()
                else:
                    writer.write(end)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


@asynccontextmanager
async def proxy_to(upstream: RawUpstream) -> AsyncIterator[ProxyServer]:
    url = await upstream.start()
    try:
        async with proxy_in_front(url) as proxy:
            yield proxy
    finally:
        await upstream.stop()


END = b"sha-256=abc\r\n\r\n"  # how each of the upstream's answers ends


async def _exchange(proxy: ProxyServer, request: bytes, responses: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(request)
    async with asyncio.timeout(10):
        got = b""
        while got.count(END) < responses:
            data = await reader.read(65536)
            assert data, got
            got += data
    writer.close()
    return got


CHUNKED_POST = (
    b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n0\r\nX-Checksum: 900150983cd2\r\nHost: evil\r\nKeep-Alive: 1\r\n\r\n"
)


async def test_request_trailers_reach_the_upstream_and_not_the_next_request() -> None:
    upstream = RawUpstream()
    async with proxy_to(upstream) as proxy:
        request = CHUNKED_POST + b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n"
        await _exchange(proxy, request, 2)
    post, following = upstream.received
    assert post.endswith(b"\r\n\r\n3\r\nabc\r\n0\r\nX-Checksum: 900150983cd2\r\n\r\n")
    assert b"evil" not in post
    assert b"X-Checksum" not in following  # trailers never leak into the next head


@pytest.mark.parametrize(("dribble", "body"), [(False, b"hello"), (True, b"hello"), (True, BIG)])
async def test_response_trailers_reach_an_http_1_1_client(dribble: bool, body: bytes) -> None:
    async with proxy_to(RawUpstream(dribble=dribble, body=body)) as proxy:
        got = await _exchange(proxy, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 1)
    received, trailers = _dechunk(got.split(b"\r\n\r\n", 1)[1])
    assert received == body
    assert trailers == b"Grpc-Status: 0\r\nX-Digest: sha-256=abc\r\n\r\n"
    assert proxy.metrics.trailers_dropped == 0


def _dechunk(chunked: bytes) -> tuple[bytes, bytes]:
    """(body, trailer section) of a chunked body."""
    body = b""
    while True:
        size_line, _, chunked = chunked.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return body, chunked
        body += chunked[:size]
        assert chunked[size : size + 2] == b"\r\n"
        chunked = chunked[size + 2 :]


async def test_an_http_1_0_client_gets_the_body_without_trailers() -> None:
    async with proxy_to(RawUpstream()) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET / HTTP/1.0\r\nHost: a\r\n\r\n")
        async with asyncio.timeout(10):
            got = await reader.read(-1)  # read to the close: HTTP/1.0 framing
        writer.close()
        assert got.endswith(b"\r\n\r\nhello")
        assert b"Grpc-Status" not in got
        assert proxy.metrics.trailers_dropped == 1
