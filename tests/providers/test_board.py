"""The metric board against a real Prometheus: reads per interval and cached between,
`latest` at once whatever the provider does, outages as no data with a reason, logged
once per change."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from controlplane.kernel.backend_access import PrometheusAccess
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.kernel.settings import Settings
from controlplane.providers.board import NO_PROVIDER, MetricBoard, next_due
from tests.support.jwks_server import Issuer, http_answer, serving
from tests.support.metrics_exporter import MetricsExporter
from tests.support.metrics_exporter import serving as exporting
from tests.support.prometheus import PrometheusProcess

VARIANTS = ("baseline", "canary")
QUERIES = {"handler": "/api/v1/query"}
ONE = b'{"status":"success","data":{"resultType":"scalar","result":[1,"42"]}}'


def gauge(name: str, service: str, interval: float = 15.0) -> MetricSpec:
    return MetricSpec(name=name, kind="gauge", compare="baseline", interval_sec=interval,
                      query=f'max(board_g{{service="{service}",variant="$variant"}})')  # fmt: skip


@pytest.fixture
async def board(access: PrometheusAccess) -> AsyncIterator[tuple[MetricBoard, FakeClock]]:
    clock = FakeClock()
    board = MetricBoard.for_access(access, clock=clock)
    yield board, clock
    await board.stop()


def set_board_gauge(exporter: MetricsExporter, service: str, base: float, canary: float) -> None:
    exporter.gauge("board_g", {"service": service, "variant": "baseline"}, base)
    exporter.gauge("board_g", {"service": service, "variant": "canary"}, canary)


async def test_a_metric_is_read_once_per_interval(
    exporter: MetricsExporter,
    prometheus: PrometheusProcess,
    board: tuple[MetricBoard, FakeClock],
) -> None:
    metrics, clock = board
    set_board_gauge(exporter, "shop-i", 1, 2)
    prometheus.wait_value('count(board_g{service="shop-i"})', 2)
    metrics.track("7", "shop-i", [gauge("mem", "shop-i", interval=15)], 60, VARIANTS)
    assert metrics.latest("7") == {}

    before = prometheus.own_counter("prometheus_http_requests_total", **QUERIES)
    assert await metrics.refresh() == 1
    first = metrics.latest("7")["mem"]
    after_first = prometheus.own_counter("prometheus_http_requests_total", **QUERIES)
    clock.advance(14.9)
    assert await metrics.refresh() == 0
    assert metrics.latest("7")["mem"] is first
    after_cached = prometheus.own_counter("prometheus_http_requests_total", **QUERIES)
    clock.advance(0.1)
    assert await metrics.refresh() == 1
    after_due = prometheus.own_counter("prometheus_http_requests_total", **QUERIES)

    assert (first.canary.value, first.baseline.value) == (2, 1), first
    assert after_first - before == 2  # one query per variant
    assert after_cached == after_first  # within the interval: no request at all
    assert after_due - after_cached == 2
    assert metrics.latest("7")["mem"].read_at > first.read_at
    assert metrics.stats.queries["ok"] == 4


async def test_track_again_keeps_the_schedule_and_forget_drops_the_evidence(
    exporter: MetricsExporter,
    prometheus: PrometheusProcess,
    board: tuple[MetricBoard, FakeClock],
) -> None:
    metrics, clock = board
    set_board_gauge(exporter, "shop-t", 3, 4)
    prometheus.wait_value('count(board_g{service="shop-t"})', 2)
    specs = [gauge("mem", "shop-t"), gauge("mem2", "shop-t")]
    metrics.track("8", "shop-t", specs, 60, VARIANTS)
    assert await metrics.refresh() == 2

    metrics.track("8", "shop-t", specs, 60, VARIANTS)
    assert await metrics.refresh() == 0
    metrics.track("8", "shop-t", specs[:1], 120, VARIANTS)  # window changed: read afresh
    assert set(metrics.latest("8")) == set()
    assert await metrics.refresh() == 1
    assert set(metrics.latest("8")) == {"mem"}

    metrics.forget("8")
    clock.advance(60)
    assert metrics.latest("8") == {}
    assert await metrics.refresh() == 0


async def test_a_slow_answer_times_out_and_latest_answers_meanwhile() -> None:
    slow = Issuer(hold=True)
    async with serving(slow):
        clock = FakeClock()
        url = slow.url.removesuffix("/jwks.json")
        metrics = MetricBoard.for_access(PrometheusAccess(url=url, timeout_sec=0.5), clock=clock)
        try:
            metrics.track("9", "shop", [gauge("mem", "shop")], 60, VARIANTS)
            reading = asyncio.create_task(metrics.refresh())
            await asyncio.wait_for(slow.accepted.wait(), 10)

            during = metrics.latest("9")  # a plain call: it cannot wait on the read

            assert during == {}
            assert not reading.done()
            assert await asyncio.wait_for(reading, 10) == 1
            evidence = metrics.latest("9")["mem"]
            assert evidence.canary.reason == evidence.baseline.reason == "timed out after 0.5 s"
            assert metrics.stats.queries["timeout"] == 2
        finally:
            await metrics.stop()


async def test_prometheus_down_is_no_data_then_values_again_logged_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="canary.providers")
    with exporting(MetricsExporter()) as exporter:
        own = PrometheusProcess(exporter.port)
        try:
            own.start()
            set_board_gauge(exporter, "shop-o", 10, 11)
            own.wait_value('count(board_g{service="shop-o"})', 2)
            clock = FakeClock()
            metrics = MetricBoard.for_access(PrometheusAccess(url=own.url), clock=clock)
            try:
                metrics.track("10", "shop-o", [gauge("mem", "shop-o", 5)], 60, VARIANTS)
                await metrics.refresh()
                assert metrics.latest("10")["mem"].canary.value == 11

                own.stop()
                for _ in range(3):
                    clock.advance(5)
                    await metrics.refresh()
                    down = metrics.latest("10")["mem"]
                    assert down.no_data
                    assert (down.canary.reason or "").startswith("prometheus unreachable: ")

                own.start()
                own.wait_value('count(board_g{service="shop-o"})', 2)
                for _ in range(2):
                    clock.advance(5)
                    await metrics.refresh()
                    assert metrics.latest("10")["mem"].canary.value == 11
            finally:
                await metrics.stop()
        finally:
            own.close()

    lines = [r.getMessage() for r in caplog.records if r.name == "canary.providers"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("metric mem of experiment 10 (shop-o): no data: canary "
                               "prometheus unreachable: ConnectError")  # fmt: skip
    assert lines[1] == "metric mem of experiment 10 (shop-o): read again"
    assert metrics.stats.queries["unreachable"] == 6


async def test_the_loop_reads_what_is_tracked_on_its_injected_sleep(
    exporter: MetricsExporter, prometheus: PrometheusProcess, access: PrometheusAccess
) -> None:
    set_board_gauge(exporter, "shop-l", 5, 6)
    prometheus.wait_value('count(board_g{service="shop-l"})', 2)
    clock = FakeClock()
    naps: list[float] = []
    wake = asyncio.Event()

    async def sleep(seconds: float) -> None:
        naps.append(seconds)
        await wake.wait()

    metrics = MetricBoard.for_access(access, clock=clock, sleep=sleep)
    await metrics.start()
    try:
        metrics.track("11", "shop-l", [gauge("mem", "shop-l", 15)], 60, VARIANTS)  # wakes it
        async with asyncio.timeout(10):
            while "mem" not in metrics.latest("11"):
                await asyncio.sleep(0.01)
        assert metrics.latest("11")["mem"].canary.value == 6
        assert naps and all(0 <= nap <= 1.0 for nap in naps)
    finally:
        await metrics.stop()


async def test_counters_are_exported(
    exporter: MetricsExporter, prometheus: PrometheusProcess, board: tuple[MetricBoard, FakeClock]
) -> None:
    metrics, _ = board
    metrics.track("12", "shop-m", [gauge("mem", "shop-none")], 60, VARIANTS)
    await metrics.refresh()
    registry = CollectorRegistry()
    registry.register(metrics.metrics_collector())

    text = generate_latest(registry).decode()

    assert 'canary_metric_provider_queries_total{outcome="empty"} 2.0' in text
    assert "canary_metric_provider_watched 1.0" in text
    assert "canary_metric_provider_no_data 1.0" in text


async def test_without_a_provider_every_metric_says_so() -> None:
    metrics = MetricBoard.from_settings(Settings(), clock=FakeClock())
    try:
        metrics.track("13", "shop", [gauge("mem", "shop")], 60, VARIANTS)
        await metrics.refresh()
        evidence = metrics.latest("13")["mem"]
        assert evidence.canary.reason == evidence.baseline.reason == NO_PROVIDER
    finally:
        await metrics.stop()



async def test_at_most_so_many_queries_at_once() -> None:
    held = Issuer(hold=True, answer=http_answer(ONE))
    async with serving(held):
        url = held.url.removesuffix("/jwks.json")
        metrics = MetricBoard.for_access(PrometheusAccess(url=url, timeout_sec=30),
                                         clock=FakeClock(), concurrency=2)  # fmt: skip
        try:
            specs = [gauge(f"m{n}", "shop") for n in range(3)]  # six queries
            metrics.track("14", "shop", specs, 60, VARIANTS)
            reading = asyncio.create_task(metrics.refresh())
            async with asyncio.timeout(10):
                while held.open_now < 2:
                    await asyncio.sleep(0.01)
            # a third query would arrive now if nothing held it back: give it the time
            await asyncio.sleep(0.3)
            assert held.connections == 2
            held.release.set()
            assert await asyncio.wait_for(reading, 10) == 3
            assert held.answered == 6
            assert all(e.canary.value == 42 for e in metrics.latest("14").values())
        finally:
            await metrics.stop()


def test_the_schedule_keeps_its_cadence_and_skips_what_was_missed() -> None:
    assert next_due(100.0, 15.0, 100.4) == 115.0  # a late start does not drift
    assert next_due(100.0, 15.0, 140.0) == 155.0  # missed slots: one read, then on
