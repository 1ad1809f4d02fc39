"""An adaptive concurrency limit learned from an upstream's latency (decision 0024).

The gradient controller of Envoy's adaptive-concurrency filter, with the smoothing and
the application-limited rule of Netflix concurrency-limits' Gradient2:

- **No-load latency** (`min_rtt`): measured first, then every `min_rtt_interval`
  seconds, with the limit pinned to `min_rtt_concurrency` until `min_rtt_samples`
  requests admitted under the pin have completed; their `statistic` is the
  no-load latency. Pinning is what keeps the baseline honest: a minimum taken while
  the limit holds the upstream busy would drift up with the queue it measures.
- **Sample latency**: the `statistic` of the requests completed in each
  `update_interval` (requests admitted before the phase began are left out): the
  **mean** by default (decision 0032), each latency counted up to what the gradient
  can act on (`min_rtt * (1 + rtt_buffer) / MIN_GRADIENT`), so one stalled request
  cannot decide an interval. The mean is what Little's law ties to the queue: with
  `n` in flight on `c` places of service time `t`, the mean is `t * n / c` whatever
  the order of service, while the median of a FIFO upstream stays near `t` until
  half the requests wait (decision 0032). `percentile` (Envoy's choice) remains.
- **Gradient**: `min_rtt * (1 + rtt_buffer) / sample`, within [0.5, 2.0]; the new
  limit is `limit * gradient`, smoothed (`smoothing` of the new value) and held
  within [min_limit, max_limit]. Below capacity latency is the no-load latency and
  the limit grows by up to `1 + rtt_buffer` per interval; past it the upstream's own
  queue raises the mean and the limit settles near `capacity * (1 + rtt_buffer)`,
  whose integer part is in force. Growth speeds up with each queue-free interval in
  a row (`next_limit`'s `clear`): a limit that fell under a slow spell is back in
  seconds, while one probing the capacity meets a queue every few intervals and
  grows slowly (decision 0032).
- **The sidecar's own lateness is left out**: an upstream time ends when the
  sidecar's event loop gets to the response, so a busy loop adds to every sample and
  would shrink the limit while the upstream idles (decision 0026). The guard reports
  how late a periodic timer fires, beyond its rounding (`on_loop_lag`); the mean
  lateness of an interval (or a measurement) is subtracted from its latency
  (decision 0032).
- **Application-limited**: while fewer than half the limit were in flight during an
  interval the latency says nothing about capacity: the limit does not grow (it still
  falls when latency rises).

Time comes in as arguments (`now`, seconds on a monotonic clock): nothing here reads
a clock, so tests drive it with synthetic latency sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Literal

MIN_GRADIENT = 0.5
MAX_GRADIENT = 2.0
# queue-free intervals in a row that add the growth rate once more (`next_limit`)
CLEAR_SCALE = 10
# standard errors added to a measured mean no-load latency (`no_load_latency`)
NO_LOAD_ERRORS = 2.0
# at most this many latencies are kept per interval; a busier interval ends early
MAX_INTERVAL_SAMPLES = 4096
# the loop's lateness is taken off a latency up to this share of it (GradientLimit)
MAX_LAG_SHARE = 0.5


Statistic = Literal["mean", "percentile"]


class Phase(Enum):
    MEASURING = "measuring"  # pinned to min_rtt_concurrency, learning the no-load latency
    ADAPTING = "adapting"


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """Bounds are checked where settings come from (`sidecar.overload.config`)."""

    min_limit: int = 1
    max_limit: int = 1000
    initial_limit: int = 20
    update_interval: float = 0.1  # seconds per sample interval
    statistic: Statistic = "mean"  # of latencies, to summarise an interval or a measurement
    percentile: float = 0.5  # the percentile, when that is the statistic
    rtt_buffer: float = 0.05  # latency above the no-load latency still taken as no queue
    smoothing: float = 0.3  # weight of the new limit against the old one (decision 0026)
    min_rtt_interval: float = 60.0  # seconds between no-load measurements
    min_rtt_samples: int = 25
    min_rtt_concurrency: int = 3


@dataclass(frozen=True, slots=True)
class LimitState:
    """What the limit is and why, for the admin endpoint and metrics."""

    phase: Phase
    limit: int
    estimate: float  # the adapted limit (in force again after a measurement)
    min_rtt: float | None  # seconds, None until first measured
    sample_rtt: float | None  # the last interval's, seconds
    next_min_rtt_at: float  # monotonic seconds


def percentile_of(values: list[float], q: float) -> float:
    """The nearest-rank `q` percentile (0 < q <= 1) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def capped_mean(values: list[float], cap: float) -> float:
    """The mean of a non-empty list, each value counted up to `cap`."""
    return sum(min(v, cap) for v in values) / len(values)


def no_load_latency(values: list[float], s: LimitSettings) -> float:
    """The no-load latency from the latencies of a measurement (non-empty).

    For the mean: each latency counted up to twice the median (a stall during the
    measurement would otherwise raise the baseline, and every limit after it), and
    the upper end of the estimate's confidence, `NO_LOAD_ERRORS` standard errors
    above the mean. A baseline measured low by chance would shrink the limit below
    the capacity at every interval until the next measurement; one measured high lets
    it settle a little higher, by as much as the service's latency is noisy."""
    if s.statistic == "percentile":
        return percentile_of(values, s.percentile)
    capped = [min(v, 2.0 * percentile_of(values, 0.5)) for v in values]
    n = len(capped)
    mean = sum(capped) / n
    if n < 2:
        return mean
    variance = sum((v - mean) ** 2 for v in capped) / (n - 1)
    return mean + NO_LOAD_ERRORS * math.sqrt(variance / n)


def interval_latency(values: list[float], min_rtt: float, s: LimitSettings) -> float:
    """One interval's latency from its latencies (non-empty)."""
    if s.statistic == "percentile":
        return percentile_of(values, s.percentile)
    # beyond this a latency cannot lower the gradient further (it is clamped there)
    return capped_mean(values, min_rtt * (1.0 + s.rtt_buffer) / MIN_GRADIENT)


def next_limit(
    limit: float, sample_rtt: float, min_rtt: float, s: LimitSettings, clear: int = 0
) -> float:
    """The limit after one interval whose latency was `sample_rtt` (pure); `clear`:
    how many intervals in a row before it showed no queue. Growth speeds up with
    them (by a tenth of its rate per interval, TCP's slow start in spirit): a limit
    far below what the upstream serves comes back within seconds, while one probing
    the capacity, which meets a queue every few intervals, still grows slowly."""
    gradient = min_rtt * (1.0 + s.rtt_buffer) / sample_rtt if sample_rtt > 0 else MAX_GRADIENT
    if gradient > 1.0:
        gradient = 1.0 + (gradient - 1.0) * (1.0 + clear / CLEAR_SCALE)
    gradient = min(MAX_GRADIENT, max(MIN_GRADIENT, gradient))
    smoothed = limit * (1.0 - s.smoothing) + limit * gradient * s.smoothing
    return min(float(s.max_limit), max(float(s.min_limit), smoothed))


class GradientLimit:
    """The limit of one upstream: `limit` now; `on_sample` for each completed request."""

    __slots__ = (
        "_clear",
        "_estimate",
        "_in_flight_peak",
        "_interval_end",
        "_lag_count",
        "_lag_sum",
        "_latencies",
        "_min_rtt",
        "_next_min_rtt_at",
        "_phase",
        "_phase_start",
        "_sample_rtt",
        "limit",
        "settings",
    )

    def __init__(self, settings: LimitSettings, now: float) -> None:
        self.settings = settings
        self._estimate = float(
            min(settings.max_limit, max(settings.min_limit, settings.initial_limit))
        )
        self._min_rtt: float | None = None
        self._sample_rtt: float | None = None
        self._latencies: list[float] = []
        self._in_flight_peak = 0
        self._lag_sum = 0.0
        self._lag_count = 0
        self._clear = 0  # intervals in a row that showed no queue and could grow
        self._phase = Phase.ADAPTING
        self._phase_start = now
        self._interval_end = now
        self._next_min_rtt_at = now
        self.limit = 0  # set by _measure
        self._measure(now)

    def on_loop_lag(self, lateness: float) -> None:
        """The event loop ran a timer `lateness` seconds later than it was due (beyond
        the timer's own rounding)."""
        self._lag_sum += lateness
        self._lag_count += 1

    def _without_lag(self, latencies: list[float]) -> list[float]:
        """Each latency less the mean lateness of the loop since the window began, by
        at most `MAX_LAG_SHARE` of it: a lateness read in a busy instant must not turn
        a latency into nothing (the gradient would then read any upstream as idle)."""
        if not self._lag_count:
            return latencies
        lag = self._lag_sum / self._lag_count
        return [v - min(lag, v * MAX_LAG_SHARE) for v in latencies]

    def on_sample(
        self, now: float, rtt: float, in_flight: int, admitted_at: float | None = None
    ) -> None:
        """A request admitted at `admitted_at` (default `now - rtt`) completed at `now`
        after `rtt` of upstream time; `in_flight`: how many were admitted to this
        upstream just before it completed."""
        if (now - rtt if admitted_at is None else admitted_at) < self._phase_start:
            return  # admitted under another phase's limit: its latency says nothing of this one
        latencies = self._latencies
        latencies.append(rtt)
        if in_flight > self._in_flight_peak:
            self._in_flight_peak = in_flight
        s = self.settings
        if self._phase is Phase.MEASURING:
            if len(latencies) >= s.min_rtt_samples:
                # never below the fastest request seen: a lateness the measurement
                # happened to read high would pin the limit low until the next one
                self._min_rtt = max(
                    min(latencies), no_load_latency(self._without_lag(latencies), s)
                )
                self._adapt(now)
            return
        if now >= self._interval_end or len(latencies) >= MAX_INTERVAL_SAMPLES:
            self._close_interval(now)

    def _close_interval(self, now: float) -> None:
        s = self.settings
        min_rtt = self._min_rtt
        assert min_rtt is not None
        # the lateness leaves each latency before the cap: capped first, a late loop
        # could hold every interval below the cap whatever the upstream's latency
        sample = self._sample_rtt = interval_latency(
            self._without_lag(self._latencies), min_rtt, s
        )
        proposed = next_limit(self._estimate, sample, min_rtt, s, self._clear)
        # application-limited: too few in flight to have tested a higher limit
        if proposed < self._estimate or self._in_flight_peak * 2 >= self._estimate:
            self._clear = self._clear + 1 if proposed > self._estimate else 0
            self._estimate = proposed
        else:
            self._clear = 0
        self._new_window()
        self._interval_end = now + s.update_interval
        if now >= self._next_min_rtt_at:
            self._measure(now)
        else:
            self.limit = max(s.min_limit, int(self._estimate))

    def _new_window(self) -> None:
        self._latencies = []
        self._in_flight_peak = 0
        self._lag_sum = 0.0
        self._lag_count = 0

    def _measure(self, now: float) -> None:
        s = self.settings
        self._phase = Phase.MEASURING
        self._phase_start = now
        self._new_window()
        # a measurement breaks the run of queue-free intervals: growth after it starts
        # at its usual rate, whatever the run before it was
        self._clear = 0
        self.limit = min(s.max_limit, max(s.min_limit, s.min_rtt_concurrency))

    def _adapt(self, now: float) -> None:
        s = self.settings
        self._phase = Phase.ADAPTING
        self._phase_start = now
        self._new_window()
        self._interval_end = now + s.update_interval
        self._next_min_rtt_at = now + s.min_rtt_interval
        self.limit = max(s.min_limit, int(self._estimate))

    def state(self) -> LimitState:
        return LimitState(
            phase=self._phase,
            limit=self.limit,
            estimate=self._estimate,
            min_rtt=self._min_rtt,
            sample_rtt=self._sample_rtt,
            next_min_rtt_at=self._next_min_rtt_at,
        )
