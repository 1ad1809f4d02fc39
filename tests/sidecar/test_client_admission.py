"""Connections counted from accept: the per-client cap, and TLS handshakes within the caps.

Real sockets against the real proxy; a second client address is 127.0.0.2 (Linux
routes all of 127/8 to loopback). TLS certificates come from trustme.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
import trustme

from sidecar.proxy import ProxyOptions, ProxyServer
from sidecar.proxy.admission import Admission, client_key
from sidecar.proxy.limits import connection_capacity
from tests.sidecar import upstreams
from tests.sidecar.proxy_harness import HeaderChooser, ListRecorder
from tests.sidecar.test_connection_limits import low_fd_sidecar, until_serving
from tests.sidecar.test_smuggling import proxied, read_all, statuses
from tests.support.processes import free_port
from tests.support.tls import make_pki

REQUEST = b"GET /t HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n"


async def until(condition: Callable[[], bool], timeout: float = 5) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("ip", "prefix", "key"),
    [
        (b"10.1.2.3", 64, b"10.1.2.3"),
        (b"::ffff:10.1.2.3", 128, b"10.1.2.3"),  # a dual-stack listener's IPv4 client
        (b"2001:db8::1", 128, b"2001:db8::1"),
        (b"2001:db8::1", 64, b"20010db800000000/64"),
        (b"2001:db8::ffff:1", 64, b"20010db800000000/64"),  # same /64, same client
        (b"2001:db8:0:1::1", 64, b"20010db800000001/64"),
        (b"fe80::1%eth0", 64, b"fe80000000000000/64"),
        (b"unknown", 64, b"unknown"),
    ],
)
def test_clients_are_counted_per_address_or_ipv6_network(
    ip: bytes, prefix: int, key: bytes
) -> None:
    assert client_key(ip, prefix) == key


def test_admission_refuses_past_either_cap_and_frees_on_release() -> None:
    admission = Admission(limit=4, client_limit=2, ipv6_prefix=64)
    assert admission.refusal(b"2001:db8::1", 0) is None
    assert admission.refusal(b"2001:db8::2", 1) is None
    assert admission.refusal(b"2001:db8::3", 2) == "per_client"  # the same /64
    assert admission.refusal(b"10.0.0.1", 2) is None
    assert admission.refusal(b"10.0.0.2", 4) == "max_connections"
    admission.release(b"2001:db8::2")
    assert admission.held(b"2001:db8::9") == 1
    assert admission.refusal(b"2001:db8::3", 3) is None
    assert Admission(limit=4, client_limit=0, ipv6_prefix=128).refusal(b"10.0.0.1", 3) is None


async def open_from(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def test_one_address_is_refused_past_its_cap_while_another_is_served() -> None:
    async with proxied(ProxyOptions(max_connections_per_client=3, read_timeout=10)) as s:
        port = s.proxy.port
        held = [await open_from(port, "127.0.0.1") for _ in range(3)]
        await until(lambda: s.proxy.metrics.connections == 3)
        reader, writer = await open_from(port, "127.0.0.1")
        writer.write(REQUEST)
        data, closed = await read_all(reader)
        writer.close()
        assert statuses(data) == [503] and closed
        assert b"this client holds the maximum of 3 connections" in data
        assert b"\r\nRetry-After: 1\r\n" in data
        assert s.proxy.metrics.connections_refused == {"per_client": 1}
        reader, writer = await open_from(port, "127.0.0.2")
        writer.write(REQUEST)
        data, _ = await read_all(reader)
        writer.close()
        assert statuses(data) == [200]
        # a connection closed frees its client's slot
        held.pop()[1].close()
        await until(lambda: s.proxy.admission.held(b"127.0.0.1") == 2)
        reader, writer = await open_from(port, "127.0.0.1")
        writer.write(REQUEST)
        data, _ = await read_all(reader)
        writer.close()
        assert statuses(data) == [200]
        assert s.proxy.metrics.connections_refused == {"per_client": 1}
        assert [r.target for r in s.upstream.heads] == ["/t", "/t"]
        for _, w in held:
            w.close()


async def test_a_dual_stack_listener_counts_mapped_ipv4_clients_as_ipv4() -> None:
    """Workers may inherit a dual-stack socket: IPv4 clients then arrive as
    ::ffff:a.b.c.d, and are counted per IPv4 address all the same."""
    listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.bind(("::", 0))
    listener.listen()
    port = listener.getsockname()[1]
    upstream = upstreams.Upstream("baseline")
    await upstream.start()
    options = ProxyOptions(max_connections_per_client=2, client_ipv6_prefix=64)
    proxy = ProxyServer(HeaderChooser({"baseline": upstream.url}), ListRecorder(), options=options)
    await proxy.start_on(listener)
    try:
        held = [await open_from(port, "127.0.0.1") for _ in range(2)]
        await until(lambda: proxy.metrics.connections == 2)
        assert proxy.admission.held(b"::ffff:127.0.0.1") == proxy.admission.held(b"127.0.0.1") == 2
        reader, writer = await open_from(port, "127.0.0.1")
        writer.write(REQUEST)
        data, _ = await read_all(reader)
        writer.close()
        assert statuses(data) == [503]
        for source, host in (("127.0.0.2", "127.0.0.1"), ("::1", "::1")):
            reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
            writer.write(REQUEST)
            data, _ = await read_all(reader)
            writer.close()
            assert statuses(data) == [200], source
        assert proxy.metrics.connections_refused == {"per_client": 1}
        for _, w in held:
            w.close()
    finally:
        await proxy.stop(timeout=2)
        await upstream.stop()


@dataclass
class TlsSetup:
    proxy: ProxyServer
    client_tls: ssl.SSLContext

    async def get(self, source: str = "127.0.0.1") -> httpx.Response:
        transport = httpx.AsyncHTTPTransport(verify=self.client_tls, local_address=source)
        async with httpx.AsyncClient(transport=transport, trust_env=False, timeout=5) as client:
            return await client.get(f"https://127.0.0.1:{self.proxy.port}/echo")


@asynccontextmanager
async def tls_proxy(options: ProxyOptions) -> AsyncIterator[TlsSetup]:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    upstream = upstreams.Upstream("baseline")
    await upstream.start()
    proxy = ProxyServer(
        HeaderChooser({"baseline": upstream.url}),
        ListRecorder(),
        options=replace(options, listen_tls=server_tls),
    )
    await proxy.start("127.0.0.1", 0)
    try:
        yield TlsSetup(proxy, client_tls)
    finally:
        await proxy.stop(timeout=2)
        await upstream.stop()


async def assert_closed_at_once(reader: asyncio.StreamReader) -> None:
    async with asyncio.timeout(5):
        with suppress(ConnectionResetError):
            assert await reader.read(1) == b""


async def test_idle_tls_connections_are_held_at_the_cap_then_time_out() -> None:
    options = ProxyOptions(
        max_connections=5, max_connections_per_client=0, tls_handshake_timeout=0.5
    )
    async with tls_proxy(options) as t:
        metrics = t.proxy.metrics
        # TCP connections that never start a handshake
        flood = [await asyncio.open_connection("127.0.0.1", t.proxy.port) for _ in range(8)]
        await until(lambda: metrics.connections_refused.get("max_connections", 0) == 3)
        assert metrics.tls_handshaking == 5 and metrics.connections == 0
        # the three past the cap were closed at accept; a real client is, too
        for reader, _ in flood[5:]:
            await assert_closed_at_once(reader)
        with pytest.raises(httpx.TransportError):
            await t.get()
        assert metrics.connections_refused == {"max_connections": 4}
        # the handshake timeout frees the slots
        for reader, _ in flood[:5]:
            await assert_closed_at_once(reader)
        await until(lambda: metrics.tls_handshaking == 0)
        assert metrics.tls_handshakes_failed == {"timeout": 5}
        response = await t.get()
        assert response.status_code == 200
        assert ["X-Forwarded-Proto", "https"] in response.json()["headers"]
        await until(lambda: metrics.connections == 0)
        for _, writer in flood:
            writer.close()


async def test_tls_handshakes_count_against_the_per_client_cap() -> None:
    options = ProxyOptions(max_connections_per_client=4, tls_handshake_timeout=30)
    async with tls_proxy(options) as t:
        metrics = t.proxy.metrics
        flood = [await open_from(t.proxy.port, "127.0.0.1") for _ in range(4)]
        await until(lambda: metrics.tls_handshaking == 4)
        reader, writer = await open_from(t.proxy.port, "127.0.0.1")
        await assert_closed_at_once(reader)
        writer.close()
        assert metrics.connections_refused == {"per_client": 1}
        response = await t.get(source="127.0.0.2")
        assert response.status_code == 200
        # a failed handshake frees its slot
        flood[0][1].write(b"this is not a TLS client hello\r\n\r\n")
        await until(lambda: metrics.tls_handshakes_failed == {"error": 1})
        assert t.proxy.admission.held(b"127.0.0.1") == 3
        response = await t.get(source="127.0.0.1")
        assert response.status_code == 200
        for _, w in flood:
            w.close()


def test_tls_handshakes_are_bounded_on_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(asyncio.wait_for(test_idle_tls_connections_are_held_at_the_cap_then_time_out(), 30))


def _metric(text: str, name: str) -> float:
    return next(
        (float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")),
        0.0,
    )


async def test_a_tls_flood_is_held_at_the_cap_and_the_admin_endpoint_answers_throughout(
    tmp_path: Path,
) -> None:
    """The reported DoS on the TLS listener, against the real command with 600
    descriptors: idle TCP connections that never start a handshake, far more than
    --max-connections. They are held at the cap, the rest closed at accept; they time
    out; /healthz answers all along; a real client is served once they are gone."""
    pki = make_pki(tmp_path / "pki")
    upstream = upstreams.Upstream("default")
    await upstream.start()
    port, admin = free_port(), free_port()
    proc = low_fd_sidecar(
        port, admin, upstream.url, "--tls-cert", pki.server_cert, "--tls-key", pki.server_key,
        "--tls-handshake-timeout", "2", "--max-connections-per-client", "0",
    )  # fmt: skip
    capacity = connection_capacity(600)  # 172 client connections
    flood: list[asyncio.StreamWriter] = []
    client_tls = ssl.create_default_context(cafile=pki.ca_file)
    try:
        async with (
            httpx.AsyncClient(verify=client_tls, trust_env=False, timeout=3) as client,
            httpx.AsyncClient(trust_env=False, timeout=3) as admin_client,
        ):

            async def healthy() -> str:
                health = await admin_client.get(f"http://127.0.0.1:{admin}/healthz")
                assert health.status_code == 200
                return (await admin_client.get(f"http://127.0.0.1:{admin}/metrics")).text

            await until_serving(client, f"https://127.0.0.1:{port}/echo", proc)
            for _ in range(capacity + 400):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                flood.append(writer)
            metrics = await healthy()
            # the client above keeps its connection alive: the flood holds the rest
            held = _metric(metrics, "canary_sidecar_tls_handshakes_in_progress")
            assert held + _metric(metrics, "canary_sidecar_client_connections") == capacity
            assert held >= capacity - 1
            refused = 'canary_sidecar_connections_refused_total{reason="max_connections"}'
            assert _metric(metrics, refused) >= 400
            async with httpx.AsyncClient(verify=client_tls, trust_env=False, timeout=3) as fresh:
                with pytest.raises(httpx.TransportError):  # a new connection, at the cap
                    await fresh.get(f"https://127.0.0.1:{port}/echo")
            timed_out = 'canary_sidecar_tls_handshakes_failed_total{reason="timeout"}'
            in_progress = "canary_sidecar_tls_handshakes_in_progress"
            async with asyncio.timeout(15):
                while _metric(metrics, in_progress) > 0:
                    await asyncio.sleep(0.1)
                    metrics = await healthy()
            assert _metric(metrics, timed_out) >= held
            async with httpx.AsyncClient(verify=client_tls, trust_env=False, timeout=3) as fresh:
                response = await fresh.get(f"https://127.0.0.1:{port}/echo")
            assert response.status_code == 200
    finally:
        for writer in flood:
            writer.close()
        proc.terminate()
        output = (await asyncio.to_thread(proc.communicate, timeout=15))[0].decode()
        await upstream.stop()
    assert "refusing client connections" in output, output
    assert "Traceback" not in output, output


async def _tls_get_with_the_hello_sent_before_accept(port: int, context: ssl.SSLContext) -> bytes:
    """An HTTPS request whose client hello is in the socket before the proxy accepts
    it: the connection and the hello happen without yielding to the loop."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        with suppress(ssl.SSLWantReadError):
            tls.do_handshake()
        sock.sendall(outgoing.read())
        sock.setblocking(False)
        loop = asyncio.get_running_loop()

        async def exchange() -> None:
            sock.sendall(outgoing.read())
            incoming.write(await loop.sock_recv(sock, 65536))

        async with asyncio.timeout(5):
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    await exchange()
            tls.write(REQUEST)
            answer = b""
            while b"\r\n\r\n" not in answer:
                await exchange()
                with suppress(ssl.SSLWantReadError):
                    answer += tls.read(65536)
        return answer


async def _served_when_the_hello_came_first() -> None:
    async with tls_proxy(ProxyOptions(tls_handshake_timeout=3)) as t:
        answer = await _tls_get_with_the_hello_sent_before_accept(t.proxy.port, t.client_tls)
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert t.proxy.metrics.tls_handshakes_failed == {}


async def test_a_client_hello_read_before_the_handshake_starts_is_not_lost() -> None:
    await _served_when_the_hello_came_first()


def test_a_client_hello_read_before_the_handshake_starts_is_not_lost_on_uvloop() -> None:
    # uvloop starts reading right after connection_made: the hello is read then
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(asyncio.wait_for(_served_when_the_hello_came_first(), 30))
