"""HTTP/2 streams translated to HTTP/1.1 requests: the framing sent upstream is the
proxy's own, and a stream whose declared length disagrees with its DATA never
reaches an upstream as a request.

The upstream answers as soon as a head is in and then discards the body the head
declares (`EarlyUpstream`, as Go, Node and nginx do), so any framing the proxy got
wrong shows: a body that becomes a request, or a next user's head swallowed as a
body. The clients are a raw `h2` client, which sends whatever it is told, and httpx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import h2.errors
import httpx
import pytest

from sidecar.proxy import ProxyServer
from tests.sidecar.early_upstream import EarlyUpstream
from tests.sidecar.h2_raw_client import Outcome, RawH2Client
from tests.sidecar.h2_upstream import H2Upstream
from tests.sidecar.overload.test_proxy_overload import arrived, protect, queued
from tests.sidecar.proxy_harness import harness, proxy_to
from tests.sidecar.test_smuggling import proxied, read_all

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: evil\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n"
VICTIM = {"authorization": "Bearer victim-token", "cookie": "session=victim"}


@dataclass
class Setup:
    upstream: EarlyUpstream
    proxy: ProxyServer

    async def victim(self) -> httpx.Response:
        """A second user's request, on the connection the pool kept (if any)."""
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.proxy.port}") as c:
            return await c.get("/victim", headers=VICTIM, timeout=5)

    async def warm(self) -> None:
        """One plain request first, so that the pool holds an upstream connection."""
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.proxy.port}") as c:
            assert (await c.get("/warm", timeout=5)).text == "answer to /warm"


@asynccontextmanager
async def early(drains: bool = True) -> AsyncIterator[Setup]:
    upstream = EarlyUpstream(drains=drains)
    await upstream.start()
    try:
        async with proxy_to(upstream.url) as proxy:
            yield Setup(upstream, proxy)
    finally:
        await upstream.stop()


async def assert_the_victim_is_served_alone(s: Setup, attacker_targets: set[bytes]) -> None:
    """The second user gets its own answer; the upstream saw only requests clients
    sent as requests, and no one's credentials inside another request's body."""
    response = await s.victim()
    assert response.status_code == 200
    assert response.text == "answer to /victim"
    assert set(s.upstream.targets) <= {b"/warm", b"/victim"} | attacker_targets
    assert s.upstream.targets.count(b"/victim") == 1
    (victim,) = [head for head in s.upstream.heads if head.target == b"/victim"]
    assert victim.all(b"authorization") == [b"Bearer victim-token"]
    assert victim.all(b"x-forwarded-for") == [b"127.0.0.1"]
    assert victim.all(b"x-canary-variant") == [b"baseline"]
    assert all(b"victim-token" not in head.body for head in s.upstream.heads)


async def test_a_length_declared_with_end_stream_on_headers_is_reset_and_never_forwarded() -> None:
    async with early() as s:
        await s.warm()
        client = await RawH2Client.open(s.proxy.port)
        sid = client.request(
            b"/attack", method=b"POST", end=True, fields=((b"content-length", b"189"),)
        )
        await client.send()
        outcome = await client.outcome(sid)
        client.close()
        assert outcome.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR
        assert outcome.status is None
        await assert_the_victim_is_served_alone(s, set())
        assert s.upstream.targets == [b"/warm", b"/victim"]
        assert s.proxy.metrics.rejected == {"h2_content_length": 1}


@pytest.mark.parametrize("pause", [False, True], ids=["one read", "head sent first"])
async def test_data_shorter_than_the_declared_length_then_trailers_never_becomes_a_request(
    pause: bool,
) -> None:
    async with early() as s:
        await s.warm()
        client = await RawH2Client.open(s.proxy.port)
        sid = client.request(
            b"/attack", method=b"POST", end=False, fields=((b"content-length", b"200"),)
        )
        client.data(sid, SMUGGLED)
        if pause:
            await client.send()
            await s.upstream.wait_heads(2)  # /warm, then the attack's head went up
        client.trailers(sid, [(b"x-checksum", b"1")])
        await client.send()
        outcome = await client.outcome(sid)
        client.close()
        # its own early answer (the rest of it not wanted), or reset as malformed
        assert outcome.body in (b"", b"answer to /attack")
        assert outcome.status == 200 or outcome.reset is not None
        await assert_the_victim_is_served_alone(s, {b"/attack"})
        if pause:
            (attack,) = [head for head in s.upstream.heads if head.target == b"/attack"]
            assert attack.all(b"content-length") == []  # the client's 200 never went up
            assert attack.all(b"transfer-encoding") == [b"chunked"]
        else:
            assert s.upstream.targets == [b"/warm", b"/victim"]
            assert outcome.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR


async def test_data_longer_than_the_declared_length_never_reaches_the_upstream() -> None:
    async with early() as s:
        await s.warm()
        client = await RawH2Client.open(s.proxy.port)
        sid = client.request(
            b"/attack", method=b"POST", end=False, fields=((b"content-length", b"5"),)
        )
        client.data(sid, b"hello")
        await client.send()
        await s.upstream.wait_heads(2)
        client.data(sid, SMUGGLED, end=True)
        await client.send()
        outcome = await client.outcome(sid)
        client.close()
        # its own early answer, or the connection refused for the extra DATA
        assert outcome.body in (b"", b"answer to /attack")
        assert outcome.status == 200 or outcome.goaway is not None or client.closed
        await assert_the_victim_is_served_alone(s, {b"/attack"})
        (attack,) = [head for head in s.upstream.heads if head.target == b"/attack"]
        assert attack.all(b"content-length") == []


async def test_a_lying_stream_on_a_pooled_connection_leaves_the_next_user_alone() -> None:
    """The reported attack: the attacker's stream and a second user share the
    upstream connection the pool keeps."""
    async with early() as s:
        await s.warm()
        for _ in range(3):
            client = await RawH2Client.open(s.proxy.port)
            sid = client.request(
                b"/attack", method=b"POST", end=True, fields=((b"content-length", b"189"),)
            )
            await client.send()
            await client.outcome(sid)
            client.close()
            response = await s.victim()
            assert response.text == "answer to /victim"
        assert s.upstream.targets == [b"/warm"] + [b"/victim"] * 3
        assert all(head.body == b"" for head in s.upstream.heads)


# --- the framing the proxy sends -----------------------------------------------------


FRAMINGS = {
    # (method, declared content-length, DATA frames, sent in one read): framing upstream
    "GET without a body": (b"GET", None, [], True, ([], [], b"")),
    "POST without a body": (b"POST", None, [], True, (["0"], [], b"")),
    "body whole in one read": (b"POST", None, [b"hello"], True, (["5"], [], b"hello")),
    "declared and counted": (b"PUT", b"0005", [b"hel", b"lo"], True, (["5"], [], b"hello")),
    "body still arriving": (b"POST", None, [b"abc", b"de"], False, ([], ["chunked"], b"abcde")),
}


@pytest.mark.parametrize(
    ("method", "declared", "frames", "one_read", "expected"), FRAMINGS.values(), ids=FRAMINGS
)
async def test_the_framing_upstream_is_counted_by_the_proxy(
    method: bytes,
    declared: bytes | None,
    frames: list[bytes],
    one_read: bool,
    expected: tuple[list[str], list[str], bytes],
) -> None:
    async with proxied() as setup:
        upstream, proxy = setup.upstream, setup.proxy
        client = await RawH2Client.open(proxy.port)
        fields = () if declared is None else ((b"content-length", declared),)
        sid = client.request(b"/t", method=method, end=not frames, fields=fields)
        for i, frame in enumerate(frames):
            client.data(sid, frame, end=i == len(frames) - 1)
            if not one_read:
                await client.send()
                await upstream.arrived.wait()  # the head went before the rest came
        await client.send()
        outcome = await client.outcome(sid)
        client.close()
        assert outcome.status == 200, outcome
        (seen,) = upstream.complete
        lengths, codings, body = expected
        assert (seen.all("content-length"), seen.all("transfer-encoding")) == (lengths, codings)
        assert seen.body == body


# --- pseudo-fields and fields ----------------------------------------------------------

MALFORMED_HEADS: dict[str, tuple[dict[bytes, bytes], tuple[tuple[bytes, bytes], ...]]] = {
    "space in method": ({b":method": b"GET /smuggled-method"}, ()),
    "tab in method": ({b":method": b"GET\t/x"}, ()),
    "lower-case method": ({b":method": b"get"}, ()),
    "unknown method": ({b":method": b"FOO"}, ()),
    "space in path": ({b":path": b"/a HTTP/1.1\x20"}, ()),
    "space inside path": ({b":path": b"/a /b"}, ()),
    "tab in path": ({b":path": b"/a\tb"}, ()),
    "0xff in path": ({b":path": b"/a\xffb"}, ()),
    "CR LF in path": ({b":path": b"/a\r\nX-Injected: 1"}, ()),
    "NUL in path": ({b":path": b"/a\x00"}, ()),
    "empty path": ({b":path": b""}, ()),
    "path without a slash": ({b":path": b"a/b"}, ()),
    "absolute path": ({b":path": b"http://evil/x"}, ()),
    "asterisk for GET": ({b":path": b"*"}, ()),
    "authority with a space": ({b":authority": b"svc evil"}, ()),
    "authority with userinfo": ({b":authority": b"user@svc"}, ()),
    "authority with a path": ({b":authority": b"svc/x"}, ()),
    "authority with CR LF": ({b":authority": b"svc\r\nX: 1"}, ()),
    "scheme ftp": ({b":scheme": b"ftp"}, ()),
    "scheme with a space": ({b":scheme": b"http x"}, ()),
    "upper-case field name": ({}, ((b"X-Upper", b"1"),)),
    "connection field": ({}, ((b"connection", b"close"),)),
    "transfer-encoding field": ({}, ((b"transfer-encoding", b"chunked"),)),
    "te other than trailers": ({}, ((b"te", b"gzip"),)),
    "LF in a value": ({}, ((b"x-a", b"1\nX-Injected: 1"),)),
    "control character in a value": ({}, ((b"x-a", b"1\x01"),)),
    "field name not a token": ({}, ((b"x(a)", b"1"),)),
    "two lengths that differ": ({}, ((b"content-length", b"1"), (b"content-length", b"2"))),
}


@pytest.mark.parametrize(("pseudo", "fields"), MALFORMED_HEADS.values(), ids=MALFORMED_HEADS)
async def test_a_malformed_head_is_refused_and_never_reaches_the_upstream(
    pseudo: dict[bytes, bytes], fields: tuple[tuple[bytes, bytes], ...]
) -> None:
    async with early() as s:
        client = await RawH2Client.open(s.proxy.port)
        sid = client.request(b"/m", end=True, pseudo=pseudo, fields=fields)
        await client.send()
        outcome = await client.outcome(sid)
        client.close()
        refused = outcome.status == 400 or outcome.reset is not None
        assert refused or outcome.goaway is not None or client.closed, outcome
        assert s.upstream.heads == []
        assert sum(s.proxy.metrics.rejected.values()) == 1
        response = await s.victim()  # the proxy goes on serving
        assert response.text == "answer to /victim"


WELL_FORMED = {
    "OPTIONS asterisk": ({b":method": b"OPTIONS", b":path": b"*"}, b"*"),
    "query and percent": ({b":path": b"/a?q=%20x&r=~"}, b"/a?q=%20x&r=~"),
    "authority with port": ({b":authority": b"svc:8080"}, b"/m"),
    "IPv6 authority": ({b":authority": b"[::1]:80"}, b"/m"),
    "https scheme": ({b":scheme": b"https"}, b"/m"),
}


@pytest.mark.parametrize(("pseudo", "target"), WELL_FORMED.values(), ids=WELL_FORMED)
async def test_a_well_formed_head_is_forwarded(pseudo: dict[bytes, bytes], target: bytes) -> None:
    async with early() as s:
        client = await RawH2Client.open(s.proxy.port)
        sid = client.request(b"/m", end=True, pseudo=pseudo)
        await client.send()
        outcome: Outcome = await client.outcome(sid)
        client.close()
        assert outcome.status == 200
        assert s.upstream.targets == [target]
        assert s.proxy.metrics.rejected == {}


# --- answered before the request was all sent ------------------------------------------


async def test_an_answer_before_an_http1_body_closes_the_upstream_connection() -> None:
    """Response-queue poisoning: a body that is a request, sent once the upstream
    (which ignores bodies) has answered, never reaches it."""
    async with early(drains=False) as s:
        await s.warm()
        reader, writer = await asyncio.open_connection("127.0.0.1", s.proxy.port)
        head = b"POST /ignore HTTP/1.1\r\nHost: svc\r\nContent-Length: %d\r\n\r\n"
        writer.write(head % len(SMUGGLED))
        await writer.drain()
        answer = await reader.readuntil(b"answer to /ignore")
        assert answer.startswith(b"HTTP/1.1 200 ")
        writer.write(SMUGGLED)
        await writer.drain()
        await s.upstream.wait_closed(1)  # the connection that answered early
        await assert_the_victim_is_served_alone(s, {b"/ignore"})
        writer.close()
        assert b"/smuggled" not in s.upstream.targets


async def test_an_answer_before_an_h2_body_closes_the_upstream_connection() -> None:
    async with early(drains=False) as s:
        await s.warm()
        client = await RawH2Client.open(s.proxy.port)
        sid = client.request(b"/ignore", method=b"POST", end=False)
        client.data(sid, b"x")
        await client.send()
        await s.upstream.wait_heads(2)
        await s.upstream.wait_closed(1)  # answered before the end: not pooled
        client.data(sid, SMUGGLED, end=True)
        await client.send()
        outcome = await client.outcome(sid)
        client.close()
        assert outcome.status == 200 and outcome.body == b"answer to /ignore"
        await assert_the_victim_is_served_alone(s, {b"/ignore"})
        assert b"/smuggled" not in s.upstream.targets


# --- the other directions: HTTP/2 upstreams ----------------------------------------------


@asynccontextmanager
async def h2_upstream() -> AsyncIterator[tuple[H2Upstream, ProxyServer]]:
    upstream = H2Upstream()
    await upstream.start()
    try:
        async with proxy_to(upstream.url) as proxy:
            yield upstream, proxy
    finally:
        await upstream.stop()


@pytest.mark.parametrize("short", [False, True], ids=["END_STREAM on HEADERS", "short DATA"])
async def test_a_lying_stream_to_an_http2_upstream_is_reset_and_never_completes(
    short: bool,
) -> None:
    async with h2_upstream() as (upstream, proxy):
        client = await RawH2Client.open(proxy.port)
        fields = ((b"content-length", b"189"),)
        sid = client.request(b"/attack", method=b"POST", end=not short, fields=fields)
        if short:
            client.data(sid, b"abc")
            client.trailers(sid, [(b"x-checksum", b"1")])
        await client.send()
        outcome = await client.outcome(sid)
        assert outcome.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR
        sid = client.request(b"/echo")  # the connection goes on
        await client.send()
        assert (await client.outcome(sid)).status == 200
        client.close()
        assert [seen.path for seen in upstream.answered] == ["/echo"]
        assert proxy.metrics.rejected == {"h2_content_length": 1}


async def test_an_http2_response_whose_length_is_a_lie_is_a_502_to_an_http1_client() -> None:
    async with (
        h2_upstream() as (_, proxy),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy.port}") as c,
    ):
        response = await c.get("/lying-length", timeout=5)
        assert response.status_code == 502
        assert (await c.get("/echo", timeout=5)).status_code == 200


async def test_an_http2_response_shorter_than_its_length_cuts_the_http1_client() -> None:
    async with h2_upstream() as (_, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET /short-length HTTP/1.1\r\nHost: svc\r\n\r\n")
        writer.write(b"GET /echo HTTP/1.1\r\nHost: svc\r\n\r\n")
        data, closed = await read_all(reader)
        writer.close()
        assert closed
        # nothing, or the head and the 10 bytes that came: never a byte of the second
        # answer where the client waits for the rest of the first
        assert data.count(b"HTTP/1.1 ") <= 1
        assert data == b"" or data.endswith(b"\r\n\r\n" + b"s" * 10)


async def test_an_http1_answer_begun_before_the_request_ended_is_not_pooled() -> None:
    """The upstream sent its head before the body was all in, and the rest of the
    answer after: it may not have read that body, so its connection serves no one else."""
    async with early() as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.proxy.port)
        writer.write(b"POST /held HTTP/1.1\r\nHost: svc\r\nContent-Length: 3\r\n\r\n")
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        writer.write(b"abc")
        await writer.drain()
        s.upstream.hold.set()
        assert await reader.readuntil(b"answer to /held")
        writer.close()
        await s.upstream.wait_closed(1)
        await assert_the_victim_is_served_alone(s, {b"/held"})
        assert s.upstream.connections == 2


async def test_an_h2_answer_begun_before_the_stream_ended_is_not_pooled() -> None:
    async with early() as s:
        client = await RawH2Client.open(s.proxy.port)
        sid = client.request(b"/held", method=b"POST", end=False)
        client.data(sid, b"ab")
        await client.send()
        assert (await client.outcome(sid, head=True)).status == 200
        client.data(sid, b"c", end=True)
        await client.send()
        s.upstream.hold.set()
        outcome = await client.outcome(sid)
        client.close()
        assert outcome.body == b"answer to /held"
        await s.upstream.wait_closed(1)
        await assert_the_victim_is_served_alone(s, {b"/held"})
        assert s.upstream.connections == 2


async def test_a_lying_stream_waiting_in_the_overload_queue_leaves_it_and_is_reset() -> None:
    async with harness(http2=True) as h:
        guard = protect(h.proxy, queue_size=2, queue_timeout_ms=30_000, light_shed_share=1.0)
        held = [asyncio.create_task(h.client.get("/slow")) for _ in range(2)]
        await arrived(h.baseline.requests, 2)  # both places taken
        client = await RawH2Client.open(h.proxy.port)
        sid = client.request(
            b"/attack", method=b"POST", end=False, fields=((b"content-length", b"100"),)
        )
        client.data(sid, SMUGGLED)
        await client.send()
        await queued(guard, 1)
        client.trailers(sid, [(b"x-checksum", b"1")])
        await client.send()
        outcome = await client.outcome(sid)
        client.close()
        assert outcome.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR
        gate = next(iter(guard.gates.values()))
        assert (gate.in_flight, len(gate.waiting)) == (2, 0)
        h.baseline.release.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
        assert len(h.baseline.requests) == 2  # the lying stream never reached it
        assert h.proxy.metrics.rejected == {"h2_content_length": 1}


async def test_an_http1_length_reaches_an_http2_upstream_as_the_parser_framed_it() -> None:
    async with h2_upstream() as (upstream, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: svc\r\nContent-Length: 005\r\n\r\nhello")
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
        (seen,) = upstream.answered
        assert [value for name, value in seen.fields if name == "content-length"] == ["5"]
        assert seen.body_len == 5


class LateUpstream:
    """Answers each head at once and ignores bodies; on command it sends, on the
    connection that asked for /late, a response no request asked for (what an upstream
    that ignores bodies does when it answers a smuggled body late)."""

    def __init__(self) -> None:
        self.targets: list[bytes] = []
        self.connections = 0
        self.late: asyncio.StreamWriter | None = None
        self.late_closed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def send_unasked(self) -> None:
        assert self.late is not None
        body = b"SECRET: the answer to a request someone smuggled"
        self.late.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await self.late.drain()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        late = False
        buffered = b""
        try:
            while data := await reader.read(65536):
                buffered += data
                while b"\r\n\r\n" in buffered:
                    head, _, buffered = buffered.partition(b"\r\n\r\n")
                    target = head.split(b" ")[1]
                    self.targets.append(target)
                    body = b"answer to " + target
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                    writer.write(body)
                    if target == b"/late":
                        self.late, late = writer, True
        except ConnectionError:
            pass
        finally:
            if late:
                self.late_closed.set()
            writer.close()


@asynccontextmanager
async def late_upstream() -> AsyncIterator[tuple[LateUpstream, ProxyServer]]:
    upstream = LateUpstream()
    await upstream.start()
    try:
        async with proxy_to(f"http://127.0.0.1:{upstream.port}") as proxy:
            yield upstream, proxy
    finally:
        await upstream.stop()


async def test_bytes_sent_before_a_stream_wrote_its_head_are_never_its_answer() -> None:
    async with late_upstream() as (upstream, proxy):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy.port}") as c:
            assert (await c.get("/late", timeout=5)).text == "answer to /late"  # now pooled
        victim = await RawH2Client.open(proxy.port)
        sid = victim.request(
            b"/victim", method=b"POST", end=False, fields=((b"authorization", b"Bearer victim"),)
        )
        await victim.ping()  # its HEADERS are in; its body has not come yet
        await upstream.send_unasked()
        # nothing was owed on that connection: the proxy closes it
        async with asyncio.timeout(5):
            await upstream.late_closed.wait()
        victim.data(sid, b"victim body", end=True)
        await victim.send()
        outcome = await victim.outcome(sid)
        victim.close()
        assert (outcome.status, outcome.body) == (200, b"answer to /victim")
        assert upstream.targets == [b"/late", b"/victim"]


async def test_streams_that_sent_only_their_headers_hold_no_upstream_connection() -> None:
    async with late_upstream() as (upstream, proxy):
        client = await RawH2Client.open(proxy.port)
        sids = [client.request(f"/s{i}".encode(), method=b"POST", end=False) for i in range(20)]
        await client.ping()
        # a whole request through the proxy meanwhile: connects begun before it are in
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy.port}") as c:
            assert (await c.get("/sync", timeout=5)).text == "answer to /sync"
        assert upstream.connections == 1
        for sid in sids:
            client.data(sid, b"body", end=True)
        await client.send()
        outcomes = [await client.outcome(sid) for sid in sids]
        client.close()
        assert [o.body for o in outcomes] == [f"answer to /s{i}".encode() for i in range(20)]


@pytest.mark.parametrize(
    "trailers",
    [
        [(b"x-a", b"a\x0bb")],  # a control character
        [(b"x-a", b"a\x7f")],
        [(b'x"y', b"1")],  # not a token
        [(b"a(b)", b"2")],
        [(b"content-length;", b"9")],
    ],
)
async def test_a_request_trailer_a_head_could_not_carry_resets_the_stream(
    trailers: list[tuple[bytes, bytes]],
) -> None:
    async with early() as s:
        client = await RawH2Client.open(s.proxy.port)
        sid = client.request(b"/t", method=b"POST", end=False)
        client.data(sid, b"abc")
        client.trailers(sid, trailers)
        await client.send()
        outcome = await client.outcome(sid)
        # the answer may have begun before the trailers came; no trailer went upstream
        assert outcome.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR or outcome.status == 200
        assert all(head.trailers in (None, [], b"") for head in s.upstream.heads)
        assert s.proxy.metrics.rejected.get("h2_bad_trailer", 0) == 1
        await assert_the_victim_is_served_alone(s, {b"/t"})
