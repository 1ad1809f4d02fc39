"""The servers the probes and health checks of deploy/ target, started in-process on
memory backends: the API and its admin listener (`canary serve --admin`), a collector's
admin endpoint, a sidecar's admin endpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from prometheus_client.registry import CollectorRegistry

from controlplane.api.admin_listener import serve_api_admin
from controlplane.api.app import create_app
from controlplane.api.metrics import ApiMetrics
from controlplane.collector.admin import serve_admin
from controlplane.collector.service import Collector
from controlplane.kernel.admin_thread import Heartbeat
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.settings import Settings
from controlplane.kernel.streams_factory import open_streams
from sidecar.admin import AdminServer

TOKEN = "admin-token-0123456789abcdef"


@asynccontextmanager
async def api_server(*, trusted_hosts: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The API on memory backends and a SQLite file, answering these Host names."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'probe.db'}", etcd="memory://",
        redis_url="memory://", trusted_hosts=trusted_hosts,
    )  # fmt: skip
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield client


@asynccontextmanager
async def api_admin_server(
    *, heartbeat: Heartbeat | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """`canary serve --admin`'s listener with the admin token set, on an API's registry;
    `heartbeat` is the one its loop would beat (default: a fresh one on a fake clock)."""
    beat = heartbeat or Heartbeat(FakeClock())
    listener = serve_api_admin(ApiMetrics().registry, beat, "127.0.0.1", 0, token=TOKEN)
    try:
        base = f"http://127.0.0.1:{listener.port}"
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            yield client
    finally:
        listener.stop()


@asynccontextmanager
async def collector_server(
    *, ready: bool = True, heartbeat: Heartbeat | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """A collector's admin endpoint with the admin token set; `heartbeat` as above."""
    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    collector = Collector(streams, board, kv, EtcdKeys("/t"), consumer_name="c", clock=clock)
    if ready:  # as after its first read loop: configuration loaded, loop fresh
        collector.config_loaded.set()
        collector.last_loop_ok = clock.monotonic()
    server = serve_admin(collector, "127.0.0.1", 0, token=TOKEN, heartbeat=heartbeat)
    port = server.port
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            yield client
    finally:
        server.stop()
        await streams.close()
        await kv.close()


@asynccontextmanager
async def sidecar_server() -> AsyncIterator[httpx.AsyncClient]:
    """A sidecar's admin endpoint with the admin token set."""
    registry = CollectorRegistry(auto_describe=False)
    admin = AdminServer(registry=registry, ready=lambda: True, token=TOKEN)
    registry.register(admin.metrics_collector())
    await admin.start("127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin.port}", timeout=5) as c:
            yield c
    finally:
        await admin.stop()
