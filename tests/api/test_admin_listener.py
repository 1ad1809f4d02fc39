"""`canary serve --admin`: the API process's /healthz and /metrics from a thread
(decision 0062): liveness from the loop's heartbeat, the app's registry behind the
admin token, and a rendering that meets a changing collector tried again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.api.admin_listener import RENDER_TRIES, serve_api_admin
from controlplane.api.metrics import ApiMetrics
from controlplane.kernel.admin_thread import Heartbeat
from controlplane.kernel.clock import FakeClock

TOKEN = "api-admin-token"


class _Changing(Collector):
    """Fails as a dict iterated while the loop changes it, `failures` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def collect(self) -> Iterator[Metric]:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("dictionary changed size during iteration")
        yield GaugeMetricFamily("canary_test_changing", "a changing figure", value=1)


async def test_healthz_follows_the_heartbeat_and_metrics_need_the_token() -> None:
    clock = FakeClock()
    metrics = ApiMetrics()
    heartbeat = Heartbeat(clock, bound=30.0)
    admin = serve_api_admin(metrics.registry, heartbeat, "127.0.0.1", 0, token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin.port}") as client:
            assert (await client.get("/healthz")).text == "ok\n"
            clock.advance(45.0)
            stalled = await client.get("/healthz")
            assert stalled.status_code == 503 and "45.0 s ago" in stalled.text
            heartbeat.beat()
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/metrics")).status_code == 401
            assert (await client.get("/readyz")).status_code == 404  # the API's, not here
            scraped = await client.get("/metrics", headers=auth)
            assert scraped.status_code == 200
            assert "canary_api_admin_unauthorized_total 1.0" in scraped.text
            assert "canary_api_admin_refused_total" in scraped.text
    finally:
        admin.stop()


def _scrape(registry: CollectorRegistry, port: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization":
                     f"Bearer {TOKEN}"})  # fmt: skip


async def test_a_rendering_that_meets_a_changing_collector_is_tried_again() -> None:
    registry = CollectorRegistry()
    changing = _Changing(RENDER_TRIES - 1)
    registry.register(changing)
    admin = serve_api_admin(registry, Heartbeat(FakeClock()), "127.0.0.1", 0, token=TOKEN)
    try:
        answer = await asyncio.to_thread(_scrape, registry, admin.port)
        assert answer.status_code == 200 and "canary_test_changing 1.0" in answer.text
        changing.failures = RENDER_TRIES
        answer = await asyncio.to_thread(_scrape, registry, admin.port)
        assert answer.status_code == 503
    finally:
        admin.stop()
