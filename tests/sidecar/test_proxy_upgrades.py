"""Upgrade requests at the byte level: what is tunnelled, what stays HTTP, what is
refused; a raw upstream that answers as each case needs, a raw client socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from sidecar.proxy import ProxyOptions, ProxyServer
from sidecar.proxy.tunnel import CLOSED
from tests.sidecar.proxy_harness import HeaderChooser, ListRecorder
from tests.support.outage import until

SWITCH = (
    b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n"
    b"X-Upstream-Field: kept\r\n\r\n"
)
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class RawUpstream:
    """Reads request heads and answers each with `answer`; after a 101 it echoes
    upper-cased until the client half-closes, then sends `bye` and closes."""

    answer: bytes = SWITCH
    heads: list[bytes] = field(default_factory=list)
    eof_seen: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                writer.write(self.answer)
                await writer.drain()
                if self.answer.startswith(b"HTTP/1.1 101"):
                    while data := await reader.read(65536):
                        writer.write(data.upper())
                    self.eof_seen.set()
                    writer.write(b"bye")
                    await writer.drain()
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


@dataclass
class Setup:
    upstream: RawUpstream
    proxy: ProxyServer
    recorder: ListRecorder

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.proxy.port)


@asynccontextmanager
async def setup(answer: bytes = SWITCH) -> AsyncIterator[Setup]:
    upstream = RawUpstream(answer)
    url = await upstream.start()
    recorder = ListRecorder()
    proxy = ProxyServer(
        HeaderChooser({"baseline": url}), recorder, options=ProxyOptions(read_timeout=5)
    )
    await proxy.start("127.0.0.1", 0)
    try:
        yield Setup(upstream, proxy, recorder)
    finally:
        await proxy.stop(timeout=1)
        await upstream.stop()


UPGRADE = b"GET /t HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: echo\r\n\r\n"


async def _head(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(10):
        return await reader.readuntil(b"\r\n\r\n")


async def test_the_upgrade_is_forwarded_and_the_101_splices_a_tunnel_with_half_close() -> None:
    async with setup() as s:
        reader, writer = await s.open()
        writer.write(UPGRADE + b"early bytes ")  # sent before the 101: held, then relayed
        head = await _head(reader)
        assert head.startswith(b"HTTP/1.1 101 ")
        assert b"\r\nConnection: upgrade\r\nUpgrade: echo\r\n" in head
        assert b"X-Upstream-Field: kept" in head
        assert b"X-Canary-Variant: baseline" in head
        (forwarded,) = s.upstream.heads
        assert b"\r\nConnection: upgrade\r\nUpgrade: echo\r\n" in forwarded
        writer.write(b"then more")
        async with asyncio.timeout(10):
            assert await reader.readexactly(21) == b"EARLY BYTES THEN MORE"
        writer.write_eof()  # half-close: the upstream sees EOF and still answers
        async with asyncio.timeout(10):
            await s.upstream.eof_seen.wait()
            assert await reader.read() == b"bye"
        writer.close()
        await until(lambda: s.proxy.metrics.tunnels_closed == {CLOSED: 1}, "tunnel ended")
        assert s.proxy.metrics.connections == 0
        (sample,) = await s.recorder.wait_for(1)
        assert sample.outcome == 101


async def test_a_refused_upgrade_continues_as_http_on_the_same_connection() -> None:
    async with setup(OK) as s:
        reader, writer = await s.open()
        writer.write(UPGRADE + b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
        for _ in range(2):
            head = await _head(reader)
            assert head.startswith(b"HTTP/1.1 200 ")
            assert b"Upgrade" not in head
            assert await reader.readexactly(2) == b"ok"
        assert [h.split(b"\r\n")[0] for h in s.upstream.heads] == [
            b"GET /t HTTP/1.1",
            b"GET /next HTTP/1.1",
        ]
        writer.close()
        assert [x.outcome for x in await s.recorder.wait_for(2)] == [200, 200]
        assert s.proxy.metrics.tunnels_open == 0
        assert s.proxy.reserve_tunnel()  # the refused upgrade gave its place back


@pytest.mark.parametrize(
    ("request_head", "answer"),
    [
        # a 101 to a request that did not ask to upgrade
        (b"GET /t HTTP/1.1\r\nHost: a\r\n\r\n", SWITCH),
        # a 101 to a protocol the request did not name
        (UPGRADE, SWITCH.replace(b"Upgrade: echo", b"Upgrade: other")),
        # a 101 without Connection: upgrade
        (UPGRADE, SWITCH.replace(b"Connection: Upgrade\r\n", b"")),
    ],
)
async def test_a_101_that_does_not_answer_the_request_is_a_502(
    request_head: bytes, answer: bytes
) -> None:
    async with setup(answer) as s:
        reader, writer = await s.open()
        writer.write(request_head)
        head = await _head(reader)
        assert head.startswith(b"HTTP/1.1 502 ")
        writer.close()
        assert s.proxy.metrics.tunnels_open == 0
        assert [x.outcome for x in await s.recorder.wait_for(1)] == [502]


@pytest.mark.parametrize(
    "request_head",
    [
        UPGRADE.replace(b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\nabc"),
        UPGRADE.replace(
            b"\r\n\r\n", b"\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        ),
        b"GET /t HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: a b\r\n\r\n",
    ],
)
async def test_an_upgrade_with_a_body_or_a_bad_upgrade_field_is_refused(
    request_head: bytes,
) -> None:
    async with setup() as s:
        reader, writer = await s.open()
        writer.write(request_head)
        head = await _head(reader)
        assert head.startswith(b"HTTP/1.1 400 ")
        assert s.upstream.heads == []
        assert s.proxy.metrics.rejected == {"upgrade": 1}
        writer.close()


@pytest.mark.parametrize(
    "request_head",
    [
        # h2c is left to the proxy's own HTTP/2: forwarded plain, never tunnelled
        b"GET /t HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
        # RFC 9110 §7.8: an HTTP/1.0 request's Upgrade is ignored
        b"GET /t HTTP/1.0\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
    ],
)
async def test_upgrades_that_are_not_tunnelled_go_plain_and_end_the_connection(
    request_head: bytes,
) -> None:
    async with setup(OK) as s:
        reader, writer = await s.open()
        writer.write(request_head + b"PRI * HTTP/2.0\r\n\r\n")
        head = await _head(reader)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert await reader.read() == b"ok"  # then the connection closes
        (forwarded,) = s.upstream.heads
        assert b"Upgrade" not in forwarded
        assert b"HTTP2-Settings" not in forwarded
        writer.close()
        assert s.proxy.metrics.tunnels_open == 0


async def test_connect_is_still_refused() -> None:
    async with setup() as s:
        reader, writer = await s.open()
        writer.write(b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n")
        assert (await _head(reader)).startswith(b"HTTP/1.1 405 ")
        assert s.upstream.heads == []
        writer.close()
