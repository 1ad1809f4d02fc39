"""The header-field count bound: HTTP/1.1 heads, chunked trailers, HTTP/2 header blocks.

Raw sockets against the real proxy; the upstream (h11) records what reached it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import h2.errors
import h2.events
import httpx

from sidecar.proxy import ProxyOptions
from tests.sidecar import upstreams
from tests.sidecar.test_connection_limits import until_serving
from tests.sidecar.test_proxy_h2 import RawClient, assert_still_serving, rig
from tests.sidecar.test_smuggling import proxied, send, statuses
from tests.support.processes import free_port


def h2_get(client: RawClient, count: int) -> int:
    """A GET to the HTTP/1.1 upstream with `count` more fields; its stream id."""
    sid: int = client.h2.get_next_available_stream_id()
    headers = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"proxy"),
               (b":path", b"/echo"), (b"x-test-variant", b"http1")]  # fmt: skip
    headers += [(b"x-f%d" % i, b"v") for i in range(count)]
    client.h2.send_headers(sid, headers, end_stream=True)
    return sid


def fields(count: int) -> bytes:
    return b"".join(b"X-F%d: v\r\n" % i for i in range(count))


async def test_a_head_of_200_fields_gets_431_and_is_counted() -> None:
    async with proxied() as s:
        data, closed = await send(
            s.proxy.port, b"GET /t HTTP/1.1\r\nHost: svc\r\n" + fields(200) + b"\r\n"
        )
        assert statuses(data) == [431] and closed
        assert b"more than 100 header fields" in data
        assert s.proxy.metrics.rejected == {"too_many_headers": 1}
        assert s.upstream.heads == []


async def test_a_head_at_the_bound_is_forwarded() -> None:
    async with proxied(ProxyOptions(max_header_count=20, read_timeout=10)) as s:
        # Host is one of the 20
        head = b"GET /t HTTP/1.1\r\nHost: svc\r\n" + fields(19) + b"Connection: close\r\n\r\n"
        data, _ = await send(s.proxy.port, head)
        assert statuses(data) == [431]
        data, _ = await send(s.proxy.port, head.replace(b"X-F0: v\r\n", b""))
        assert statuses(data) == [200]
        assert len(s.upstream.complete) == 1
        assert s.proxy.metrics.rejected == {"too_many_headers": 1}


async def test_too_many_trailer_fields_cut_the_request_and_are_counted() -> None:
    async with proxied(ProxyOptions(max_header_count=10, read_timeout=10)) as s:
        head = b"POST /t HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n"
        data, closed = await send(s.proxy.port, head + b"3\r\nabc\r\n0\r\n" + fields(11) + b"\r\n")
        assert closed
        assert 200 not in statuses(data)
        assert s.proxy.metrics.rejected == {"too_many_trailers": 1}
        assert not s.upstream.complete  # the upstream never saw a complete request
        # ten trailer fields pass
        data, _ = await send(
            s.proxy.port,
            head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
            + b"3\r\nabc\r\n0\r\n"
            + fields(10)
            + b"\r\n",
        )
        assert statuses(data) == [200]


async def test_an_http2_header_block_over_the_bound_gets_431_and_is_counted() -> None:
    async with rig(ProxyOptions(max_header_count=50, read_timeout=10)) as r:
        client = await RawClient.open(r.proxy.port)
        sid = h2_get(client, 60)
        await client.send()
        events: list[h2.events.Event] = []
        while not any(isinstance(e, h2.events.StreamEnded) for e in events):
            events += client.h2.receive_data(await client.reader.read(65536))
        answer = next(e for e in events if isinstance(e, h2.events.ResponseReceived))
        assert answer.stream_id == sid and (b":status", b"431") in answer.headers
        client.writer.close()
        assert r.proxy.metrics.rejected == {"h2_too_many_headers": 1}
        assert r.http1.requests == []
        # at the bound, pseudo-fields aside, the request is served
        client = await RawClient.open(r.proxy.port)
        sid = h2_get(client, 49)  # and x-test-variant: 50
        await client.send()
        events = []
        while not any(isinstance(e, h2.events.StreamEnded) for e in events):
            events += client.h2.receive_data(await client.reader.read(65536))
        answer = next(e for e in events if isinstance(e, h2.events.ResponseReceived))
        assert (b":status", b"200") in answer.headers
        client.writer.close()
        await assert_still_serving(r)


async def test_http2_trailers_over_the_bound_reset_the_stream_and_are_counted() -> None:
    async with rig(ProxyOptions(max_header_count=10, read_timeout=10)) as r:
        client = await RawClient.open(r.proxy.port)
        sid = client.request(b"/echo", end=False)
        client.h2.send_data(sid, b"abc")
        client.h2.send_headers(sid, [(b"x-t%d" % i, b"v") for i in range(11)], end_stream=True)
        await client.send()
        events: list[h2.events.Event] = []
        while not any(isinstance(e, h2.events.StreamReset) for e in events):
            events += client.h2.receive_data(await client.reader.read(65536))
        reset = next(e for e in events if isinstance(e, h2.events.StreamReset))
        assert reset.stream_id == sid
        assert reset.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
        client.writer.close()
        assert r.proxy.metrics.rejected == {"h2_too_many_trailers": 1}
        await assert_still_serving(r)


async def test_the_field_bound_reaches_every_worker_of_the_command() -> None:
    upstream = upstreams.Upstream("default")
    await upstream.start()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "sidecar", "--service", "web",
         "--listen", f"127.0.0.1:{port}", "--etcd", "memory://", "--redis", "memory://",
         "--default-upstream", upstream.url, "--workers", "2", "--max-headers", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=3) as client:
            await until_serving(client, f"http://127.0.0.1:{port}/echo", proc)
        head = b"GET /echo HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n"
        for _ in range(8):  # new connections, spread over both workers
            data, _ = await send(port, head + fields(4) + b"\r\n")
            assert statuses(data) == [431]
            data, _ = await send(port, head + fields(3) + b"\r\n")
            assert statuses(data) == [200]
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.communicate, timeout=30)
        await upstream.stop()
