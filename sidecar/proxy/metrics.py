"""Proxy counters: plain integers on the request path, exported on scrape.

Touching prometheus-client objects per request costs locks and label lookups; the
proxy instead bumps a dict entry and a histogram bucket, and `ProxyMetricsCollector`
turns them into metric families when /metrics is scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, TIMEOUT

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
_OVERHEAD_BOUNDS: Final[list[float]] = list(OVERHEAD_BUCKETS)
_OVERHEAD_BOUND_COUNT: Final = len(OVERHEAD_BUCKETS)
# seconds a tunnel lived: WebSocket sessions last from a moment to days
TUNNEL_LIFETIME_BUCKETS = (0.1, 1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
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
        "tls_handshakes_failed",
        "tls_handshaking",
        "trailer_fields_dropped",
        "trailers_dropped",
        "tunnel_bytes_downstream",
        "tunnel_bytes_upstream",
        "tunnel_lifetime_counts",
        "tunnel_lifetime_sum",
        "tunnels_closed",
        "tunnels_open",
        "tunnels_refused",
        "upstream_connects",
        "upstream_retries",
        "upstream_unsolicited",
    )

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.overhead_counts = [0] * (len(OVERHEAD_BUCKETS) + 1)
        self.overhead_sum = 0.0
        self.overhead_count = 0
        self.connections = 0  # open client connections
        # closed at once, by the cap reached (admission.MAX_CONNECTIONS, PER_CLIENT)
        self.connections_refused: dict[str, int] = {}
        self.tls_handshaking = 0  # TLS connections accepted, handshake not yet done
        self.tls_handshakes_failed: dict[str, int] = {}  # by why: timeout, error
        # requests refused before reaching an upstream, by reason (framing, version, …)
        self.rejected: dict[str, int] = {}
        self.upstream_connects = 0  # fresh upstream connections opened
        self.upstream_retries = 0  # stale pooled connections retried on a fresh one
        # upstream connections closed for sending more than the response they owed
        self.upstream_unsolicited = 0
        # trailer sections not passed on: to an HTTP/1.0 client, or too large
        self.trailers_dropped = 0
        # trailer fields that must not be trailers (trailers.NEVER_TRAILERS...), dropped
        self.trailer_fields_dropped = 0
        self.tunnels_open = 0  # upgraded connections spliced as byte tunnels
        self.tunnels_refused = 0  # upgrades answered 503: the tunnel cap was reached
        self.tunnels_closed: dict[str, int] = {}  # ended tunnels, by why (tunnel.CLOSED…)
        self.tunnel_bytes_upstream = 0  # tunnelled bytes from clients to upstreams
        self.tunnel_bytes_downstream = 0  # and back
        self.tunnel_lifetime_counts = [0] * (len(TUNNEL_LIFETIME_BUCKETS) + 1)
        self.tunnel_lifetime_sum = 0.0

    def observe(self, variant: str, outcome: int, overhead_s: float | None) -> None:
        key = (variant, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1
        if overhead_s is not None:
            self.overhead_counts[bisect_left(OVERHEAD_BUCKETS, overhead_s)] += 1
            self.overhead_sum += overhead_s
            self.overhead_count += 1

    def tunnel_ended(self, reason: str, lifetime_s: float) -> None:
        self.tunnels_open -= 1
        self.tunnels_closed[reason] = self.tunnels_closed.get(reason, 0) + 1
        self.tunnel_lifetime_counts[bisect_left(TUNNEL_LIFETIME_BUCKETS, lifetime_s)] += 1
        self.tunnel_lifetime_sum += lifetime_s

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def observe_many(
        self, variants: list[str], outcomes: list[int], overheads: list[float]
    ) -> None:
        """`observe` for several requests given column by column; an overhead below 0
        means none was measured."""
        requests = self.requests
        # counted by runs of the same (variant, outcome): most requests in a row are
        # alike, and a native comparison is far cheaper than a dict update per request
        n = len(variants)
        start = 0
        for i in range(1, n + 1):
            if i == n or variants[i] is not variants[start] or outcomes[i] != outcomes[start]:
                key = (variants[start], outcomes[start])
                requests[key] = requests.get(key, 0) + i - start
                start = i
        counts = self.overhead_counts
        # summed apart, left to right, then added (as sum() did before Python 3.12)
        total = 0.0
        measured = 0
        for overhead in overheads:
            if overhead >= 0:
                counts[_overhead_bucket(overhead)] += 1
                total += overhead
                measured += 1
        self.overhead_sum += total
        self.overhead_count += measured


def _overhead_bucket(seconds: float) -> int:
    """bisect_left(OVERHEAD_BUCKETS, seconds) for a number (not NaN), scanning from
    the bottom: an overhead is nearly always in the first buckets."""
    bounds = _OVERHEAD_BOUNDS
    index = 0
    while index < _OVERHEAD_BOUND_COUNT and bounds[index] < seconds:
        index += 1
    return index


class ProxyMetricsCollector(Collector):
    """`registry.register(ProxyMetricsCollector(server.metrics))` exports the counters."""

    def __init__(
        self,
        metrics: ProxyMetrics,
        prefix: str = "canary_sidecar",
        *,
        before_collect: Callable[[], None] | None = None,
        service: str | None = None,
    ) -> None:
        self._metrics = metrics
        self._prefix = prefix
        # the one service this sidecar fronts (a validated name): the only value its
        # label takes, so the series stay bounded by the variants and statuses
        self._service = service
        # e.g. ProxyServer.flush_samples, so a scrape counts every finished request
        self._before_collect = before_collect

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        if self._before_collect is not None:
            self._before_collect()
        m = self._metrics
        service = [] if self._service is None else [self._service]
        requests = CounterMetricFamily(
            f"{self._prefix}_requests",
            "Requests answered, by service, variant and status (or "
            "connect_error/timeout/aborted)",
            labels=[*(["service"] if service else []), "variant", "status"],
        )
        for (variant, outcome), count in sorted(m.requests.items()):
            requests.add_metric([*service, variant, outcome_label(outcome)], count)
        yield requests
        overhead = HistogramMetricFamily(
            f"{self._prefix}_proxy_overhead_seconds",
            "Time from a request head received to its head written upstream "
            "(choice, pool, connect)",
        )
        overhead.add_metric([], _buckets(OVERHEAD_BUCKETS, m.overhead_counts), m.overhead_sum)
        yield overhead
        yield GaugeMetricFamily(
            f"{self._prefix}_client_connections", "Open client connections", value=m.connections
        )
        refused = CounterMetricFamily(
            f"{self._prefix}_connections_refused",
            "Client connections closed at once (plain HTTP: with a 503), by the cap reached "
            "(max_connections, per_client)",
            labels=["reason"],
        )
        for reason, count in sorted(m.connections_refused.items()):
            refused.add_metric([reason], count)
        yield refused
        yield GaugeMetricFamily(
            f"{self._prefix}_tls_handshakes_in_progress",
            "TLS client connections accepted, their handshake not yet done",
            value=m.tls_handshaking,
        )
        failed = CounterMetricFamily(
            f"{self._prefix}_tls_handshakes_failed",
            "TLS client handshakes that failed, by reason (timeout, error)",
            labels=["reason"],
        )
        for reason, count in sorted(m.tls_handshakes_failed.items()):
            failed.add_metric([reason], count)
        yield failed
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
        yield CounterMetricFamily(
            f"{self._prefix}_upstream_unsolicited",
            "Upstream connections closed for bytes after the response they owed",
            value=m.upstream_unsolicited,
        )
        yield from self._tunnels()
        yield CounterMetricFamily(
            f"{self._prefix}_trailers_dropped",
            "Trailer sections not passed on (HTTP/1.0 client, or larger than the limit)",
            value=m.trailers_dropped,
        )
        yield CounterMetricFamily(
            f"{self._prefix}_trailer_fields_dropped",
            "Trailer fields not passed on: framing, routing, credentials and the like",
            value=m.trailer_fields_dropped,
        )

    def _tunnels(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        m = self._metrics
        total = m.tunnels_open + sum(m.tunnels_closed.values())
        yield GaugeMetricFamily(
            f"{self._prefix}_tunnels_open",
            "Upgraded connections open as tunnels",
            value=m.tunnels_open,
        )
        yield CounterMetricFamily(
            f"{self._prefix}_tunnels", "Tunnels opened (101 Switching Protocols)", value=total
        )
        closed = CounterMetricFamily(
            f"{self._prefix}_tunnels_closed",
            "Tunnels ended, by reason (closed, lost, idle, shutdown)",
            labels=["reason"],
        )
        for reason, count in sorted(m.tunnels_closed.items()):
            closed.add_metric([reason], count)
        yield closed
        yield CounterMetricFamily(
            f"{self._prefix}_tunnels_refused",
            "Upgrade requests answered 503: the tunnel cap was reached",
            value=m.tunnels_refused,
        )
        tunnel_bytes = CounterMetricFamily(
            f"{self._prefix}_tunnel_bytes",
            "Bytes relayed through tunnels, by direction",
            labels=["direction"],
        )
        tunnel_bytes.add_metric(["upstream"], m.tunnel_bytes_upstream)
        tunnel_bytes.add_metric(["downstream"], m.tunnel_bytes_downstream)
        yield tunnel_bytes
        lifetime = HistogramMetricFamily(
            f"{self._prefix}_tunnel_lifetime_seconds", "How long ended tunnels were open"
        )
        lifetime.add_metric(
            [],
            _buckets(TUNNEL_LIFETIME_BUCKETS, m.tunnel_lifetime_counts),
            m.tunnel_lifetime_sum,
        )
        yield lifetime


def _buckets(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Cumulative Prometheus buckets from per-bucket counts (the last one: above all)."""
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip(bounds, counts, strict=False):
        running += count
        buckets.append((repr(bound), running))
    buckets.append(("+Inf", running + counts[-1]))
    return buckets
