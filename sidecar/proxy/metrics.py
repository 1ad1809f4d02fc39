"""Proxy counters: plain integers on the request path, exported on scrape.

Touching prometheus-client objects per request costs locks and label lookups; the
proxy instead bumps a dict entry and a histogram bucket, and `ProxyMetricsCollector`
turns them into metric families when /metrics is scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from functools import partial

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, TIMEOUT
from sidecar.choice import Sample

# seconds; proxy overhead is tens of microseconds when a pooled connection is ready
OVERHEAD_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
_OUTCOME_LABELS = {CONNECT_ERROR: "connect_error", TIMEOUT: "timeout", ABORTED: "aborted"}


def outcome_label(outcome: int) -> str:
    return _OUTCOME_LABELS.get(outcome, str(outcome))


class ProxyMetrics:
    """Requests by (variant, outcome) and the proxy-overhead histogram."""

    __slots__ = (
        "connections",
        "connections_refused",
        "overhead_count",
        "overhead_counts",
        "overhead_sum",
        "rejected",
        "requests",
        "upstream_connects",
        "upstream_retries",
    )

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.overhead_counts = [0] * (len(OVERHEAD_BUCKETS) + 1)
        self.overhead_sum = 0.0
        self.overhead_count = 0
        self.connections = 0  # open client connections
        self.connections_refused = 0  # closed at once: the connection cap was reached
        # requests refused before reaching an upstream, by reason (framing, version, …)
        self.rejected: dict[str, int] = {}
        self.upstream_connects = 0  # fresh upstream connections opened
        self.upstream_retries = 0  # stale pooled connections retried on a fresh one

    def observe(self, variant: str, outcome: int, overhead_s: float | None) -> None:
        key = (variant, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1
        if overhead_s is not None:
            self.overhead_counts[bisect_left(OVERHEAD_BUCKETS, overhead_s)] += 1
            self.overhead_sum += overhead_s
            self.overhead_count += 1

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def observe_many(self, samples: Sequence[Sample], overheads: Sequence[float]) -> None:
        """`observe` for several requests; an overhead below 0 means none was measured."""
        requests = self.requests
        for key, count in Counter([(s[2], s[4]) for s in samples]).items():
            requests[key] = requests.get(key, 0) + count
        counts = self.overhead_counts
        measured = [o for o in overheads if o >= 0]
        for index in map(partial(bisect_left, OVERHEAD_BUCKETS), measured):
            counts[index] += 1
        self.overhead_sum += sum(measured)
        self.overhead_count += len(measured)


class ProxyMetricsCollector(Collector):
    """`registry.register(ProxyMetricsCollector(server.metrics))` exports the counters."""

    def __init__(
        self,
        metrics: ProxyMetrics,
        prefix: str = "canary_sidecar",
        *,
        before_collect: Callable[[], None] | None = None,
    ) -> None:
        self._metrics = metrics
        self._prefix = prefix
        # e.g. ProxyServer.flush_samples, so a scrape counts every finished request
        self._before_collect = before_collect

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        if self._before_collect is not None:
            self._before_collect()
        m = self._metrics
        requests = CounterMetricFamily(
            f"{self._prefix}_requests",
            "Requests answered, by variant and status (or connect_error/timeout/aborted)",
            labels=["variant", "status"],
        )
        for (variant, outcome), count in sorted(m.requests.items()):
            requests.add_metric([variant, outcome_label(outcome)], count)
        yield requests
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(OVERHEAD_BUCKETS, m.overhead_counts, strict=False):
            running += count
            buckets.append((repr(bound), running))
        buckets.append(("+Inf", running + m.overhead_counts[-1]))
        overhead = HistogramMetricFamily(
            f"{self._prefix}_proxy_overhead_seconds",
            "Time from a request head received to its head written upstream "
            "(choice, pool, connect)",
        )
        overhead.add_metric([], buckets, m.overhead_sum)
        yield overhead
        yield GaugeMetricFamily(
            f"{self._prefix}_client_connections", "Open client connections", value=m.connections
        )
        yield CounterMetricFamily(
            f"{self._prefix}_connections_refused",
            "Client connections closed at once with a 503: the connection cap was reached",
            value=m.connections_refused,
        )
        rejected = CounterMetricFamily(
            f"{self._prefix}_rejected_requests",
            "Requests refused before reaching an upstream, by reason",
            labels=["reason"],
        )
        for reason, count in sorted(m.rejected.items()):
            rejected.add_metric([reason], count)
        yield rejected
        yield CounterMetricFamily(
            f"{self._prefix}_upstream_connects",
            "Fresh upstream connections opened",
            value=m.upstream_connects,
        )
        yield CounterMetricFamily(
            f"{self._prefix}_upstream_retries",
            "Requests retried on a fresh connection after a stale pooled one failed",
            value=m.upstream_retries,
        )
