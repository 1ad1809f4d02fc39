"""A real Prometheus scraping the test's exporter, shared by a module's tests (each
test uses its own metric names or service label, so they do not see each other)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane.kernel.backend_access import PrometheusAccess
from tests.support.metrics_exporter import MetricsExporter, serving
from tests.support.prometheus import PrometheusProcess


@pytest.fixture(scope="module")
def exporter() -> Iterator[MetricsExporter]:
    with serving(MetricsExporter()) as running:
        yield running


@pytest.fixture(scope="module")
def prometheus(exporter: MetricsExporter) -> Iterator[PrometheusProcess]:
    process = PrometheusProcess(exporter.port)
    try:
        process.start()
        process.wait_scraped()
        yield process
    finally:
        process.close()


@pytest.fixture
def access(prometheus: PrometheusProcess) -> PrometheusAccess:
    return PrometheusAccess(url=prometheus.url, timeout_sec=5.0)
