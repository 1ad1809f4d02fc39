"""The router agent's metrics, read from its parts' counters at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from routers.agent import RouterAgent
from routers.samples.lines import LineParser
from routers.samples.receiver import LogReceiver
from sidecar.admin import reporter_metrics
from sidecar.reporter import SampleReporter


class RouterCollector(Collector):
    """Routes applied and refused, lines received and dropped, by router kind."""

    def __init__(
        self, *, agent: RouterAgent, receiver: LogReceiver, parser: LineParser,
        reporter: SampleReporter, prefix: str = "canary_router",
        proxy_figures: Callable[[], Mapping[str, float]] = dict,
    ) -> None:
        self._proxy_figures = proxy_figures
        self._reporter = reporter
        self._agent = agent
        self._receiver = receiver
        self._parser = parser
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        p = self._prefix
        kind = self._agent.router.kind
        a = self._agent.stats
        f = self._agent.follower.stats
        routes = CounterMetricFamily(
            f"{p}_routes", "Routes by fate: applied to the proxy, refused by it (the last "
            "stays in force), coalesced (superseded before applying), rejected as malformed",
            labels=["router", "fate"],
        )
        routes.add_metric([kind, "applied"], a.applied)
        routes.add_metric([kind, "refused"], a.apply_errors)
        routes.add_metric([kind, "coalesced"], a.coalesced)
        routes.add_metric([kind, "malformed"], f.rejected_malformed)
        routes.add_metric([kind, "reapplied_after_drift"], a.drift_repaired)
        yield routes
        yield GaugeMetricFamily(
            f"{p}_in_step", "1 when the proxy holds the route etcd holds",
            value=1 if self._agent.in_step else 0,
        )
        revision = a.applied_route.revision if a.applied_route is not None else -1
        yield GaugeMetricFamily(
            f"{p}_route_revision", "The revision of the route the proxy was last given "
            "(-1: none)", value=revision,
        )
        yield CounterMetricFamily(
            f"{p}_store_errors", "Failed reads or watches of the route key", value=f.store_errors
        )
        self._receiver.refresh_drops()
        r = self._receiver.stats
        lines = CounterMetricFamily(
            f"{p}_log_lines", "Access-log datagrams by fate: received, dropped by the "
            "kernel (buffer full), too long, refused by the parser (by reason)",
            labels=["router", "fate"],
        )
        lines.add_metric([kind, "received"], r.datagrams)
        lines.add_metric([kind, "dropped_kernel"], r.dropped_kernel)
        lines.add_metric([kind, "too_long"], r.too_long)
        lines.add_metric([kind, "handler_errors"], r.read_errors)
        dropped_by_proxy = self._proxy_figures().get("dropped_log_lines")
        if dropped_by_proxy is not None:  # HAProxy counts the lines it could not send
            lines.add_metric([kind, "dropped_by_proxy"], dropped_by_proxy)
        for reason, count in sorted(self._parser.rejected.items()):
            lines.add_metric([kind, f"refused_{reason}"], count)
        yield lines
        # the reporter's figures under the sidecar's names
        yield from reporter_metrics(p, self._reporter)


__all__ = ["RouterCollector"]
