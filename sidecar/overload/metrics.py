"""Overload protection on /metrics: limits, in flight, queues, levels, level changes,
shed counts, and the service's own signal when it has one."""

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
        yield from self._external(guard)
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

    def _external(
        self, guard: OverloadGuard | None
    ) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """The service's own signal, while protection is on and it has one."""
        reading = None if guard is None else guard.external
        if guard is None or reading is None:
            return
        p = self._prefix
        now = guard.monotonic()
        if reading.value is not None:
            yield GaugeMetricFamily(
                f"{p}_signal_value", "Last value read of the service's own signal",
                value=reading.value,
            )  # fmt: skip
        yield GaugeMetricFamily(
            f"{p}_signal_fresh", "1 while the last reading is recent enough to be used",
            value=int(reading.fresh(now)),
        )  # fmt: skip
        yield GaugeMetricFamily(
            f"{p}_signal_level", "Level the service's own signal gives (0..3)",
            value=int(reading.level_at(now)),
        )  # fmt: skip
        failures = CounterMetricFamily(
            f"{p}_signal_failures", "Failed reads of the service's own signal, by reason",
            labels=["reason"],
        )  # fmt: skip
        for reason, count in sorted(reading.failures.items()):
            failures.add_metric([reason], count)
        yield failures
