"""An open-loop run of a real `UpstreamGate` in front of a FIFO upstream, on simulated
time: arrivals on a fixed schedule, `capacity` places of `service` seconds each (with
optional noise), the sidecar's own time around each request, timers fired in order.

The closed-loop `simulation.Run` gives every request of a round the same latency
(processor sharing); a FIFO upstream does not: with a few more in flight than places,
most requests do not wait and a few wait almost a whole service time, which is what
the limit's statistic has to see (decision 0032).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.kernel.overload import OverloadConfig
from sidecar.overload.gate import ShedCounts, UpstreamGate
from sidecar.overload.guard import limit_settings, queue_policy
from sidecar.overload.limit import GradientLimit


class Handle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FifoUpstream:
    capacity: int
    service: float  # seconds
    jitter: float = 0.0  # relative spread of a service time: uniform in ±jitter
    active: int = 0
    waiting: deque[Callable[[], None]] = field(default_factory=deque)

    def service_time(self, rng: random.Random) -> float:
        return self.service * (1.0 + rng.uniform(-self.jitter, self.jitter))


@dataclass(eq=False)
class Request:
    arrived: float
    admitted: float | None = None
    sent: float | None = None
    outcome: str = ""  # "ok", or why it was shed
    latency: float | None = None  # arrival to the end of the answer, when admitted


@dataclass
class GateRun:
    config: OverloadConfig
    upstream: FifoUpstream
    rate: float  # arrivals per second
    sidecar_before: float = 0.0002  # admission to head sent
    sidecar_after: float = 0.0002  # response head to the end of the exchange
    seed: int = 1
    sample_every: float = 0.01  # seconds between two readings of the limit
    now: float = 0.0
    requests: list[Request] = field(default_factory=list)
    limits: list[tuple[float, int]] = field(default_factory=list)  # (when, limit)
    gate: UpstreamGate = field(init=False)

    def __post_init__(self) -> None:
        self._events: list[tuple[float, int, Callable[[], None], Handle | None]] = []
        self._seq = itertools.count()
        self._rng = random.Random(self.seed)
        self.gate = UpstreamGate(
            "http://upstream:1",
            GradientLimit(limit_settings(self.config), self.now),
            queue_policy(self.config),
            monotonic=lambda: self.now,
            call_later=self._call_later,  # type: ignore[arg-type]
            shed_counts=ShedCounts(),
        )
        self._next_arrival = self.now
        self._at(self.now, self._read_limit)

    def _read_limit(self) -> None:
        self.limits.append((self.now, self.gate.limiter.limit))
        self._at(self.now + self.sample_every, self._read_limit)

    def _at(self, when: float, callback: Callable[[], None], handle: Handle | None = None) -> None:
        heapq.heappush(self._events, (when, next(self._seq), callback, handle))

    def _call_later(self, delay: float, callback: Callable[[], None]) -> Handle:
        handle = Handle()
        self._at(self.now + delay, callback, handle)
        return handle

    def until(self, end: float) -> None:
        interval = 1.0 / self.rate
        while True:
            due = self._events[0][0] if self._events else end
            if self._next_arrival <= min(due, end):
                self.now = self._next_arrival
                self._next_arrival += interval
                self._arrive()
                continue
            if due > end:
                break
            when, _, callback, handle = heapq.heappop(self._events)
            self.now = when
            if handle is None or not handle.cancelled:
                callback()
        self.now = end

    def _arrive(self) -> None:
        request = Request(self.now)
        self.requests.append(request)
        self.gate.enter(_Waiter(self, request), "stable", False)

    def _admitted(self, request: Request) -> None:
        request.admitted = self.now
        self._at(self.now + self.sidecar_before, lambda: self._send(request))

    def _send(self, request: Request) -> None:
        request.sent = self.now
        up = self.upstream
        if up.active < up.capacity and not up.waiting:
            self._serve(request)
        else:
            up.waiting.append(lambda: self._serve(request))

    def _serve(self, request: Request) -> None:
        self.upstream.active += 1
        self._at(self.now + self.upstream.service_time(self._rng), lambda: self._done(request))

    def _done(self, request: Request) -> None:
        up = self.upstream
        up.active -= 1
        while up.waiting and up.active < up.capacity:
            up.waiting.popleft()()
        assert request.sent is not None
        upstream_sec = self.now - request.sent
        self._at(self.now + self.sidecar_after, lambda: self._end(request, upstream_sec))

    def _end(self, request: Request, upstream_sec: float) -> None:
        assert request.admitted is not None
        request.outcome = "ok"
        request.latency = self.now - request.arrived
        self.gate.release(request.admitted, upstream_sec=upstream_sec)

    def latencies(self, since: float, until: float | None = None) -> list[float]:
        """Arrival to the end of the answer of the admitted requests that arrived
        within [since, until), sorted."""
        end = self.now if until is None else until
        return sorted(
            r.latency
            for r in self.requests
            if since <= r.arrived < end and r.latency is not None
        )

    def mean_limit(self, since: float, until: float | None = None) -> float:
        end = self.now if until is None else until
        window = [limit for at, limit in self.limits if since <= at < end]
        return sum(window) / len(window)

    def goodput(self, since: float, until: float) -> float:
        """Admitted requests per second that arrived within [since, until)."""
        return len(self.latencies(since, until)) / (until - since)


def quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank `q` quantile of a sorted, non-empty list."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(eq=False)
class _Waiter:
    run: GateRun
    request: Request

    def admit(self, gate: UpstreamGate, degrade: bool) -> None:
        self.run._admitted(self.request)

    def shed(self, gate: UpstreamGate, reason: str) -> None:
        self.request.outcome = reason
