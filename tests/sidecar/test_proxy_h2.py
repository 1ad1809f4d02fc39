"""HTTP/2 and gRPC through the proxy, with real clients and servers on both sides.

grpcio clients and servers (h2c upstreams), httpx with HTTP/2 (prior knowledge, and
TLS with ALPN), the HTTP/1.1 test upstreams for translated streams, and the `h2`
library driving raw frames for the hostile cases.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import pytest

from controlplane.kernel.codec import GRPC_STATUS
from controlplane.kernel.routes import Route, RouteState, RouteVariant, Sticky
from sidecar.proxy import ProxyOptions, ProxyServer
from sidecar.routing import RouteTable
from tests.sidecar import upstreams
from tests.sidecar.grpc_upstream import GrpcUpstream, chat, count, echo
from tests.sidecar.proxy_harness import HeaderChooser, ListRecorder

CANARY = (("x-test-variant", "canary"),)


@dataclass
class Rig:
    grpc_baseline: GrpcUpstream
    grpc_canary: GrpcUpstream
    http1: upstreams.Upstream
    chooser: HeaderChooser
    recorder: ListRecorder
    proxy: ProxyServer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"

    async def samples(self, count: int) -> list[tuple[str, int]]:
        self.proxy.flush_samples()
        samples = await self.recorder.wait_for(count)
        return [(s.variant, s.outcome) for s in samples]


@asynccontextmanager
async def rig(options: ProxyOptions | None = None) -> AsyncIterator[Rig]:
    baseline, canary = GrpcUpstream("baseline"), GrpcUpstream("canary")
    http1 = upstreams.Upstream("http1")
    for upstream in (baseline, canary, http1):
        await upstream.start()
    chooser = HeaderChooser({"baseline": baseline.url, "canary": canary.url, "http1": http1.url})
    recorder = ListRecorder()
    proxy = ProxyServer(chooser, recorder, options=options or ProxyOptions(read_timeout=10))
    await proxy.start("127.0.0.1", 0)
    try:
        yield Rig(baseline, canary, http1, chooser, recorder, proxy)
    finally:
        await proxy.stop(timeout=2)
        for upstream in (baseline, canary, http1):
            await upstream.stop()


async def test_grpc_unary_and_streaming_calls_reach_the_chosen_variant() -> None:
    async with rig() as r, grpc.aio.insecure_channel(r.address) as channel:
        call = echo(channel)(b"hello", metadata=CANARY, timeout=10)
        assert await call == b"hello"
        assert ("x-served-by", "canary") in list(await call.trailing_metadata())
        assert ("x-canary-variant", "canary") in list(await call.initial_metadata())

        # 4 MB in 256 messages: far beyond every window, so flow control must move it
        stream = count(channel)(b"256:16384", timeout=10)
        received = [message async for message in stream]
        assert len(received) == 256 and all(len(m) == 16384 for m in received)
        assert received[255] == bytes([255]) * 16384
        assert ("x-served-by", "baseline") in list(await stream.trailing_metadata())

        conversation = chat(channel)(metadata=CANARY, timeout=10)
        for i in range(20):
            await conversation.write(b"message %d" % i)
            assert await conversation.read() == b"message %d" % i
        await conversation.done_writing()
        assert await conversation.read() == grpc.aio.EOF
        assert await conversation.code() == grpc.StatusCode.OK

        assert await r.samples(3) == [
            ("canary", GRPC_STATUS),
            ("baseline", GRPC_STATUS),
            ("canary", GRPC_STATUS),
        ]
        assert (r.grpc_baseline.calls, r.grpc_canary.calls) == (1, 2)


async def test_the_sample_outcome_is_the_grpc_status_trailers_only_included() -> None:
    async with rig() as r, grpc.aio.insecure_channel(r.address) as channel:
        for code in (14, 5, 0):
            request = b"fail:%d" % code if code else b"fine"
            try:
                await echo(channel)(request, metadata=CANARY, timeout=10)
            except grpc.aio.AioRpcError as exc:
                assert exc.code().value[0] == code
                assert exc.details() == "asked to fail"
            else:
                assert code == 0
        assert await r.samples(3) == [
            ("canary", GRPC_STATUS + 14),
            ("canary", GRPC_STATUS + 5),
            ("canary", GRPC_STATUS),
        ]


async def test_calls_multiplex_on_one_upstream_connection() -> None:
    async with rig() as r, grpc.aio.insecure_channel(r.address) as channel:
        calls = [echo(channel)(b"slow:50", timeout=10) for _ in range(40)]
        assert await asyncio.gather(*calls) == [b"slow:50"] * 40
        assert r.proxy.metrics.upstream_connects == 1
        outcomes = {outcome for _, outcome in await r.samples(40)}
        assert outcomes == {GRPC_STATUS}


async def test_grpc_calls_stick_to_their_users_variant() -> None:
    baseline, canary = GrpcUpstream("baseline"), GrpcUpstream("canary")
    await baseline.start()
    await canary.start()
    table = RouteTable()
    table.apply(
        Route(
            experiment=7, revision=1, salt="grpc", sticky=Sticky(header="x-user-id"),
            variants=(
                RouteVariant(name="baseline", upstream=baseline.url, weight=5000),
                RouteVariant(name="canary", upstream=canary.url, weight=5000),
            ),
            state=RouteState.RUNNING,
        )
    )  # fmt: skip
    recorder = ListRecorder()
    proxy = ProxyServer(table, recorder)
    await proxy.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
            served: dict[str, set[str]] = {}
            for _ in range(3):
                for user in range(20):
                    call = echo(channel)(
                        b"hi", metadata=(("x-user-id", f"user-{user}"),), timeout=10
                    )
                    await call
                    trailers = dict(list(await call.trailing_metadata()))
                    served.setdefault(f"user-{user}", set()).add(str(trailers["x-served-by"]))
            assert all(len(variants) == 1 for variants in served.values()), served
            assert {v for variants in served.values() for v in variants} == {"baseline", "canary"}
        proxy.flush_samples()
        samples = await recorder.wait_for(60)
        assert {s.experiment for s in samples} == {"7"}
        assert all(s.unit_hash != 0 and s.outcome == GRPC_STATUS for s in samples)
    finally:
        await proxy.stop(timeout=2)
        await baseline.stop()
        await canary.stop()


async def test_h2c_prior_knowledge_client_reaches_an_http1_upstream() -> None:
    async with (
        rig() as r,
        httpx.AsyncClient(
            http1=False, http2=True, base_url=f"http://{r.address}", timeout=10
        ) as client,
    ):
        headers = {"x-test-variant": "http1", "cookie": "a=1"}
        response = await client.get("/echo?q=1", headers=headers)
        assert response.http_version == "HTTP/2"
        assert response.status_code == 200
        assert response.headers["x-canary-variant"] == "http1"
        seen = response.json()
        assert seen["target"] == "/echo?q=1"
        names = {name.lower(): value for name, value in seen["headers"]}
        assert names["x-canary-variant"] == "http1"
        assert names["x-forwarded-for"] == "127.0.0.1"

        body = bytes(range(256)) * 8192  # 2 MiB: many windows' worth, both ways
        upload = await client.post("/upload", content=body, headers=headers)
        assert upload.status_code == 200
        assert upload.json()["body_len"] == len(body)

        async def pieces() -> AsyncIterator[bytes]:
            for _ in range(64):
                yield b"z" * 10_000

        # no length: the stream's body goes to the HTTP/1.1 upstream chunked
        streamed = await client.post("/upload", content=pieces(), headers=headers)
        assert streamed.json()["body_len"] == 640_000
        download = await client.get("/download/3000000", headers=headers)
        assert download.status_code == 200 and len(download.content) == 3_000_000
        head = await client.head("/echo", headers=headers)
        assert head.status_code == 200 and head.content == b""
        missing = await client.get("/status/503", headers=headers)
        assert missing.status_code == 503
        assert [outcome for _, outcome in await r.samples(6)] == [200, 200, 200, 200, 200, 503]


async def test_an_unreachable_upstream_is_answered_by_the_proxy() -> None:
    async with rig() as r:
        r.chooser.routes["canary"] = type(r.chooser.routes["canary"]).parse("h2c://127.0.0.1:9")
        async with grpc.aio.insecure_channel(r.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await echo(channel)(b"x", metadata=CANARY, timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await r.samples(1) == [("canary", 0)]  # CONNECT_ERROR


async def test_http2_over_tls_is_chosen_by_alpn(tmp_path: Path) -> None:
    from controlplane.kernel.tls import server_context
    from tests.support.tls import make_pki

    pki = make_pki(tmp_path / "pki")
    options = ProxyOptions(
        listen_tls=server_context(cert_file=pki.server_cert, key_file=pki.server_key)
    )
    async with rig(options) as r:
        trusted = ssl.create_default_context(cafile=pki.ca_file)
        base = f"https://{r.address}"
        async with httpx.AsyncClient(http2=True, verify=trusted, base_url=base) as client:
            response = await client.get("/echo", headers={"x-test-variant": "http1"})
            assert response.http_version == "HTTP/2"
            seen = {name.lower(): v for name, v in response.json()["headers"]}
            assert seen["x-forwarded-proto"] == "https"
        async with httpx.AsyncClient(http2=False, verify=trusted, base_url=base) as client:
            response = await client.get("/echo", headers={"x-test-variant": "http1"})
            assert response.http_version == "HTTP/1.1"
        credentials = grpc.ssl_channel_credentials(Path(pki.ca_file).read_bytes())
        async with grpc.aio.secure_channel(f"localhost:{r.proxy.port}", credentials) as channel:
            assert await echo(channel)(b"tls", metadata=CANARY, timeout=10) == b"tls"
        assert [outcome for _, outcome in await r.samples(3)] == [200, 200, GRPC_STATUS]


# --- hostile clients -------------------------------------------------------------------


class RawClient:
    """An HTTP/2 client speaking through `h2` on a plain socket, free to misbehave."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.h2.initiate_connection()

    @classmethod
    async def open(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def request(self, path: bytes = b"/echo", *, end: bool = True, **extra: bytes) -> int:
        sid = self.h2.get_next_available_stream_id()
        headers = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"proxy"),
                   (b":path", path), (b"x-test-variant", b"http1")]  # fmt: skip
        headers += [(name.encode(), value) for name, value in extra.items()]
        self.h2.send_headers(sid, headers, end_stream=end)
        return sid

    async def send(self) -> None:
        self.writer.write(self.h2.data_to_send())
        await self.writer.drain()

    async def until_closed(self) -> list[h2.events.Event]:
        """Read until the proxy closes the connection; the events it sent."""
        events: list[h2.events.Event] = []
        async with asyncio.timeout(10):
            while data := await self.reader.read(65536):
                try:
                    events += self.h2.receive_data(data)
                except h2.exceptions.ProtocolError:
                    break
        self.writer.close()
        return events


def goaway(events: list[h2.events.Event]) -> h2.events.ConnectionTerminated:
    found = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert found, events
    return found[0]


async def assert_still_serving(r: Rig) -> None:
    async with httpx.AsyncClient(http1=False, http2=True, base_url=f"http://{r.address}") as c:
        response = await c.get("/echo", headers={"x-test-variant": "http1"})
        assert response.status_code == 200


async def test_a_bad_preface_is_refused_as_http1_and_counted() -> None:
    async with rig() as r:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.proxy.port)
        writer.write(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
        answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 505") or answer.startswith(b"HTTP/1.1 400"), answer
        assert sum(r.proxy.metrics.rejected.values()) == 1
        await assert_still_serving(r)


async def test_oversized_headers_close_the_connection_and_are_counted() -> None:
    async with rig(ProxyOptions(max_head_bytes=16 * 1024)) as r:
        client = await RawClient.open(r.proxy.port)
        client.request(**{"x-big": b"v" * 40_000})
        await client.send()
        ended = goaway(await client.until_closed())
        assert ended.error_code != h2.errors.ErrorCodes.NO_ERROR
        assert r.proxy.metrics.rejected == {"h2_header_list_too_large": 1}
        assert r.http1.requests == []
        await assert_still_serving(r)


async def test_streams_beyond_the_limit_close_the_connection_and_are_counted() -> None:
    async with rig(ProxyOptions(h2_max_streams=10)) as r:
        client = await RawClient.open(r.proxy.port)
        # sent before the proxy's SETTINGS are read: the client does not know the limit
        for _ in range(11):
            client.request(b"/slow", end=False)
        await client.send()
        ended = goaway(await client.until_closed())
        assert ended.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
        assert r.proxy.metrics.rejected == {"h2_too_many_streams": 1}
        await assert_still_serving(r)


async def test_a_rapid_reset_flood_is_cut_off_and_counted() -> None:
    async with rig(ProxyOptions(h2_max_resets=50)) as r:
        client = await RawClient.open(r.proxy.port)
        for _ in range(500):
            sid = client.request(b"/echo", end=True)
            client.h2.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        await client.send()
        ended = goaway(await client.until_closed())
        assert ended.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert r.proxy.metrics.rejected == {"h2_rapid_reset": 1}
        await assert_still_serving(r)


async def test_garbage_after_the_preface_is_a_protocol_error() -> None:
    async with rig() as r:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.proxy.port)
        writer.write(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x04\x09\x00\x00\x00\x00\x01junk"
        )
        await reader.read()
        writer.close()
        assert r.proxy.metrics.rejected == {"h2_protocol_error": 1}
        await assert_still_serving(r)
