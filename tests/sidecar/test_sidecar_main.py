"""The composed sidecar on the in-process backends: admin endpoints, routing, shutdown."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import httpx
import pytest

from controlplane.kernel.keys import COLLECTOR_GROUP, EtcdKeys
from controlplane.kernel.kv_memory import MemoryKV
from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants
from controlplane.kernel.settings import Settings
from controlplane.kernel.streams_memory import MemoryStreams
from sidecar.main import Sidecar, run_sidecar
from tests.sidecar import upstreams

SERVICE = "shop"
LOCAL = ("127.0.0.1", 0)


def route_value(base: str, canary: str, canary_bp: int, revision: int) -> bytes:
    return Route(
        experiment=3, revision=revision, salt="exp-1", sticky=Sticky(header="x-user-id"),
        variants=two_way_variants(base, canary, canary_bp), state=RouteState.RUNNING,
    ).to_json().encode()


async def test_admin_endpoints_routing_and_a_flush_at_stop() -> None:
    base, canary = upstreams.Upstream("baseline"), upstreams.Upstream("canary")
    await base.start()
    await canary.start()
    kv, stream = MemoryKV(), MemoryStreams()
    await stream.ensure_group(SERVICE, COLLECTOR_GROUP)
    sidecar = Sidecar(service=SERVICE, kv=kv, stream=stream)
    await sidecar.start(LOCAL, LOCAL)
    admin = f"http://127.0.0.1:{sidecar.admin.port}"
    proxy = f"http://127.0.0.1:{sidecar.proxy.port}"
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(f"{admin}/healthz")).status_code == 200
            assert (await client.get(f"{admin}/readyz")).status_code == 503
            assert (await client.get(f"{proxy}/echo")).status_code == 503
            assert (await client.get(f"{admin}/nope")).status_code == 404

            await kv.put(EtcdKeys().route(SERVICE), route_value(base.url, canary.url, 2500, 1))
            assert await sidecar.watcher.wait_for(lambda r: r is not None, 5)
            assert (await client.get(f"{admin}/readyz")).status_code == 200
            # published vectors: alice is in the canary at 25%, user-1 is not
            alice = await client.get(f"{proxy}/echo", headers={"x-user-id": "alice"})
            user1 = await client.get(f"{proxy}/echo", headers={"x-user-id": "user-1"})
            assert (alice.headers["x-upstream"], alice.headers["x-canary-variant"]) == (
                "canary", "canary")
            assert user1.headers["x-upstream"] == "baseline"

            await kv.put(EtcdKeys().route(SERVICE), b"{broken")
            await kv.put(EtcdKeys().route(SERVICE), route_value(base.url, canary.url, 2500, 0))
            assert await sidecar.watcher.wait_for(lambda r: r is not None and r.revision == 0, 5)
            metrics = (await client.get(f"{admin}/metrics")).text
        assert 'canary_sidecar_routes_rejected_total{reason="malformed"} 1.0' in metrics
        # the last route etcd delivered is in force, whatever its revision says
        assert 'canary_sidecar_route_revision{experiment="3"} 0.0' in metrics
        # labelled by the one service the sidecar fronts (its label set stays bounded)
        labels = f'service="{SERVICE}",status="200",variant="canary"'
        assert f"canary_sidecar_requests_total{{{labels}}} 1.0" in metrics
        assert "canary_sidecar_proxy_overhead_seconds_bucket" in metrics
        assert 'canary_sidecar_samples_total{fate="sent"}' in metrics
    finally:
        await sidecar.stop()
        await base.stop()
        await canary.stop()
    # the stop flushed both samples into the stream before closing it
    assert sidecar.reporter.snapshot().samples_sent == 2


async def test_run_sidecar_serves_the_default_upstream_until_told_to_stop() -> None:
    upstream = upstreams.Upstream("default")
    await upstream.start()
    stop = asyncio.Event()
    port = _free_port()
    task = asyncio.create_task(run_sidecar(
        Settings(etcd="memory://", redis_url="memory://"),
        service=SERVICE, listen=("127.0.0.1", port), default_upstream=upstream.url, stop=stop,
    ))
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await _get_when_up(client, f"http://127.0.0.1:{port}/echo")
        assert response.status_code == 200
        assert response.headers["x-canary-variant"] == "default"
    finally:
        stop.set()
        await task
        await upstream.stop()


def test_starting_a_sidecar_imports_neither_the_api_nor_sqlalchemy() -> None:
    code = (
        "import sys, sidecar.main, controlplane.cli.sidecar;"
        "bad = [m for m in sys.modules if m.startswith(('fastapi', 'sqlalchemy', "
        "'controlplane.api', 'controlplane.db'))];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bad_flags_exit_2_with_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "sidecar", "--service", "web",
         "--listen", "nowhere"],
        capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "HOST:PORT" in result.stderr


def _free_port() -> int:
    from tests.support.processes import free_port

    return free_port()


async def _get_when_up(client: httpx.AsyncClient, url: str) -> httpx.Response:
    async with asyncio.timeout(10):
        while True:
            try:
                return await client.get(url)
            except httpx.ConnectError:
                await asyncio.sleep(0.02)


async def test_run_sidecar_warns_when_max_connections_exceeds_the_descriptor_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = asyncio.Event()
    stop.set()  # start, then stop at once
    with caplog.at_level(logging.WARNING, logger="canary.sidecar"):
        await run_sidecar(
            Settings(etcd="memory://", redis_url="memory://"),
            service=SERVICE, listen=("127.0.0.1", _free_port()), max_connections=10**8, stop=stop,
        )  # fmt: skip
    assert any(
        "max_connections 100000000 is more than the descriptor limit" in r.getMessage()
        for r in caplog.records
    ), caplog.text
