"""Overload protection on /metrics: limits, in flight, queues, levels, level changes and
shed counts."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sidecar.overload.guard import OverloadGuard
from sidecar.overload.watcher import OverloadWatcher


class OverloadMetricsCollector(Collector):
    def __init__(self, watcher: OverloadWatcher, prefix: str = "canary_sidecar_overload") -> None:
        self._watcher = watcher
        self._prefix = prefix
        # shed counts survive protection being turned off and on again
        self._guards: list[OverloadGuard] = []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        p = self._prefix
        guard = self._watcher.proxy.overload
        if guard is not None and all(g is not guard for g in self._guards):
            self._guards.append(guard)
        gauges = {
            name: GaugeMetricFamily(f"{p}_{name}", help_, labels=["upstream"])
            for name, help_ in (
                ("limit", "Concurrency limit in force per upstream"),
                ("in_flight", "Admitted requests in flight per upstream"),
                ("queued", "Requests waiting for a place per upstream"),
                ("level", "Overload level: 0 normal, 1 light, 2 heavy, 3 severe"),
            )
        }
        if guard is not None:
            for gate in guard.gates.values():
                gauges["limit"].add_metric([gate.name], gate.limiter.limit)
                gauges["in_flight"].add_metric([gate.name], gate.in_flight)
                gauges["queued"].add_metric([gate.name], len(gate.waiting))
                gauges["level"].add_metric([gate.name], int(gate.level))
        yield from gauges.values()
        shed = CounterMetricFamily(
            f"{p}_shed",
            "Requests answered by the sidecar without reaching the upstream (never sampled)",
            labels=["variant", "reason", "priority"],
        )
        totals: dict[tuple[str, str, str], int] = {}
        for seen in self._guards:
            for key, count in seen.shed_counts.counts.items():
                totals[key] = totals.get(key, 0) + count
        for (variant, reason, priority), count in sorted(totals.items()):
            shed.add_metric([variant, reason, priority], count)
        yield shed
        changes = CounterMetricFamily(
            f"{p}_level_changes",
            "Overload levels entered per upstream (normal, light, heavy, severe)",
            labels=["upstream", "level"],
        )
        entered: dict[tuple[str, str], int] = {}
        for seen in self._guards:
            for entry, count in seen.level_counts.counts.items():
                entered[entry] = entered.get(entry, 0) + count
        for (upstream, level), count in sorted(entered.items()):
            changes.add_metric([upstream, level], count)
        yield changes
        stats = self._watcher.stats
        yield CounterMetricFamily(
            f"{p}_configs_applied", "Overload config values put in force", value=stats.applied
        )
        yield CounterMetricFamily(
            f"{p}_configs_rejected",
            "Overload config values refused, the one in force kept",
            value=stats.rejected,
        )
        yield GaugeMetricFamily(
            f"{p}_enabled", "1 while overload protection is on", value=int(guard is not None)
        )
