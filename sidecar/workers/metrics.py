"""The supervisor's /metrics: its workers' families merged, and the workers themselves."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from sidecar.workers import aggregate
from sidecar.workers.slot import WorkerSlot

# families the supervisor answers for itself, whatever its workers say
OWN = frozenset({"canary_sidecar_admin_unauthorized", "canary_sidecar_ready"})


class WorkersCollector(Collector):
    """Reads what `Supervisor.refresh` stored in the slots; no I/O at collect time."""

    def __init__(
        self, slots: Sequence[WorkerSlot], ready: Callable[[], bool], prefix: str = "canary_sidecar"
    ) -> None:
        self._slots = slots
        self._ready = ready
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        p = self._prefix
        slots = self._slots
        yield from aggregate.merge(
            (families for slot in slots for families in slot.families()), skip=OWN
        )
        yield GaugeMetricFamily(
            f"{p}_ready",
            "1 when every worker listens with a route or default upstream in force",
            value=1 if self._ready() else 0,
        )
        yield GaugeMetricFamily(f"{p}_workers", "Worker processes configured", value=len(slots))
        up = GaugeMetricFamily(
            f"{p}_worker_up", "1 while the worker's process runs", labels=["worker"]
        )
        restarts = CounterMetricFamily(
            f"{p}_worker_restarts",
            "Worker processes restarted after an unasked exit",
            labels=["worker"],
        )
        requests = CounterMetricFamily(
            f"{p}_worker_requests",
            "Requests answered by each worker (all its processes)",
            labels=["worker"],
        )
        errors = CounterMetricFamily(
            f"{p}_worker_scrape_errors",
            "Reads of a worker's metrics that failed (its last reading was used)",
            labels=["worker"],
        )
        for slot in slots:
            label = [str(slot.index)]
            up.add_metric(label, 1 if slot.running else 0)
            restarts.add_metric(label, slot.restarts)
            served = sum(
                aggregate.total(families, f"{p}_requests_total") for families in slot.families()
            )
            requests.add_metric(label, served)
            errors.add_metric(label, slot.scrape_errors)
        yield from (up, restarts, requests, errors)
