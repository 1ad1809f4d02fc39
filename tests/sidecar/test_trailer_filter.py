"""One trailer filter on every path: HTTP/1.1 chunked trailer sections and HTTP/2
trailing HEADERS, of requests and of responses. Fields the head is acted on by
(framing, routing, credentials, request modifiers, content format, the proxy's own
and forwarding fields) never travel as trailers; others (grpc-status, a checksum) do.
Each dropped field is counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from sidecar.proxy.trailers import trailer_allowed
from tests.sidecar.early_upstream import EarlyUpstream
from tests.sidecar.h2_raw_client import Pair, RawH2Client
from tests.sidecar.h2_upstream import H2Upstream
from tests.sidecar.proxy_harness import proxy_to

ALLOWED: list[Pair] = [
    (b"grpc-status", b"0"),
    (b"grpc-message", b"fine"),
    (b"x-checksum", b"abc"),
]
# legal in an HTTP/2 trailing HEADERS (h2 refuses connection-specific ones itself)
NEVER_H2: list[Pair] = [
    (b"content-length", b"99"),
    (b"host", b"evil"),
    (b"authorization", b"Bearer stolen"),
    (b"proxy-authorization", b"Basic x"),
    (b"cookie", b"session=evil"),
    (b"set-cookie", b"session=evil"),
    (b"content-type", b"text/evil"),
    (b"content-encoding", b"gzip"),
    (b"content-range", b"bytes 0-1/2"),
    (b"range", b"bytes=0-1"),
    (b"expect", b"100-continue"),
    (b"max-forwards", b"0"),
    (b"if-match", b"*"),
    (b"cache-control", b"no-store"),
    (b"x-canary-variant", b"canary"),
    (b"x-canary-experiment", b"exp-9"),
    (b"x-canary-degrade", b"1"),
    (b"x-forwarded-for", b"6.6.6.6"),
    (b"x-forwarded-proto", b"https"),
    (b"x-forwarded-host", b"evil"),
    (b"forwarded", b"for=6.6.6.6"),
    (b"via", b"1.1 evil"),
    (b"te", b"trailers"),
    (b"trailer", b"x-checksum"),
]
# in an HTTP/1.1 chunked trailer section the hop-by-hop ones as well; a Content-Length
# there makes httptools refuse the whole message (framing in doubt), so it is not here
NEVER_H1: list[Pair] = [
    *(pair for pair in NEVER_H2 if pair[0] != b"content-length"),
    (b"connection", b"close"),
    (b"keep-alive", b"1"),
]


def section(pairs: list[Pair]) -> bytes:
    return b"".join(b"%s: %s\r\n" % pair for pair in pairs)


def chunked_post(target: bytes) -> bytes:
    """An HTTP/1.1 request whose chunked body ends with every trailer, allowed or not."""
    head = b"POST %s HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n" % target
    return head + b"4\r\nbody\r\n0\r\n" + section(ALLOWED + NEVER_H1) + b"\r\n"


def test_every_never_field_is_refused_and_the_others_allowed() -> None:
    assert [name for name, _ in NEVER_H1 + NEVER_H2 if trailer_allowed(name, None)] == []
    assert all(trailer_allowed(name, None) for name, _ in ALLOWED)
    assert not trailer_allowed(b"x-checksum", frozenset({b"x-checksum"}))  # Connection names it


@asynccontextmanager
async def h1_upstream() -> AsyncIterator[EarlyUpstream]:
    upstream = EarlyUpstream(response_trailers=section(ALLOWED + NEVER_H1))
    await upstream.start()
    try:
        yield upstream
    finally:
        await upstream.stop()


@asynccontextmanager
async def h2_upstream() -> AsyncIterator[H2Upstream]:
    upstream = H2Upstream()
    upstream.extra_trailers = [
        (name.decode(), value.decode()) for name, value in ALLOWED[1:] + NEVER_H2 if name != b"te"
    ]
    await upstream.start()
    try:
        yield upstream
    finally:
        await upstream.stop()


async def h2_post_with_trailers(port: int) -> None:
    client = await RawH2Client.open(port)
    sid = client.request(b"/t", method=b"POST", end=False)
    client.data(sid, b"body")
    client.trailers(sid, ALLOWED + NEVER_H2)
    await client.send()
    outcome = await client.outcome(sid)
    client.close()
    assert outcome.status == 200


async def test_http2_request_trailers_to_an_http1_upstream_keep_only_the_allowed() -> None:
    async with h1_upstream() as upstream, proxy_to(upstream.url) as proxy:
        await h2_post_with_trailers(proxy.port)
        (head,) = upstream.heads
        assert head.all(b"transfer-encoding") == [b"chunked"]
        async with asyncio.timeout(5):
            while not head.trailers:
                await asyncio.sleep(0.01)
        assert head.trailers == ALLOWED
        assert head.body == b"body"
        assert proxy.metrics.trailer_fields_dropped == len(NEVER_H2)


async def test_http1_request_trailers_keep_only_the_allowed() -> None:
    async with h1_upstream() as upstream, proxy_to(upstream.url) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(chunked_post(b"/t"))
        await reader.readuntil(b"answer to /t")
        async with asyncio.timeout(5):
            while not (upstream.heads and upstream.heads[0].trailers):
                await asyncio.sleep(0.01)
        writer.close()
        assert upstream.heads[0].trailers == ALLOWED
        assert proxy.metrics.trailer_fields_dropped == len(NEVER_H1)


async def test_http1_response_trailers_to_an_http2_client_keep_only_the_allowed() -> None:
    async with h1_upstream() as upstream, proxy_to(upstream.url) as proxy:
        client = await RawH2Client.open(proxy.port)
        sid = client.request(b"/trailers")
        await client.send()
        outcome = await client.outcome(sid)
        client.close()
        assert outcome.body == b"answer to /trailers"
        assert outcome.trailers == ALLOWED
        assert proxy.metrics.trailer_fields_dropped == len(NEVER_H1)


async def test_http1_response_trailers_to_an_http1_client_keep_only_the_allowed() -> None:
    async with h1_upstream() as upstream, proxy_to(upstream.url) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET /trailers HTTP/1.1\r\nHost: svc\r\n\r\n")
        answer = await reader.readuntil(b"\r\n0\r\n")
        trailers = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        assert answer.endswith(b"answer to /trailers\r\n0\r\n")
        assert trailers.lower() == section(ALLOWED) + b"\r\n"
        assert proxy.metrics.trailer_fields_dropped == len(NEVER_H1)


EXPECTED_FROM_H2 = [(b"x-checksum", b"1000"), (b"grpc-status", b"0"), *ALLOWED[1:]]


async def test_http2_response_trailers_to_an_http2_client_keep_only_the_allowed() -> None:
    async with h2_upstream() as upstream, proxy_to(upstream.url) as proxy:
        client = await RawH2Client.open(proxy.port)
        sid = client.request(b"/trailers")
        await client.send()
        outcome = await client.outcome(sid)
        client.close()
        assert outcome.trailers == EXPECTED_FROM_H2
        assert proxy.metrics.trailer_fields_dropped == len(NEVER_H2) - 1  # te: h2 refuses it


async def test_http2_response_trailers_to_an_http1_client_keep_only_the_allowed() -> None:
    async with h2_upstream() as upstream, proxy_to(upstream.url) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET /trailers HTTP/1.1\r\nHost: svc\r\n\r\n")
        await reader.readuntil(b"\r\n0\r\n")
        trailers = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        assert trailers == section(EXPECTED_FROM_H2) + b"\r\n"
        assert proxy.metrics.trailer_fields_dropped == len(NEVER_H2) - 1


async def test_http2_request_trailers_to_an_http2_upstream_keep_only_the_allowed() -> None:
    async with h2_upstream() as upstream, proxy_to(upstream.url) as proxy:
        await h2_post_with_trailers(proxy.port)
        (seen,) = upstream.answered
        assert seen.trailers == [(name.decode(), value.decode()) for name, value in ALLOWED]
        assert proxy.metrics.trailer_fields_dropped == len(NEVER_H2)


@pytest.mark.parametrize("http2", [False, True])
async def test_a_body_without_trailers_is_not_counted(http2: bool) -> None:
    async with h1_upstream() as upstream, proxy_to(upstream.url) as proxy:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{proxy.port}", http1=not http2, http2=http2
        ) as client:
            assert (await client.post("/t", content=b"abc")).status_code == 200
        assert proxy.metrics.trailer_fields_dropped == 0


async def test_http1_request_trailers_to_an_http2_upstream_keep_only_the_allowed() -> None:
    async with h2_upstream() as upstream, proxy_to(upstream.url) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(chunked_post(b"/echo"))
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
        (seen,) = upstream.answered
        assert seen.trailers == [(name.decode(), value.decode()) for name, value in ALLOWED]
        assert seen.body_len == 4
        assert proxy.metrics.trailer_fields_dropped == len(NEVER_H1)
