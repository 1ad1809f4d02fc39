"""A closed-loop upstream for the limit's table tests: time moves only here.

`demand` clients keep one request each outstanding; the limiter admits
`min(demand, limit)` of them; the upstream serves `capacity` at once in `service`
seconds and queues the rest (processor sharing), so a round of `n` requests takes
`service * max(1, n / capacity)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.overload.limit import GradientLimit, LimitSettings, Phase


@dataclass
class Upstream:
    capacity: int
    service: float  # seconds per request at or below capacity

    def latency(self, in_flight: int) -> float:
        return self.service * max(1.0, in_flight / self.capacity)


@dataclass
class Run:
    settings: LimitSettings
    upstream: Upstream
    demand: int
    now: float = 0.0
    limits: list[tuple[float, int]] = field(default_factory=list)  # while adapting
    pinned: list[tuple[float, int]] = field(default_factory=list)  # while measuring
    limiter: GradientLimit = field(init=False)

    def __post_init__(self) -> None:
        self.limiter = GradientLimit(self.settings, self.now)

    def until(self, end: float) -> None:
        while self.now < end:
            in_flight = min(self.demand, self.limiter.limit)
            rtt = self.upstream.latency(in_flight)
            self.now += rtt
            for done in range(in_flight):
                self.limiter.on_sample(self.now, rtt, in_flight - done)
            if self.limiter.state().phase is Phase.ADAPTING:
                self.limits.append((self.now, self.limiter.limit))
            else:
                self.pinned.append((self.now, self.limiter.limit))

    def mean_limit(self, since: float) -> float:
        window = [limit for at, limit in self.limits if at >= since]
        return sum(window) / len(window)

    def first_within(self, since: float, low: float, high: float) -> float | None:
        """When the adapted limit entered [low, high] after `since` and stayed there."""
        entered: float | None = None
        for at, limit in self.limits:
            if at < since:
                continue
            if not low <= limit <= high:
                entered = None
            elif entered is None:
                entered = at
        return entered
