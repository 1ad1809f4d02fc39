"""The metric board: provider metrics read in the background, their latest evidence
kept for the controller's rounds.

The controller's leader says which experiments to watch (`track`, `forget`); the
board reads each of an experiment's metrics every `spec.interval_sec` (in between,
the last evidence is what a round sees), at most `concurrency` queries at once, each
bounded by the provider's timeout. `latest` never awaits: a round takes the values
that are there, whatever Prometheus is doing meanwhile (architecture §8: the
decision core stays pure and never waits on a provider).

A metric that cannot be read is `Reading.missing(reason)` for the variant concerned,
counted by outcome, and logged once when its state changes (not every interval).
Time is injected (`clock`, `sleep`) so tests drive it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.kernel.backend_access import PrometheusAccess, prometheus_access
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.kernel.settings import Settings
from controlplane.kernel.tasks import cancel_and_wait
from controlplane.providers.evidence import MetricEvidence, Reading

log = logging.getLogger("canary.providers")

DEFAULT_CONCURRENCY = 8
# the loop looks again at least this often, so a newly tracked experiment is read soon
MAX_IDLE_SEC = 1.0
NO_PROVIDER = "no metric provider configured (CANARY_PROMETHEUS_URL)"

Sleep = Callable[[float], Awaitable[None]]


class MetricSource(Protocol):
    """What the board reads from: one metric, both variants (`PrometheusClient`)."""

    async def read(
        self, spec: MetricSpec, variants: tuple[str, str], window_sec: int
    ) -> MetricEvidence: ...

    async def aclose(self) -> None: ...


class _NoProvider:
    """Every metric is no data, saying that no provider is configured."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    async def read(
        self, spec: MetricSpec, variants: tuple[str, str], window_sec: int
    ) -> MetricEvidence:
        reading = Reading.missing(NO_PROVIDER)
        return MetricEvidence(spec.name, reading, reading, self._clock.now())

    async def aclose(self) -> None:
        return None


@dataclass
class _Watch:
    """One metric of one tracked experiment: what to read and when it is due next."""

    experiment_id: str
    service: str
    spec: MetricSpec
    window_sec: int
    variants: tuple[str, str]
    due_at: float  # monotonic
    in_flight: bool = False
    state: str | None = None  # the last logged state: "ok" or the no-data reasons' kinds

    def same_as(self, spec: MetricSpec, window_sec: int, variants: tuple[str, str]) -> bool:
        return (self.spec, self.window_sec, self.variants) == (spec, window_sec, variants)


@dataclass
class BoardStats:
    queries: Counter[str] = field(default_factory=Counter)  # by outcome
    reads: int = 0
    read_errors: int = 0  # a read that raised (a bug): recorded as no data, loop goes on

    def count(self, outcome: str) -> None:
        self.queries[outcome] += 1


class BoardMetricsCollector(Collector):
    def __init__(self, board: MetricBoard) -> None:
        self._board = board

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._board.stats
        queries = CounterMetricFamily(
            "canary_metric_provider_queries",
            "Provider queries made, by outcome (ok, timeout, unreachable, refused, "
            "several_series, empty, not_finite, bad_answer, too_large, http_error, "
            "credentials)",
            labels=["outcome"],
        )
        for outcome, count in sorted(stats.queries.items()):
            queries.add_metric([outcome], count)
        yield queries
        yield CounterMetricFamily(
            "canary_metric_provider_read_errors",
            "Metric reads that failed unexpectedly (recorded as no data)",
            value=stats.read_errors,
        )
        yield GaugeMetricFamily(
            "canary_metric_provider_watched",
            "Metrics of tracked experiments being read",
            value=self._board.watched(),
        )
        yield GaugeMetricFamily(
            "canary_metric_provider_no_data",
            "Metrics whose latest evidence has no data for a variant",
            value=self._board.without_data(),
        )


class MetricBoard:
    """Background reads of tracked experiments' metrics; `latest` for the rounds."""

    def __init__(
        self,
        source: MetricSource,
        *,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
        stats: BoardStats | None = None,
    ) -> None:
        self._source = source
        self._clock = clock or SystemClock()
        self._sleep = sleep
        self._watches: dict[str, dict[str, _Watch]] = {}
        self._evidence: dict[str, dict[str, MetricEvidence]] = {}
        self._reads: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.stats = stats or BoardStats()

    @classmethod
    def from_settings(
        cls, settings: Settings, *, clock: Clock | None = None, sleep: Sleep = asyncio.sleep
    ) -> MetricBoard:
        """A board on the configured Prometheus, or one whose every metric is no data
        (saying so) when none is configured. Raises ConfigError on bad TLS or
        credential files."""
        access = prometheus_access(settings)
        return cls.for_access(access, clock=clock, sleep=sleep)

    @classmethod
    def for_access(
        cls, access: PrometheusAccess | None, *, clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep, concurrency: int = DEFAULT_CONCURRENCY,
    ) -> MetricBoard:  # fmt: skip
        """A board on this Prometheus (None: no provider), each query holding one of
        `concurrency` slots while it runs. `clock` schedules the reads; the queries
        are evaluated at the system's time, which is Prometheus's data's time."""
        from controlplane.providers.prometheus import PrometheusClient

        clock = clock or SystemClock()
        if access is None:
            return cls(_NoProvider(SystemClock()), clock=clock, sleep=sleep)
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        stats = BoardStats()
        client = PrometheusClient(access, on_outcome=stats.count,
                                  slots=asyncio.Semaphore(concurrency))  # fmt: skip
        return cls(client, clock=clock, sleep=sleep, stats=stats)

    # -- the controller's side --------------------------------------------------------

    def track(
        self,
        experiment_id: str,
        service: str,
        specs: Sequence[MetricSpec],
        window_sec: int,
        variants: tuple[str, str],
    ) -> None:
        """Read these metrics of this experiment from now on; `variants` is
        (baseline, canary). Calling it again with the same values changes nothing (the
        schedule and the evidence stay); a changed metric is read afresh."""
        now = self._clock.monotonic()
        old = self._watches.get(experiment_id, {})
        evidence = self._evidence.get(experiment_id, {})
        watches: dict[str, _Watch] = {}
        for spec in specs:
            kept = old.get(spec.name)
            if kept is not None and kept.same_as(spec, window_sec, variants):
                watches[spec.name] = kept
                continue
            watches[spec.name] = _Watch(experiment_id, service, spec, window_sec, variants, now)
            evidence.pop(spec.name, None)
        for name in set(evidence) - set(watches):
            del evidence[name]
        self._watches[experiment_id] = watches
        self._evidence[experiment_id] = evidence
        self._wake.set()

    def forget(self, experiment_id: str) -> None:
        """Stop reading the experiment's metrics and drop their evidence; a read in
        flight finishes but its result is not kept."""
        self._watches.pop(experiment_id, None)
        self._evidence.pop(experiment_id, None)

    def latest(self, experiment_id: str) -> Mapping[str, MetricEvidence]:
        """Each metric's last evidence by name (empty before the first read). Never
        awaits: what was read, however long ago (`read_at` says when)."""
        return MappingProxyType(dict(self._evidence.get(experiment_id, {})))

    def tracked(self) -> list[str]:
        return sorted(self._watches)

    def watched(self) -> int:
        return sum(len(w) for w in self._watches.values())

    def without_data(self) -> int:
        return sum(e.no_data for by_name in self._evidence.values() for e in by_name.values())

    def metrics_collector(self) -> Collector:
        return BoardMetricsCollector(self)

    # -- reading ------------------------------------------------------------------------

    def start_due(self) -> list[asyncio.Task[None]]:
        """Start a read of each metric that is due and not already being read."""
        now = self._clock.monotonic()
        started = []
        for watches in self._watches.values():
            for watch in watches.values():
                if watch.in_flight or watch.due_at > now:
                    continue
                watch.in_flight = True
                watch.due_at = next_due(watch.due_at, watch.spec.interval_sec, now)
                task = asyncio.create_task(
                    self._read(watch), name=f"metric-{watch.experiment_id}-{watch.spec.name}"
                )
                self._reads.add(task)
                task.add_done_callback(self._reads.discard)
                started.append(task)
        return started

    async def refresh(self) -> int:
        """Read what is due now and wait for those reads; how many were started."""
        started = self.start_due()
        if started:
            await asyncio.gather(*started)
        return len(started)

    def next_due_in(self) -> float:
        """Seconds until the next metric is due (MAX_IDLE_SEC when none is)."""
        now = self._clock.monotonic()
        due = [
            w.due_at - now for ws in self._watches.values() for w in ws.values() if not w.in_flight
        ]
        return max(0.0, min([MAX_IDLE_SEC, *due]))

    async def _read(self, watch: _Watch) -> None:
        try:
            evidence = await self._source.read(watch.spec, watch.variants, watch.window_sec)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug below must not end the board
            self.stats.read_errors += 1
            log.exception("metric %s of experiment %s: the read failed",
                          watch.spec.name, watch.experiment_id)  # fmt: skip
            reading = Reading.missing(f"the read failed: {type(exc).__name__}")
            evidence = MetricEvidence(watch.spec.name, reading, reading, self._clock.now())
        finally:
            watch.in_flight = False
        self.stats.reads += 1
        current = self._watches.get(watch.experiment_id, {}).get(watch.spec.name)
        if current is not watch:  # forgotten or changed meanwhile: not this read's to say
            return
        self._evidence.setdefault(watch.experiment_id, {})[watch.spec.name] = evidence
        self._log_change(watch, evidence)

    def _log_change(self, watch: _Watch, evidence: MetricEvidence) -> None:
        state = _state(evidence)
        if state == watch.state:
            return
        first = watch.state is None
        watch.state = state
        where = f"metric {watch.spec.name} of experiment {watch.experiment_id} ({watch.service})"
        if state == "ok":
            if not first:
                log.info("%s: read again", where)
            return
        parts = [
            f"{variant} {reading.reason}"
            for variant, reading in (("canary", evidence.canary), ("baseline", evidence.baseline))
            if reading.no_data
        ]
        log.warning("%s: no data: %s", where, "; ".join(parts))

    # -- the background loop ----------------------------------------------------------

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name="metric-board")

    async def stop(self) -> None:
        """End the loop and the reads in flight, then close the provider's connections."""
        tasks = [t for t in (self._loop_task, *self._reads) if t is not None]
        self._loop_task = None
        if tasks:
            await cancel_and_wait(*tasks)
        await self._source.aclose()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            self.start_due()
            # a `track` wakes the loop early; otherwise it sleeps until the next due read
            sleeper = asyncio.ensure_future(self._sleep(self.next_due_in()))
            waker = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pending in (sleeper, waker):
                    pending.cancel()
                await asyncio.gather(sleeper, waker, return_exceptions=True)


def next_due(due_at: float, interval: float, now: float) -> float:
    """The read after one due at `due_at` and started at `now`: on the schedule (not
    drifting by the reads' durations), and a whole interval away when the schedule
    was missed (a stalled loop catches up with one read, not a burst)."""
    following = due_at + interval
    return following if following > now else now + interval


def _state(evidence: MetricEvidence) -> str:
    """The evidence's state for logging: "ok", or each variant's reason with its
    numbers taken out (so "3 series" then "4 series" is one state, not two)."""
    if not evidence.no_data:
        return "ok"
    reasons = [
        "".join("#" if c.isdigit() else c for c in reading.reason or "")
        for reading in (evidence.canary, evidence.baseline)
        if reading.no_data
    ]
    return " | ".join(reasons)


__all__ = ["NO_PROVIDER", "MetricBoard", "MetricSource"]
