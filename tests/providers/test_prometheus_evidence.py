"""Each metric kind's evidence, read from a real Prometheus scraping our exporter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from controlplane.kernel.backend_access import PrometheusAccess
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.providers.prometheus import PrometheusClient
from tests.support.metrics_exporter import MetricsExporter
from tests.support.prometheus import PrometheusProcess

VARIANTS = ("baseline", "canary")


def spec(**fields: Any) -> MetricSpec:
    fields.setdefault("compare", "baseline")
    return MetricSpec.model_validate(fields)


@pytest.fixture
async def client(access: PrometheusAccess) -> AsyncIterator[PrometheusClient]:
    client = PrometheusClient(access)
    yield client
    await client.aclose()


async def test_gauge_is_one_value_per_variant(
    exporter: MetricsExporter, prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    exporter.gauge("resident_bytes", {"service": "shop-g", "variant": "baseline"}, 100)
    exporter.gauge("resident_bytes", {"service": "shop-g", "variant": "canary"}, 150)
    prometheus.wait_value('resident_bytes{service="shop-g",variant="canary"}', 150)
    prometheus.wait_value('resident_bytes{service="shop-g",variant="baseline"}', 100)
    memory = spec(name="memory", kind="gauge",
                  query='max(resident_bytes{service="shop-g",variant="$variant"})')  # fmt: skip

    evidence = await client.read(memory, VARIANTS, 60)

    assert (evidence.canary.value, evidence.baseline.value) == (150, 100)
    assert not evidence.no_data
    assert evidence.queries == (
        'max(resident_bytes{service="shop-g",variant="canary"})',
        'max(resident_bytes{service="shop-g",variant="baseline"})',
    )


async def test_ratio_is_bad_over_total_with_its_counts(
    exporter: MetricsExporter, prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    for variant, bad, total in (("baseline", 5, 1000), ("canary", 30, 600)):
        labels = {"service": "shop-r", "variant": variant}
        exporter.counter("req_total", {**labels, "code": "200"}, total - bad)
        exporter.counter("req_total", {**labels, "code": "500"}, bad)
    prometheus.wait_value('sum(req_total{service="shop-r",variant="canary"})', 600)
    prometheus.wait_value('sum(req_total{service="shop-r",variant="baseline"})', 1000)
    errors = spec(
        name="errors", kind="ratio",
        query='sum(last_over_time(req_total{service="shop-r",variant="$variant",code=~"5.."}[$window]))',
        total_query='sum(last_over_time(req_total{service="shop-r",variant="$variant"}[$window]))',
    )  # fmt: skip

    evidence = await client.read(errors, VARIANTS, 30)

    assert (evidence.canary.bad, evidence.canary.total) == (30, 600)
    assert evidence.canary.value == pytest.approx(0.05)
    assert (evidence.baseline.bad, evidence.baseline.total) == (5, 1000)
    assert evidence.baseline.value == pytest.approx(0.005)
    assert len(evidence.queries) == 4 and all("[30s]" in q for q in evidence.queries)


async def test_a_ratio_without_bad_series_is_zero_and_without_total_no_data(
    exporter: MetricsExporter, prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    exporter.counter("calls_total", {"service": "shop-q", "variant": "baseline", "code": "200"}, 80)
    prometheus.wait_value('sum(calls_total{service="shop-q"})', 80)
    errors = spec(name="errors", kind="ratio",
                  query='sum(calls_total{service="shop-q",variant="$variant",code="500"})',
                  total_query='sum(calls_total{service="shop-q",variant="$variant"})')  # fmt: skip

    evidence = await client.read(errors, VARIANTS, 30)

    assert (evidence.baseline.value, evidence.baseline.bad, evidence.baseline.total) == (0, 0, 80)
    assert evidence.canary.reason == "total: no series matched (an empty answer)"


async def test_ratio_without_events_is_no_data(
    exporter: MetricsExporter, prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    for variant in VARIANTS:
        exporter.counter("idle_total", {"service": "shop-z", "variant": variant}, 0)
    prometheus.wait_value('sum(idle_total{service="shop-z"})', 0)
    idle = spec(name="idle", kind="ratio",
                query='sum(idle_total{service="shop-z",variant="$variant"})',
                total_query='sum(idle_total{service="shop-z",variant="$variant"})')  # fmt: skip

    evidence = await client.read(idle, VARIANTS, 30)

    assert evidence.canary.no_data and evidence.baseline.no_data
    assert evidence.canary.reason == "no events in the window (total 0)"


async def test_histogram_is_the_quantile_the_query_computes(
    exporter: MetricsExporter, prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    exporter.histogram("lat_seconds", {"service": "shop-h", "variant": "baseline"},
                       {0.1: 50, 0.5: 90, 1.0: 100})  # fmt: skip
    exporter.histogram("lat_seconds", {"service": "shop-h", "variant": "canary"},
                       {0.1: 10, 0.5: 50, 1.0: 100})  # fmt: skip
    prometheus.wait_value('lat_seconds_bucket{service="shop-h",variant="canary",le="0.5"}', 50)
    prometheus.wait_value('lat_seconds_bucket{service="shop-h",variant="baseline",le="0.5"}', 90)
    p90 = spec(name="p90", kind="histogram", query=(
        'histogram_quantile(0.9, sum by (le) (last_over_time('
        'lat_seconds_bucket{service="shop-h",variant="$variant"}[$window])))'))  # fmt: skip

    evidence = await client.read(p90, VARIANTS, 60)

    # rank 90: the baseline's at the top of the 0.1-0.5 bucket, the canary's 40 of the
    # 50 into the 0.5-1 bucket
    assert evidence.baseline.value == pytest.approx(0.5)
    assert evidence.canary.value == pytest.approx(0.9)


async def test_several_series_are_no_data_with_the_hint(
    exporter: MetricsExporter, prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    for pod, value in (("a", 1), ("b", 2), ("c", 3)):
        exporter.gauge("pod_load", {"service": "shop-s", "variant": "canary", "pod": pod}, value)
    exporter.gauge("pod_load", {"service": "shop-s", "variant": "baseline", "pod": "a"}, 1)
    prometheus.wait_value('count(pod_load{service="shop-s"})', 4)
    load = spec(name="load", kind="gauge", query='pod_load{service="shop-s",variant="$variant"}')

    evidence = await client.read(load, VARIANTS, 60)

    assert evidence.canary.no_data
    assert evidence.canary.reason == "3 series, expected one: add a sum()/max()"
    assert evidence.baseline.value == 1


async def test_no_series_and_nan_are_no_data(
    exporter: MetricsExporter, prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    exporter.gauge("zero_total", {"service": "shop-n", "variant": "canary"}, 0)
    prometheus.wait_value('zero_total{service="shop-n"}', 0)
    nan = spec(name="nan", kind="gauge",
               query='sum(zero_total{service="shop-n",variant="$variant"}) / 0 * 0')  # fmt: skip

    evidence = await client.read(nan, VARIANTS, 60)

    assert evidence.canary.reason == "the value is NaN (a division by zero?)"
    assert evidence.baseline.reason == "no series matched (an empty answer)"


async def test_a_query_prometheus_refuses_is_no_data_with_its_error(
    prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    broken = spec(name="broken", kind="gauge", query='sum(rate(x{variant="$variant"}))')

    evidence = await client.read(broken, VARIANTS, 60)

    assert evidence.canary.no_data
    assert evidence.canary.reason is not None
    assert evidence.canary.reason.startswith("prometheus refused the query (HTTP 400): bad_data:")


async def test_a_query_past_its_timeout_is_no_data(prometheus: PrometheusProcess) -> None:
    client = PrometheusClient(PrometheusAccess(url=prometheus.url, timeout_sec=0.001))
    try:
        value = await client.read(
            spec(name="up", kind="gauge", query='up{job="canary-test",v="$variant"}'),
            VARIANTS, 60,
        )  # fmt: skip
    finally:
        await client.aclose()

    assert value.canary.reason == value.baseline.reason == "timed out after 0.001 s"


async def test_a_fractional_timeout_is_one_prometheus_takes(
    exporter: MetricsExporter, prometheus: PrometheusProcess
) -> None:
    exporter.gauge("frac_g", {"service": "shop-f", "variant": "canary"}, 4)
    prometheus.wait_value('frac_g{service="shop-f"}', 4)
    client = PrometheusClient(PrometheusAccess(url=prometheus.url, timeout_sec=1.5))
    try:
        evidence = await client.read(
            spec(name="f", kind="gauge", query='sum(frac_g{service="shop-f",variant="$variant"})'),
            VARIANTS, 60,
        )  # fmt: skip
    finally:
        await client.aclose()

    assert evidence.canary.value == 4
