"""Admin endpoints of the sidecar and the collector: loopback by default, and with a
token, /metrics needs `Authorization: Bearer` while the probes stay open."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.registry import CollectorRegistry

from controlplane.collector.admin import serve_admin
from controlplane.collector.service import Collector
from controlplane.kernel.admin_access import admin_token, allowed, is_loopback
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.errors import ConfigError
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.settings import parse_host_port
from controlplane.kernel.streams_factory import open_streams
from sidecar.admin import AdminServer

TOKEN = "admin-token-0123456789"


@pytest.fixture
async def sidecar_admin() -> AsyncIterator[tuple[str, AdminServer]]:
    registry = CollectorRegistry(auto_describe=False)
    admin = AdminServer(registry=registry, ready=lambda: True, token=TOKEN)
    registry.register(admin.metrics_collector())
    host, port = parse_host_port(":0")
    await admin.start(host, port)
    try:
        yield f"http://{host}:{admin.port}", admin
    finally:
        await admin.stop()


@pytest.fixture
async def collector_admin() -> AsyncIterator[str]:
    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    collector = Collector(streams, board, kv, EtcdKeys("/t"), consumer_name="c", clock=clock)
    server = serve_admin(collector, "127.0.0.1", 0, token=TOKEN)
    port = server.port
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        await streams.close()
        await kv.close()


async def check_token_rules(base: str, unauthorized_metric: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code in (200, 503)
        refused = await client.get("/metrics")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        basic = await client.get("/metrics", headers={"Authorization": f"Basic {TOKEN}"})
        assert basic.status_code == 401
        ok = await client.get("/metrics?x=1", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        assert f"{unauthorized_metric} 3.0" in ok.text


async def test_the_sidecar_admin_needs_the_token_for_metrics_only(
    sidecar_admin: tuple[str, AdminServer],
) -> None:
    base, _ = sidecar_admin
    await check_token_rules(base, "canary_sidecar_admin_unauthorized_total")


async def test_the_collector_admin_needs_the_token_for_metrics_only(collector_admin: str) -> None:
    await check_token_rules(collector_admin, "canary_collector_admin_unauthorized_total")


async def test_the_default_admin_address_is_loopback(
    sidecar_admin: tuple[str, AdminServer],
) -> None:
    base, _ = sidecar_admin
    assert base.startswith("http://127.0.0.1:")


async def test_a_public_admin_address_without_a_token_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    for token in (None, TOKEN):
        admin = AdminServer(registry=CollectorRegistry(), ready=lambda: True, token=token)
        await admin.start("0.0.0.0", 0)
        await admin.stop()
    warnings = [r for r in caplog.records if "without a token" in r.getMessage()]
    assert len(warnings) == 1


def test_the_decisions() -> None:
    assert allowed("/metrics", None, None)
    assert allowed("/healthz", None, TOKEN) and allowed("/readyz", None, TOKEN)
    assert not allowed("/metrics", None, TOKEN)
    assert not allowed("/metrics", "Bearer " + "x" * 5000, TOKEN)
    assert allowed("/metrics", f"bearer {TOKEN}", TOKEN)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("admin.internal")


def test_an_unreadable_or_empty_token_file_is_a_one_line_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path in (str(tmp_path / "missing"), str(empty)):
        with pytest.raises(ConfigError) as caught:
            admin_token(path)
        assert "\n" not in str(caught.value)
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    assert admin_token(str(good)) == TOKEN
