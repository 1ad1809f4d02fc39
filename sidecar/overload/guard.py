"""The proxy's overload protection: one gate per upstream, configured per service.

`ProxyServer.overload` is an `OverloadGuard` while protection is on, None otherwise
(the exchange then pays one attribute read). The guard picks the request's priority,
finds or makes its upstream's gate and builds what a shed request is answered.
While it has gates it times its own event loop (`LAG_PERIOD`): how late a timer fires
is what a busy loop adds to every upstream time the limits learn from, and they leave
it out (decision 0032).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from controlplane.kernel.overload import OverloadConfig
from sidecar.choice import Upstream
from sidecar.overload.gate import LevelCounts, QueuePolicy, ShedCounts, UpstreamGate, Waiter
from sidecar.overload.levels import Level, Thresholds
from sidecar.overload.limit import GradientLimit, LimitSettings
from sidecar.overload.signals import ExternalReading, Grades
from sidecar.proxy.errors import problem_response
from sidecar.proxy.headers import Header
from sidecar.proxy.limits import RateLimitedLog

log = logging.getLogger("canary.sidecar.overload")

PRIORITY = b"x-priority"
LEVEL_LOG_INTERVAL = 10.0  # seconds between two lines on one upstream's level changes
MAX_GATES = 1024  # upstreams remembered; past it the idle ones are forgotten
MAX_ANSWERS = 1024  # shed answers kept ready; past it they are made again
LAG_PERIOD = 0.01  # seconds between two readings of the event loop's lateness
# an idle loop runs a timer up to a millisecond late (its poll's timeout is in whole
# milliseconds): lateness up to this is rounding, not a busy loop, and is not counted
LAG_RESOLUTION = 0.001
FAILURE_LEVELS = {
    "ignore": Level.NORMAL,
    "light": Level.LIGHT,
    "heavy": Level.HEAVY,
    "severe": Level.SEVERE,
}


def limit_settings(config: OverloadConfig) -> LimitSettings:
    return LimitSettings(
        min_limit=config.min_limit,
        max_limit=config.max_limit,
        initial_limit=config.initial_limit,
        update_interval=config.update_interval_ms / 1000,
        statistic=config.statistic,
        percentile=config.percentile,
        rtt_buffer=config.rtt_buffer,
        smoothing=config.smoothing,
        min_rtt_interval=config.min_rtt_interval_s,
        min_rtt_samples=config.min_rtt_samples,
        min_rtt_concurrency=config.min_rtt_concurrency,
    )


def queue_policy(config: OverloadConfig) -> QueuePolicy:
    rate = config.signals.rate
    return QueuePolicy(
        size=config.queue_size,
        timeout=config.queue_timeout_ms / 1000,
        standing_after=config.queue_standing_after_ms / 1000,
        standing_timeout=min(config.queue_standing_timeout_ms, config.queue_timeout_ms) / 1000,
        standing_lifo=config.queue_standing_lifo,
        thresholds=Thresholds(config.light_at, config.heavy_at, config.severe_at),
        light_shed_share=config.light_shed_share,
        hysteresis=config.hysteresis,
        rate=None if rate is None else Grades(rate.light, rate.heavy, rate.severe),
    )


def external_reading(config: OverloadConfig) -> ExternalReading | None:
    """A fresh reading for the service's own signal, when it has one."""
    ext = config.signals.external
    if ext is None:
        return None
    return ExternalReading(
        Grades(ext.light, ext.heavy, ext.severe),
        hysteresis=config.hysteresis,
        stale_after=ext.stale_after_ms / 1000,
        failure_level=FAILURE_LEVELS[ext.on_failure],
    )


def is_low_priority(headers: list[Header], target: bytes, paths: tuple[bytes, ...]) -> bool:
    """`X-Priority: low`, or a target under one of the service's low-priority paths."""
    if paths and target.startswith(paths):
        return True
    for low, _, value in headers:
        if low == PRIORITY:
            return value.strip().lower() == b"low"
    return False


class OverloadGuard:
    def __init__(
        self,
        config: OverloadConfig,
        *,
        monotonic: Callable[[], float],
        call_later: Callable[[float, Callable[[], None]], asyncio.TimerHandle],
    ) -> None:
        self.monotonic = monotonic
        self.call_later = call_later
        self.shed_counts = ShedCounts()
        self.level_counts = LevelCounts()
        self.gates: dict[Upstream, UpstreamGate] = {}
        self.config = config
        self._settings = limit_settings(config)
        self._policy = queue_policy(config)
        # the service's own signal, shared by every gate; its probe (`probe.py`) is
        # run by whoever made the guard
        self.external = external_reading(config)
        self._paths = tuple(p.encode() for p in config.low_priority_paths)
        self._retry_after = (f"Retry-After: {config.retry_after_s}",)
        self._answers: dict[tuple[str, str, str | None, bool], tuple[bytes, int]] = {}
        self._lag_timer: asyncio.TimerHandle | None = None
        self._lag_due = 0.0
        self.loop_lag = 0.0  # the last lateness read, seconds

    def _time_loop(self) -> None:
        self._lag_due = self.monotonic() + LAG_PERIOD
        self._lag_timer = self.call_later(LAG_PERIOD, self._on_lag_timer)

    def _on_lag_timer(self) -> None:
        late = self.loop_lag = max(0.0, self.monotonic() - self._lag_due)
        lateness = max(0.0, late - LAG_RESOLUTION)
        for gate in self.gates.values():
            gate.limiter.on_loop_lag(lateness)
        if self.gates:
            self._time_loop()
        else:
            self._lag_timer = None

    def configure(self, config: OverloadConfig) -> None:
        """A new valid config: queue and levels at once; limits restart when their
        settings changed (what they learned was learned under the old ones)."""
        if config.signals.external != self.config.signals.external or (
            config.hysteresis != self.config.hysteresis
        ):
            self.external = external_reading(config)
        self.config = config
        settings = limit_settings(config)
        self._policy = queue_policy(config)
        self._paths = tuple(p.encode() for p in config.low_priority_paths)
        self._retry_after = (f"Retry-After: {config.retry_after_s}",)
        self._answers = {}  # status and Retry-After may have changed
        restart = settings != self._settings
        self._settings = settings
        now = self.monotonic()
        for gate in self.gates.values():
            gate.reconfigure(self._policy, self.external)
            if restart:
                gate.limiter = GradientLimit(settings, now)

    def gate_for(self, upstream: Upstream) -> UpstreamGate:
        gate = self.gates.get(upstream)
        if gate is None:
            if len(self.gates) >= MAX_GATES:
                for key in [k for k, g in self.gates.items() if not g.in_flight and not g.waiting]:
                    del self.gates[key]
            gate = self.gates[upstream] = UpstreamGate(
                str(upstream),
                GradientLimit(self._settings, self.monotonic()),
                self._policy,
                monotonic=self.monotonic,
                call_later=self.call_later,
                shed_counts=self.shed_counts,
                level_counts=self.level_counts,
                level_log=RateLimitedLog(log, self.monotonic, LEVEL_LOG_INTERVAL),
                external=self.external,
            )
            if self._lag_timer is None:
                self._time_loop()
        return gate

    def enter(
        self,
        waiter: Waiter,
        upstream: Upstream,
        variant: str,
        headers: list[Header],
        target: bytes,
    ) -> None:
        low = is_low_priority(headers, target, self._paths)
        self.gate_for(upstream).enter(waiter, variant, low)

    def shed_answer(self, reason: str, variant: str) -> tuple[int, str, int]:
        """What a shed request is answered: status, problem detail, Retry-After (s)."""
        detail = f"the sidecar is shedding load to variant {variant!r} ({reason})"
        return self.config.shed_status, detail, self.config.retry_after_s

    def shed_response(
        self, reason: str, variant: str, experiment: str | None, *, close: bool
    ) -> tuple[bytes, int]:
        """The HTTP/1.1 answer, made once per (reason, variant, experiment, close): under
        overload the same few are sent thousands of times a second, and building one
        (12 us) is CPU the admitted requests need."""
        key = (reason, variant, experiment, close)
        answer = self._answers.get(key)
        if answer is None:
            status, detail, _ = self.shed_answer(reason, variant)
            body = problem_response(
                status,
                detail,
                variant=variant,
                experiment=experiment,
                close=close,
                extra=self._retry_after,
            )
            if len(self._answers) >= MAX_ANSWERS:
                self._answers.clear()
            answer = self._answers[key] = (body, status)
        return answer

    def release_all(self) -> None:
        """Protection is turned off: whatever waits goes on, the loop is no longer timed."""
        if self._lag_timer is not None:
            self._lag_timer.cancel()
            self._lag_timer = None
        for gate in self.gates.values():
            gate.release_all()

    def state(self) -> dict[str, Any]:
        """What the admin endpoint shows."""
        gates = []
        for gate in self.gates.values():
            s = gate.limiter.state()
            gates.append(
                {
                    "upstream": gate.name,
                    "level": gate.level.name.lower(),
                    "limit": s.limit,
                    "estimate": round(s.estimate, 3),
                    "phase": s.phase.value,
                    "min_rtt_ms": None if s.min_rtt is None else round(s.min_rtt * 1000, 3),
                    "sample_rtt_ms": None
                    if s.sample_rtt is None
                    else round(s.sample_rtt * 1000, 3),
                    "in_flight": gate.in_flight,
                    "queued": len(gate.waiting),
                    "admitted": gate.admitted,
                    "queued_total": gate.queued_total,
                    "level_changes": gate.level_changes,
                    "pressure_level": gate.pressure_level.name.lower(),
                    "rate_level": gate.rate_level.name.lower(),
                    "rate_rps": None
                    if self._policy.rate is None
                    else round(gate.rate.rate(self.monotonic()), 1),
                }
            )
        shed = [
            {"variant": v, "reason": r, "priority": p, "count": n}
            for (v, r, p), n in sorted(self.shed_counts.counts.items())
        ]
        return {
            "enabled": True,
            "config": self.config.model_dump(mode="json"),
            "upstreams": gates,
            "shed": shed,
            "loop_lag_ms": round(self.loop_lag * 1000, 3),
            "external": self.external_state(),
        }

    def external_state(self) -> dict[str, Any] | None:
        reading = self.external
        ext = self.config.signals.external
        if reading is None or ext is None:
            return None
        now = self.monotonic()
        return {
            "source": ext.source,
            "value": reading.value,
            "age_s": None if reading.read_at is None else round(now - reading.read_at, 3),
            "fresh": reading.fresh(now),
            "level": reading.level_at(now).name.lower(),
            "reads": reading.reads,
            "failing": reading.failing,
            "last_error": reading.last_error,
            "failures": dict(sorted(reading.failures.items())),
        }
