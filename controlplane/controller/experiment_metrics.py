"""Each experiment's rollout as Prometheus series: what ops dashboards and alerts read.

The leader's controller `observe`s every experiment it judges (its row and the
evidence of the decision) and `finish`es those that left the active states (by its
own decision or a user's); the collector renders the board at scrape time. Series per
experiment (labels `experiment`, `service`):

    canary_experiment_status{state}           1 for the state it is in
    canary_experiment_breaker{state}          1 for the breaker's state
    canary_experiment_canary_weight_percent   the canary's share of traffic
    canary_experiment_step                    the current step, 1-based (0: none)
    canary_experiment_trips_total             trips so far
    canary_experiment_verdict{verdict}        1 for the last look's verdict
    canary_experiment_guardrail_verdict{guardrail}   0 within, 1 over the bound but
                                              not significant, 2 breached
    canary_experiment_p95_seconds{variant}    P95 of the latency judged, last look
    canary_experiment_failure_ratio{variant}  failed / total, last look
    canary_experiment_window_requests{variant}

and per service `canary_service_{trips,promotions,rollbacks}_total`. Bounded: at most
`max_experiments` experiments and `max_services` services have series; a finished
experiment keeps its series `finished_ttl_sec` (so a scrape sees how it ended), the
oldest finished go first when the board is full, and what could not be kept is
counted in `canary_experiment_series_dropped_total`. Label values are service names
and experiment ids (both patterned, kernel/values.py), states, and guardrail names of
the rule (at most 2 + 16).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.utils import floatToGoString

from controlplane.experiments.lifecycle import ExperimentState
from controlplane.experiments.store import ExperimentRecord
from controlplane.kernel.routes import TOTAL_WEIGHT

MAX_EXPERIMENTS: Final = 1000
MAX_SERVICES: Final = 1000
FINISHED_TTL_SEC: Final = 900.0
REFUSED_KEPT: Final = 100_000  # ids remembered so that a refusal counts once
VARIANTS: Final = ("baseline", "canary")
_E: Final = ("experiment", "service")
GUARDRAIL_WITHIN, GUARDRAIL_OVER, GUARDRAIL_BREACHED = 0, 1, 2


@dataclass
class ExperimentSeries:
    """What the board keeps of one experiment: its row's standing and its last look."""

    experiment: str
    service: str
    state: str
    breaker: str
    canary_bp: int
    step: int
    trips: int
    verdict: str | None = None
    guardrails: dict[str, int] = field(default_factory=dict)
    variants: dict[str, tuple[float | None, float | None, int | None]] = field(
        default_factory=dict
    )
    finished_at: float | None = None


@dataclass
class ServiceTally:
    trips: int = 0
    promotions: int = 0
    rollbacks: int = 0


def look_of(evidence: Mapping[str, Any]) -> tuple[
    str | None, dict[str, int], dict[str, tuple[float | None, float | None, int | None]]
]:
    """The verdict, each guardrail's and each variant's numbers of a decision's
    evidence (pure); None when the look judged nothing new (no fresh window)."""
    window = evidence.get("window")
    if not isinstance(window, Mapping):
        return None, {}, {}
    verdict = window.get("verdict")
    if not isinstance(verdict, str) or verdict == "not_evaluated":
        return None, {}, {}
    guardrails: dict[str, int] = {}
    raw = window.get("guardrails")
    for name, g in (raw.items() if isinstance(raw, Mapping) else ()):
        if not isinstance(g, Mapping) or g.get("status", "judged") != "judged":
            continue
        guardrails[str(name)] = (
            GUARDRAIL_BREACHED
            if g.get("breached") is True
            else GUARDRAIL_OVER
            if g.get("exceeded") is True
            else GUARDRAIL_WITHIN
        )
    variants: dict[str, tuple[float | None, float | None, int | None]] = {}
    found = window.get("variants")
    for arm in VARIANTS:
        snap = found.get(arm) if isinstance(found, Mapping) else None
        if not isinstance(snap, Mapping):
            continue
        p95, ratio, count = snap.get("p95_ms"), snap.get("failure_ratio"), snap.get("count")
        p95_sec = _number(p95)
        variants[arm] = (
            p95_sec / 1000 if p95_sec is not None else None,
            _number(ratio),
            count if isinstance(count, int) and not isinstance(count, bool) else None,
        )
    return verdict, guardrails, variants


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class ExperimentBoard:
    max_experiments: int = MAX_EXPERIMENTS
    max_services: int = MAX_SERVICES
    finished_ttl_sec: float = FINISHED_TTL_SEC
    experiments: dict[str, ExperimentSeries] = field(default_factory=dict)
    services: dict[str, ServiceTally] = field(default_factory=dict)
    dropped: int = 0
    # one more at every change, which `BoardPage` compares with the page it wrote
    version: int = 0
    # experiments refused a series, each counted once (not once per look)
    _refused: set[str] = field(default_factory=set)

    def observe(
        self,
        experiment: ExperimentRecord,
        evidence: Mapping[str, Any] | None,
        now: float,
    ) -> None:
        """An experiment as a round left it (its row after the decision) and what the
        decision saw."""
        self.version += 1
        key = str(experiment.id)
        series = self.experiments.get(key)
        if series is None:
            if not self._room(now):
                if key not in self._refused:
                    if len(self._refused) < REFUSED_KEPT:
                        self._refused.add(key)
                    self.dropped += 1
                return
            series = ExperimentSeries(
                key, experiment.service, "", "", 0, 0, experiment.trips
            )
            self.experiments[key] = series
        if experiment.trips > series.trips:
            tally = self._tally(experiment.service)
            if tally is not None:
                tally.trips += experiment.trips - series.trips
        series.state = experiment.state.value
        series.breaker = experiment.breaker_state.value
        series.canary_bp = experiment.canary_weight_bp
        series.step = experiment.current_step + 1 if experiment.current_step >= 0 else 0
        series.trips = experiment.trips
        if evidence is not None:
            verdict, guardrails, variants = look_of(evidence)
            if verdict is not None:
                series.verdict, series.guardrails, series.variants = (
                    verdict, guardrails, variants
                )
        if experiment.state not in (ExperimentState.RUNNING, ExperimentState.PAUSED):
            self.finish(experiment, now)

    def finish(self, experiment: ExperimentRecord, now: float) -> None:
        """An experiment seen before has ended: its final state, counted once."""
        series = self.experiments.get(str(experiment.id))
        if series is None or series.finished_at is not None:
            return
        self.version += 1
        series.state = experiment.state.value
        series.canary_bp = experiment.canary_weight_bp
        series.breaker = experiment.breaker_state.value
        series.finished_at = now
        tally = self._tally(experiment.service)
        if tally is None:
            return
        if experiment.state is ExperimentState.PROMOTED:
            tally.promotions += 1
        elif experiment.state in (ExperimentState.ROLLED_BACK, ExperimentState.ABORTED):
            tally.rollbacks += 1

    def active_keys(self) -> set[str]:
        return {k for k, s in self.experiments.items() if s.finished_at is None}

    def drop(self, key: str) -> None:
        """An experiment whose series are no longer this board's to show."""
        if self.experiments.pop(key, None) is not None:
            self.version += 1

    def clear(self) -> None:
        """Every experiment's series gone (the services' tallies stay)."""
        if self.experiments:
            self.experiments.clear()
            self.version += 1

    def expire(self, now: float) -> None:
        """Drop the finished experiments whose time on the board is over."""
        for key in [
            k
            for k, s in self.experiments.items()
            if s.finished_at is not None and now - s.finished_at >= self.finished_ttl_sec
        ]:
            del self.experiments[key]
            self.version += 1

    def _room(self, now: float) -> bool:
        self.expire(now)
        if len(self.experiments) < self.max_experiments:
            return True
        finished = [
            (s.finished_at, k) for k, s in self.experiments.items() if s.finished_at is not None
        ]
        if not finished:
            return False
        _, oldest = min(finished)
        del self.experiments[oldest]
        self.dropped += 1
        return True

    def _tally(self, service: str) -> ServiceTally | None:
        tally = self.services.get(service)
        if tally is None:
            if len(self.services) >= self.max_services:
                self.dropped += 1
                return None
            tally = self.services[service] = ServiceTally()
        return tally


# the board's families: (name, help, the series' attribute, the label it goes in)
_INFO: Final = (
    ("canary_experiment_status",
     "1 for the experiment's state (running, paused, promoted, rolled_back, aborted)",
     "state", "state"),
    ("canary_experiment_breaker", "1 for the breaker's state (closed, open, half_open)",
     "breaker", "state"),
    ("canary_experiment_verdict",
     "1 for the verdict of the last look at a fresh window (pass, breach, "
     "too_few_samples, no_data, overloaded, held)", "verdict", "verdict"),
)  # fmt: skip
# (name as prometheus_client takes it, help, type, the value of a series)
_PER_EXPERIMENT: Final[tuple[tuple[str, str, str, Callable[[ExperimentSeries], float]], ...]] = (
    ("canary_experiment_canary_weight_percent", "The canary's share of traffic", "gauge",
     lambda s: s.canary_bp * 100 / TOTAL_WEIGHT),
    ("canary_experiment_step", "The current step of the schedule, 1-based", "gauge",
     lambda s: s.step),
    ("canary_experiment_trips", "Trips of the breaker", "counter", lambda s: s.trips),
)  # fmt: skip
_GUARDRAIL: Final = (
    "canary_experiment_guardrail_verdict",
    "Each guardrail at the last look: 0 within its bound, 1 over it but not "
    "significant, 2 breached",
)
# in the order of ExperimentSeries.variants' numbers
_PER_VARIANT: Final = (
    ("canary_experiment_p95_seconds",
     "P95 of the latency the rule judges, per variant, at the last look"),
    ("canary_experiment_failure_ratio", "Failed / total requests per variant at the last look"),
    ("canary_experiment_window_requests",
     "Requests in the window judged, per variant, at the last look"),
)  # fmt: skip
_PER_SERVICE: Final = (
    ("trips", "Trips of the breaker, per service, seen by this leader"),
    ("promotions", "Experiments promoted, per service, seen by this leader"),
    ("rollbacks", "Experiments rolled back or aborted, per service, seen by this leader"),
)
_DROPPED: Final = (
    "canary_experiment_series_dropped",
    "Experiments or services left without series: the board was full",
)


def board_families(
    board: ExperimentBoard,
) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """The board as prometheus_client's metric families: the reference the tests
    hold `board_exposition` to, byte for byte."""
    rows = sorted(board.experiments.values(), key=lambda s: (s.service, s.experiment))
    for name, help_text, attribute, label in _INFO:
        yield _info(name, help_text, ((s, getattr(s, attribute)) for s in rows
                                      if getattr(s, attribute) is not None), label)
    for name, help_text, kind, read in _PER_EXPERIMENT:
        maker = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        family = maker(name, help_text, labels=_E)
        for s in rows:
            family.add_metric([s.experiment, s.service], read(s))
        yield family
    guardrail = GaugeMetricFamily(*_GUARDRAIL, labels=(*_E, "guardrail"))
    for s in rows:
        for name, value in sorted(s.guardrails.items()):
            guardrail.add_metric([s.experiment, s.service, name], value)
    yield guardrail
    for index, (name, help_text) in enumerate(_PER_VARIANT):
        family = GaugeMetricFamily(name, help_text, labels=(*_E, "variant"))
        for s in rows:
            for arm, numbers in sorted(s.variants.items()):
                number = numbers[index]
                if number is not None:
                    family.add_metric([s.experiment, s.service, arm], number)
        yield family
    for name, help_text in _PER_SERVICE:
        per_service = CounterMetricFamily(f"canary_service_{name}", help_text,
                                          labels=("service",))
        for service, tally in sorted(board.services.items()):
            per_service.add_metric([service], getattr(tally, name))
        yield per_service
    yield CounterMetricFamily(*_DROPPED, value=board.dropped)


def _go(value: float) -> str:
    """A sample's value as prometheus_client writes it."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def _label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _head(out: list[str], name: str, help_text: str, kind: str) -> None:
    escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
    out.append(f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n")


def board_exposition(board: ExperimentBoard) -> str:
    """`board_families` in the text exposition format, written directly.

    The same families, samples and bytes as prometheus_client renders them (label
    names sorted, values as floatToGoString writes them; the tests compare the two on
    random boards), at a tenth of the CPU: at N = 1,000 the board is ~14,000 samples,
    and building and rendering them through the library took ~180 ms of CPU a scrape,
    on a thread that shares the GIL with the leader's rounds (decision 0069)."""
    rows = sorted(board.experiments.values(), key=lambda s: (s.service, s.experiment))
    # each row's own labels, escaped once: `experiment` sorts before `guardrail`,
    # `service` before `state`, `variant` and `verdict`
    ids = [(s, _label(s.experiment), _label(s.service)) for s in rows]
    out: list[str] = []
    for name, help_text, attribute, label in _INFO:
        _head(out, name, help_text, "gauge")
        for s, e, svc in ids:
            value = getattr(s, attribute)
            if value is not None:
                out.append(f'{name}{{experiment="{e}",service="{svc}",'
                           f'{label}="{_label(value)}"}} 1.0\n')
    for base, help_text, kind, read in _PER_EXPERIMENT:
        name = f"{base}_total" if kind == "counter" else base
        _head(out, name, help_text, kind)
        out.extend(
            f'{name}{{experiment="{e}",service="{svc}"}} {_go(read(s))}\n'
            for s, e, svc in ids
        )
    name, help_text = _GUARDRAIL
    _head(out, name, help_text, "gauge")
    for s, e, svc in ids:
        for guardrail, value in sorted(s.guardrails.items()):
            out.append(f'{name}{{experiment="{e}",guardrail="{_label(guardrail)}",'
                       f'service="{svc}"}} {_go(value)}\n')
    for index, (name, help_text) in enumerate(_PER_VARIANT):
        _head(out, name, help_text, "gauge")
        for s, e, svc in ids:
            for arm, numbers in sorted(s.variants.items()):
                value = numbers[index]
                if value is not None:
                    out.append(f'{name}{{experiment="{e}",service="{svc}",'
                               f'variant="{_label(arm)}"}} {_go(value)}\n')
    for tally_name, help_text in _PER_SERVICE:
        name = f"canary_service_{tally_name}_total"
        _head(out, name, help_text, "counter")
        out.extend(
            f'{name}{{service="{_label(service)}"}} '
            f"{_go(getattr(tally, tally_name))}\n"
            for service, tally in sorted(board.services.items())
        )
    name, help_text = _DROPPED
    _head(out, f"{name}_total", help_text, "counter")
    out.append(f"{name}_total {_go(board.dropped)}\n")
    return "".join(out)


def _info(
    name: str, help_text: str, rows: Iterable[tuple[ExperimentSeries, str]], label: str
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=(*_E, label))
    for s, value in rows:
        family.add_metric([s.experiment, s.service, value], 1)
    return family
