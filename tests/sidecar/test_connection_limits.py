"""The client-connection cap, the request-head timeout and the descriptor budget."""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
from collections.abc import Callable

import httpx
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from sidecar.proxy import ProxyMetricsCollector, ProxyOptions
from sidecar.proxy.limits import connection_capacity, default_max_connections
from tests.sidecar import upstreams
from tests.sidecar.test_smuggling import proxied, read_all, send, statuses
from tests.support.processes import free_port

REQUEST = b"GET /t HTTP/1.1\r\nHost: svc\r\n\r\n"


async def until(condition: Callable[[], bool], timeout: float = 5) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_connections_beyond_the_cap_get_503_and_are_counted() -> None:
    async with proxied(ProxyOptions(max_connections=3, max_connections_per_client=0)) as s:
        held = [await asyncio.open_connection("127.0.0.1", s.proxy.port) for _ in range(3)]
        await until(lambda: s.proxy.metrics.connections == 3)
        data, closed = await send(s.proxy.port, REQUEST)
        assert statuses(data) == [503] and closed
        assert b"\r\nRetry-After: 1\r\n" in data and b"\r\nConnection: close\r\n" in data
        assert s.upstream.heads == []
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ProxyMetricsCollector(s.proxy.metrics))
        text = generate_latest(registry).decode()
        assert 'canary_sidecar_connections_refused_total{reason="max_connections"} 1.0' in text
        assert "canary_sidecar_client_connections 3.0" in text
        # a held connection is served, and a freed slot takes a new client
        reader, writer = held[0]
        writer.write(REQUEST)
        assert (await reader.readuntil(b"answer to /t")).startswith(b"HTTP/1.1 200 ")
        writer.close()
        await until(lambda: s.proxy.metrics.connections == 2)
        data, _ = await send(s.proxy.port, REQUEST[:-2] + b"Connection: close\r\n\r\n")
        assert statuses(data) == [200]
        for _, w in held[1:]:
            w.close()


async def test_a_slow_request_head_gets_408_and_the_idle_timeout_stays_apart() -> None:
    async with proxied(ProxyOptions(head_timeout=0.3, client_idle_timeout=60)) as s:
        keep_reader, keep_writer = await asyncio.open_connection("127.0.0.1", s.proxy.port)
        keep_writer.write(REQUEST)
        await keep_reader.readuntil(b"answer to /t")
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", s.proxy.port)
        slow_writer.write(b"GET /slowloris HTTP/1.1\r\nHost: sv")
        silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", s.proxy.port)
        data, closed = await read_all(slow_reader)
        assert statuses(data) == [408] and closed
        data, closed = await read_all(silent_reader)
        assert statuses(data) == [408] and closed
        assert s.proxy.metrics.rejected == {"head_timeout": 2}
        # the idle keep-alive connection, older than both, is still served
        keep_writer.write(b"GET /again HTTP/1.1\r\nHost: svc\r\n\r\n")
        assert b"answer to /again" in await keep_reader.readuntil(b"answer to /again")
        assert [r.target for r in s.upstream.heads] == ["/t", "/again"]
        for w in (keep_writer, slow_writer, silent_writer):
            w.close()


def test_the_default_cap_leaves_descriptors_for_upstreams_and_admin() -> None:
    assert default_max_connections(1_048_576) == 10_000
    assert default_max_connections(20_000) == 10_000 - 128
    assert default_max_connections(1024) == connection_capacity(1024) == 384
    assert default_max_connections(100) == 1


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (600, 600))


def low_fd_sidecar(port: int, admin: int, upstream: str, *flags: str) -> subprocess.Popen[bytes]:
    """`canary sidecar`, one worker, 600 descriptors, output on its stdout."""
    return subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "sidecar", "--service", "web",
         "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}",
         "--etcd", "memory://", "--redis", "memory://", "--default-upstream", upstream,
         "--workers", "1", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_low_fd_limit,
    )  # fmt: skip


async def until_serving(client: httpx.AsyncClient, url: str, proc: subprocess.Popen[bytes]) -> None:
    async with asyncio.timeout(15):
        while True:
            try:
                await client.get(url)
                return
            except httpx.TransportError:
                assert proc.poll() is None
                await asyncio.sleep(0.05)


async def test_a_flooded_sidecar_refuses_clients_and_its_admin_still_answers() -> None:
    """The reported DoS, against the real command with 600 descriptors: far more
    connections than it can hold, and /healthz and /metrics still answer. One worker:
    the cap is per process."""
    upstream = upstreams.Upstream("default")
    await upstream.start()
    port, admin = free_port(), free_port()
    proc = low_fd_sidecar(port, admin, upstream.url, "--max-connections-per-client", "0")
    flood: list[asyncio.StreamWriter] = []
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=3) as client:
            await until_serving(client, f"http://127.0.0.1:{port}/echo", proc)
            capacity = connection_capacity(600)  # 172 client connections
            for _ in range(capacity + 400):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                flood.append(writer)
            health = await client.get(f"http://127.0.0.1:{admin}/healthz")
            metrics = (await client.get(f"http://127.0.0.1:{admin}/metrics")).text
        assert health.status_code == 200
        refused = next(
            float(line.split()[-1]) for line in metrics.splitlines()
            if line.startswith('canary_sidecar_connections_refused_total{reason="max_connections"}')
        )
        assert refused >= 400
        assert f"canary_sidecar_client_connections {float(capacity)}" in metrics
    finally:
        for writer in flood:
            writer.close()
        proc.terminate()
        output = (await asyncio.to_thread(proc.communicate, timeout=15))[0].decode()
        await upstream.stop()
    assert "descriptor limit 600: at most 172 client connections" in output, output
    assert "refusing client connections" in output, output
    assert "Traceback" not in output, output


def test_max_connections_beyond_the_descriptor_limit_is_a_one_line_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "sidecar", "--service", "web",
         "--listen", "127.0.0.1:0", "--max-connections", "100000"],
        capture_output=True, text=True, preexec_fn=_low_fd_limit, timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "canary sidecar: --max-connections must be between 1 and 172 (what the descriptor "
        "limit carries), got 100000"
    ]
