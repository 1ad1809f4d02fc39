"""HTTP/2 upstreams: HTTP/1.1 clients reaching them, and what the upstream does to
the proxy's multiplexed connection (GOAWAY, its stream limit, silence).

The upstreams are real peers: grpcio servers, and `H2Upstream`, driven frame by frame
with the `h2` library; the clients are httpx (HTTP/1.1 and HTTP/2) and plain sockets
where the test reads the bytes of a chunked trailer section.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from controlplane.kernel.codec import GRPC_STATUS, TIMEOUT
from sidecar.proxy import ProxyOptions, ProxyServer
from tests.sidecar import upstreams
from tests.sidecar.grpc_upstream import GrpcUpstream
from tests.sidecar.h2_upstream import H2Upstream
from tests.sidecar.proxy_harness import HeaderChooser, ListRecorder

H2 = {"x-test-variant": "h2"}


@dataclass
class Rig:
    h2: H2Upstream
    grpc: GrpcUpstream
    http1: upstreams.Upstream
    recorder: ListRecorder
    proxy: ProxyServer

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    async def outcomes(self, count: int) -> list[tuple[str, int]]:
        self.proxy.flush_samples()
        samples = await self.recorder.wait_for(count)
        return [(s.variant, s.outcome) for s in samples]


@asynccontextmanager
async def rig(
    options: ProxyOptions | None = None, upstream: H2Upstream | None = None
) -> AsyncIterator[Rig]:
    h2_up = upstream or H2Upstream()
    grpc_up, http1 = GrpcUpstream("grpc"), upstreams.Upstream("http1")
    for server in (h2_up, grpc_up, http1):
        await server.start()
    chooser = HeaderChooser({"h2": h2_up.url, "grpc": grpc_up.url, "http1": http1.url})
    recorder = ListRecorder()
    proxy = ProxyServer(chooser, recorder, options=options or ProxyOptions(read_timeout=10))
    await proxy.start("127.0.0.1", 0)
    try:
        yield Rig(h2_up, grpc_up, http1, recorder, proxy)
    finally:
        await proxy.stop(timeout=2)
        for server in (h2_up, grpc_up, http1):
            await server.stop()


async def exchange(port: int, request: bytes) -> bytes:
    """Send raw request bytes, read until the proxy closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    async with asyncio.timeout(10):
        answer = await reader.read()
    writer.close()
    return answer


def dechunk(body: bytes) -> tuple[bytes, bytes]:
    """A chunked body's payload and its trailer section."""
    payload = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return payload, body
        payload, body = payload + body[:size], body[size + 2 :]


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


# --- HTTP/1.1 clients to an HTTP/2 upstream -----------------------------------------


async def test_http1_requests_reach_an_h2c_upstream_as_streams() -> None:
    async with rig() as r, httpx.AsyncClient(base_url=r.base, timeout=10) as client:
        response = await client.get(
            "/echo?q=1",
            headers={**H2, "te": "trailers", "connection": "keep-alive, x-hop", "x-hop": "1"},
        )
        assert response.http_version == "HTTP/1.1"
        assert response.status_code == 200
        assert response.headers["x-canary-variant"] == "h2"
        seen = response.json()
        assert (seen["method"], seen["path"]) == ("GET", "/echo?q=1")
        fields = dict(seen["fields"])
        assert fields["te"] == "trailers"  # the one TE HTTP/2 allows
        assert "x-hop" not in fields and "connection" not in fields  # hop-by-hop
        assert fields["x-canary-variant"] == "h2"
        assert fields["x-forwarded-for"] == "127.0.0.1"

        body = bytes(range(256)) * 8192  # 2 MiB: many windows' worth, both ways
        upload = await client.post("/echo", content=body, headers=H2)
        assert upload.json()["body_len"] == len(body)

        async def pieces() -> AsyncIterator[bytes]:
            for _ in range(64):
                yield b"z" * 10_000

        streamed = await client.post("/echo", content=pieces(), headers=H2)  # chunked
        assert streamed.json()["body_len"] == 640_000
        assert "content-length" not in dict(streamed.json()["fields"])
        download = await client.get("/download/3000000", headers=H2)
        assert download.headers["content-length"] == "3000000"
        assert len(download.content) == 3_000_000
        assert await r.outcomes(4) == [("h2", 200)] * 4
        assert r.h2.connections == 1  # one multiplexed connection for every request


async def test_trailers_reach_an_http1_client_as_a_chunked_trailer_section() -> None:
    async with rig() as r:
        answer = await exchange(
            r.proxy.port,
            b"GET /trailers HTTP/1.1\r\nHost: svc\r\nTE: trailers\r\nx-test-variant: h2\r\n"
            b"Connection: close\r\n\r\n",
        )
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"\r\nTransfer-Encoding: chunked" in head
        payload, trailers = dechunk(body)
        assert payload == b"t" * 1000
        assert trailers == b"x-checksum: 1000\r\ngrpc-status: 0\r\n\r\n"

        # an HTTP/1.0 client cannot take chunked: the body runs to the close, no trailers
        answer = await exchange(
            r.proxy.port, b"GET /trailers HTTP/1.0\r\nHost: svc\r\nx-test-variant: h2\r\n\r\n"
        )
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"chunked" not in head
        assert body == b"t" * 1000
        assert await r.outcomes(2) == [("h2", 200)] * 2


async def test_a_grpc_call_over_http1_is_recorded_with_its_grpc_status() -> None:
    async with rig() as r:
        message = b"fail:5"
        frame = b"\x00" + struct.pack(">I", len(message)) + message
        answer = await exchange(
            r.proxy.port,
            b"POST /test.Echo/Echo HTTP/1.1\r\nHost: svc\r\nContent-Type: application/grpc\r\n"
            b"TE: trailers\r\nx-test-variant: grpc\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(frame), frame),
        )
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        if b"chunked" in head:
            _, trailers = dechunk(body)
            assert b"grpc-status: 5\r\n" in trailers
        else:  # trailers-only: the status is in the head
            assert b"\r\ngrpc-status: 5" in head
        assert await r.outcomes(1) == [("grpc", GRPC_STATUS + 5)]


async def test_upgrade_h2c_is_ignored_and_the_request_served_as_http1() -> None:
    async with rig() as r:
        answer = await exchange(
            r.proxy.port,
            b"GET /echo HTTP/1.1\r\nHost: svc\r\nx-test-variant: http1\r\n"
            b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 200 ")  # not 101 Switching Protocols
        (seen,) = r.http1.requests
        names = {name.lower() for name, _ in seen.headers}
        assert not names & {"upgrade", "http2-settings", "connection"}
        assert await r.outcomes(1) == [("http1", 200)]


# --- what the upstream does to the multiplexed connection --------------------------


async def test_goaway_retries_the_unprocessed_stream_on_a_fresh_connection() -> None:
    upstream = H2Upstream(goaway_after=1)
    async with rig(upstream=upstream) as r, httpx.AsyncClient(base_url=r.base, timeout=10) as c:
        first = await c.get("/echo", headers=H2)
        assert first.status_code == 200
        # the upstream answers the second head with GOAWAY(last stream 1): not processed
        second = await c.get("/echo?again", headers=H2)
        assert second.status_code == 200
        assert second.json()["path"] == "/echo?again"
        assert upstream.connections == 2
        assert upstream.paths == ["/echo", "/echo?again"]  # the GOAWAY'd head is not counted
        assert r.proxy.metrics.upstream_retries == 1
        assert await r.outcomes(2) == [("h2", 200)] * 2


async def test_goaway_does_not_replay_a_stream_the_upstream_processed() -> None:
    upstream = H2Upstream(goaway_after=1)
    async with (
        rig(upstream=upstream) as r,
        httpx.AsyncClient(http1=False, http2=True, base_url=r.base, timeout=10) as client,
    ):
        hung = asyncio.create_task(client.get("/hang", headers=H2))
        await upstream.wait_started(1)
        # GOAWAY(last stream 1) and close: /hang was processed, the new head was not
        fresh = await client.get("/echo", headers=H2)
        assert fresh.status_code == 200
        lost = await hung
        assert lost.status_code == 502
        assert upstream.paths == ["/hang", "/echo"]  # /hang reached it once, never again
        assert r.proxy.metrics.upstream_retries == 1
        assert sorted(await r.outcomes(2)) == [("h2", 200), ("h2", 502)]


async def test_an_upstream_that_does_not_answer_times_out_with_504() -> None:
    async with (
        rig(ProxyOptions(read_timeout=0.3)) as r,
        httpx.AsyncClient(base_url=r.base, timeout=10) as http1,
        httpx.AsyncClient(http1=False, http2=True, base_url=r.base, timeout=10) as http2,
    ):
        for client in (http1, http2):
            response = await client.get("/hang", headers=H2)
            assert response.status_code == 504
            assert response.headers["content-type"] == "application/problem+json"
        assert await r.outcomes(2) == [("h2", TIMEOUT)] * 2
        await until(lambda: r.h2.open_streams == 0)  # both streams were reset upstream
        assert (await http1.get("/echo", headers=H2)).status_code == 200


async def test_the_upstreams_stream_limit_is_kept_and_the_queue_is_bounded() -> None:
    upstream = H2Upstream(max_streams=2)
    options = ProxyOptions(read_timeout=1.0, h2_max_waiting=3)
    async with (
        rig(options, upstream) as r,
        httpx.AsyncClient(base_url=r.base, timeout=10) as client,
    ):
        # the first answer comes after the upstream's SETTINGS: the limit is known
        assert (await client.get("/echo", headers=H2)).status_code == 200
        hung = [asyncio.create_task(client.get("/hang", headers=H2)) for _ in range(2)]
        await upstream.wait_started(3)
        waiting = [asyncio.create_task(client.get("/echo", headers=H2)) for _ in range(3)]
        pool = next(iter(r.proxy.h2.pools.values()))
        await until(lambda: len(pool.waiting) == 3)
        refused = await client.get("/echo", headers=H2)
        assert refused.status_code == 503
        assert "wait for a stream" in refused.json()["detail"]
        assert r.proxy.metrics.rejected == {"h2_upstream_queue_full": 1}
        # the hung streams time out, and the waiting requests take their places
        assert [(await task).status_code for task in hung] == [504, 504]
        assert [(await task).status_code for task in waiting] == [200, 200, 200]
        assert upstream.peak_streams == 2
        outcomes = sorted(outcome for _, outcome in await r.outcomes(7))
        assert outcomes == sorted([200, 503, TIMEOUT, TIMEOUT, 200, 200, 200])


async def test_100_continue_from_an_h2c_upstream_reaches_an_http1_client() -> None:
    """The client sends its body only once 100 Continue arrives: without the relay
    passing the upstream's informational response on, it would wait in vain."""
    async with rig() as r:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.proxy.port)
        try:
            writer.write(
                b"POST /echo HTTP/1.1\r\nHost: t\r\nX-Test-Variant: h2\r\n"
                b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\n"
            )
            async with asyncio.timeout(5):
                interim = await reader.readuntil(b"\r\n\r\n")
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"hello")
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":", 1)[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                )
                body = await reader.readexactly(length)
        finally:
            writer.close()
        assert head.startswith(b"HTTP/1.1 200 ")
        seen = json.loads(body)
        assert seen["body_len"] == 5
        assert dict(seen["fields"])["expect"] == "100-continue"
        assert await r.outcomes(1) == [("h2", 200)]


async def test_an_http1_0_client_is_sent_no_100_continue() -> None:
    async with rig() as r:
        answer = await exchange(
            r.proxy.port,
            b"POST /echo HTTP/1.0\r\nHost: t\r\nX-Test-Variant: h2\r\n"
            b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\nhello",
        )
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert b" 100 " not in answer.split(b"\r\n", 1)[0]
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["body_len"] == 5
