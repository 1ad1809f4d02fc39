"""Admission to one upstream: its adaptive limit, the requests in flight, a short
queue for those over the limit, and graded shedding (`levels`).

The queue is first in, first out while it absorbs a burst; once it stands (sustained
overload) the newest waiter goes first (adaptive LIFO, decision 0032): those that
have waited longest are the ones about to time out, and admitting them would only
pass their wait on to the answer.

A `Waiter` (the proxy's exchange) enters; the gate lets it through now or later
(`admit`), or answers for it (`shed`), never both, and at most once. An admitted
waiter leaves through `release` when its exchange ends, whatever the outcome; its
latency from admission is a sample of the limit. A queued waiter whose client goes
away leaves through `leave`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.overload.levels import (
    ABANDONED,
    LOW_PRIORITY,
    QUEUE_TIMEOUT,
    Level,
    ShareDraw,
    Thresholds,
    Verdict,
    pressure_of,
    verdict_for,
)
from sidecar.overload.limit import GradientLimit
from sidecar.overload.signals import ExternalReading, Grades, RateMeter, graded
from sidecar.proxy.limits import RateLimitedLog


def displaced_by(
    waiting: Mapping[Waiter, tuple[float, str, bool]], low: bool
) -> Waiter | None:
    """Which waiter a newcomer (`low`: of low priority) takes the place of in a full,
    standing queue (oldest first): the oldest low-priority one; else, for a newcomer
    of normal priority, the oldest of all; else none (the newcomer is shed)."""
    for candidate, (_, _, candidate_low) in waiting.items():
        if candidate_low:
            return candidate
    if low:
        return None
    return next(iter(waiting), None)


class Waiter(Protocol):
    def admit(self, gate: UpstreamGate, degrade: bool) -> None:
        """Go on to the upstream; `degrade`: ask it to (heavy overload or worse)."""
        ...

    def shed(self, gate: UpstreamGate, reason: str) -> None:
        """Answer without touching the upstream."""
        ...


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    size: int = 100
    timeout: float = 0.05  # seconds
    # a queue non-empty for `standing_after` seconds is standing: sustained overload,
    # where waiting only adds latency; what joins it waits `standing_timeout` at most.
    # Emptied for less than `standing_timeout` it still stands: a batch of answers
    # can empty it for an instant without the overload having ended (decision 0032)
    standing_after: float = 0.1
    standing_timeout: float = 0.005
    # a standing queue is served newest first
    standing_lifo: bool = True
    thresholds: Thresholds = field(default_factory=Thresholds)
    light_shed_share: float = 0.5
    hysteresis: float = 0.0
    rate: Grades | None = None  # requests per second arriving; None: not a signal

    @property
    def pressure(self) -> Grades:
        t = self.thresholds
        return Grades(t.light_at, t.heavy_at, t.severe_at)


class ShedCounts:
    """Shed requests by (variant, reason, priority): counted, never sampled."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str], int] = {}

    def add(self, variant: str, reason: str, low: bool) -> None:
        key = (variant, reason, "low" if low else "normal")
        self.counts[key] = self.counts.get(key, 0) + 1


class LevelCounts:
    """Levels entered by (upstream, level): counted across guards, as shed counts are."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def add(self, upstream: str, level: Level) -> None:
        key = (upstream, level.name.lower())
        self.counts[key] = self.counts.get(key, 0) + 1


class UpstreamGate:
    __slots__ = (
        "_draw",
        "_pressure_grades",
        "_timer",
        "_timer_due",
        "admitted",
        "call_later",
        "emptied_at",
        "external",
        "in_flight",
        "level",
        "level_changes",
        "level_counts",
        "level_log",
        "limiter",
        "monotonic",
        "name",
        "nonempty_since",
        "policy",
        "pressure_level",
        "queued_total",
        "rate",
        "rate_level",
        "shed_counts",
        "waiting",
    )

    def __init__(
        self,
        name: str,
        limiter: GradientLimit,
        policy: QueuePolicy,
        *,
        monotonic: Callable[[], float],
        call_later: Callable[[float, Callable[[], None]], asyncio.TimerHandle],
        shed_counts: ShedCounts,
        level_counts: LevelCounts | None = None,
        level_log: RateLimitedLog | None = None,
        external: ExternalReading | None = None,
    ) -> None:
        self.name = name
        # the service's own signal, shared by its gates (None: not configured)
        self.external = external
        self.limiter = limiter
        self.policy = policy
        self.monotonic = monotonic
        self.call_later = call_later
        self.shed_counts = shed_counts
        self.level_counts = level_counts if level_counts is not None else LevelCounts()
        # levels can flap with every arrival at the limit: a line per interval at most
        self.level_log = level_log
        self.in_flight = 0
        # insertion order; value (deadline, variant, low)
        self.waiting: dict[Waiter, tuple[float, str, bool]] = {}
        self.level = Level.NORMAL
        self.pressure_level = Level.NORMAL
        self.rate_level = Level.NORMAL
        self.rate = RateMeter(monotonic())
        self._pressure_grades = policy.pressure
        self.level_changes = 0
        self.admitted = 0
        self.queued_total = 0
        self.nonempty_since = 0.0  # when the queue last went from empty to not
        self.emptied_at = float("-inf")  # when it was last emptied
        self._draw = ShareDraw(policy.light_shed_share)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0  # when the armed timer fires (monotonic seconds)

    def reconfigure(self, policy: QueuePolicy, external: ExternalReading | None) -> None:
        self.policy = policy
        self.external = external
        self._pressure_grades = policy.pressure
        self._draw = ShareDraw(policy.light_shed_share)

    def _set_level(self, arrival: bool = False) -> Level:
        """The level now: the highest of the signals' (`arrival`: one more request
        arrived, for the rate)."""
        policy = self.policy
        hysteresis = policy.hysteresis
        pressure = pressure_of(self.in_flight, len(self.waiting), self.limiter.limit)
        level = self.pressure_level = graded(
            pressure, self._pressure_grades, self.pressure_level, hysteresis
        )
        rate_grades = policy.rate
        if rate_grades is not None or self.external is not None:
            now = self.monotonic()
            if arrival:
                self.rate.add(now)
            if rate_grades is not None:
                rate = self.rate.rate(now)
                self.rate_level = graded(rate, rate_grades, self.rate_level, hysteresis)
                level = max(level, self.rate_level)
            if self.external is not None:
                level = max(level, self.external.level_at(now))
        if level is not self.level:
            previous, self.level = self.level, level
            self.level_changes += 1
            self.level_counts.add(self.name, level)
            if self.level_log is not None:
                self.level_log.warning(
                    "overload level of %s: %s, was %s (limit %d, in flight %d, queued %d)",
                    self.name,
                    level.name.lower(),
                    previous.name.lower(),
                    self.limiter.limit,
                    self.in_flight,
                    len(self.waiting),
                )
        return level

    def enter(self, waiter: Waiter, variant: str, low: bool) -> None:
        level = self._set_level(arrival=True)
        limit = self.limiter.limit
        verdict, reason = verdict_for(
            level,
            low=low,
            has_slot=self.in_flight < limit and not self.waiting,
            queue_room=len(self.waiting) < self.policy.size,
            light_draw=low and level is Level.LIGHT and self._draw(),
        )
        if verdict is Verdict.ADMIT:
            self._admit(waiter, level)
            return
        policy = self.policy
        now = self.monotonic()
        waiting = self.waiting
        if not waiting and now - self.emptied_at >= policy.standing_timeout:
            self.nonempty_since = now
        standing = now - self.nonempty_since >= policy.standing_after
        displaced: Waiter | None = None
        if (
            verdict is Verdict.SHED
            and reason != LOW_PRIORITY
            and waiting  # (a level from another signal sheds with an empty queue)
            and standing
            and policy.standing_lifo
        ):
            # the queue is full (or the level severe) and stands: the oldest waiter,
            # next to time out and last to be served, is shed in place of the newest
            # one, which joins; the queue does not grow and as many are shed. A
            # low-priority waiter goes first, and a low-priority newcomer never takes a
            # normal one's place (low priority is what is shed first)
            displaced = displaced_by(waiting, low)
            if displaced is not None:
                verdict = Verdict.QUEUE
        if verdict is Verdict.QUEUE:
            old: tuple[str, bool] | None = None
            if displaced is not None:
                _, old_variant, old_low = waiting.pop(displaced)
                old = (old_variant, old_low)
            self.queued_total += 1
            deadline = now + (policy.standing_timeout if standing else policy.timeout)
            waiting[waiter] = (deadline, variant, low)
            if self._timer is None or deadline < self._timer_due:
                self._arm(deadline, now)
            if displaced is not None and old is not None:
                # last: shedding it may run its connection's next request, which enters
                # this gate again and must find the queue as it now is
                self.shed_counts.add(old[0], reason, old[1])
                displaced.shed(self, reason)
        else:
            self.shed_counts.add(variant, reason, low)
            waiter.shed(self, reason)

    def _admit(self, waiter: Waiter, level: Level) -> None:
        self.in_flight += 1
        self.admitted += 1
        waiter.admit(self, level >= Level.HEAVY)

    def release(
        self, admitted_at: float, *, sample: bool = True, upstream_sec: float | None = None
    ) -> None:
        """An admitted request ended (any outcome); `sample`: its latency says
        something of the upstream (it reached it). `upstream_sec`: the upstream's own
        part, from the head sent to the response head received, when known: the
        limit must follow the upstream, not the time a busy sidecar takes to answer
        (shedding on a starved CPU would otherwise shrink the limit further)."""
        now = self.monotonic()
        if sample:
            latency = now - admitted_at if upstream_sec is None else upstream_sec
            self.limiter.on_sample(now, latency, self.in_flight, admitted_at)
        self.in_flight -= 1
        self._drain(now)

    def leave(self, waiter: Waiter) -> None:
        """A queued request's client went away: it is counted, not answered."""
        entry = self.waiting.pop(waiter, None)
        if entry is not None:
            if not self.waiting:
                self.emptied_at = self.monotonic()
            self.shed_counts.add(entry[1], ABANDONED, entry[2])

    def _drain(self, now: float) -> None:
        waiting = self.waiting
        policy = self.policy
        while waiting and self.in_flight < self.limiter.limit:
            lifo = policy.standing_lifo and now - self.nonempty_since >= policy.standing_after
            waiter = next(reversed(waiting)) if lifo else next(iter(waiting))
            deadline, variant, low = waiting.pop(waiter)
            if not waiting:
                self.emptied_at = now
            if deadline <= now:
                self.shed_counts.add(variant, QUEUE_TIMEOUT, low)
                waiter.shed(self, QUEUE_TIMEOUT)
            else:
                self._admit(waiter, self._set_level())

    def _arm(self, due: float, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.call_later(max(0.0, due - now), self._expire)
        self._timer_due = due

    def _expire(self) -> None:
        """Sheds what waited past its deadline. Deadlines are not in queue order once a
        queue turns standing (later requests get the shorter timeout): all are looked
        at, the queue being short by then (its level is severe at twice the limit)."""
        self._timer = None
        now = self.monotonic()
        waiting = self.waiting
        expired = [w for w, (deadline, _, _) in waiting.items() if deadline <= now]
        for waiter in expired:
            _, variant, low = waiting.pop(waiter)
            self.shed_counts.add(variant, QUEUE_TIMEOUT, low)
            waiter.shed(self, QUEUE_TIMEOUT)
        if waiting:
            self._arm(min(deadline for deadline, _, _ in waiting.values()), now)
        elif expired:
            self.emptied_at = now
        self._set_level()

    def release_all(self) -> None:
        """Protection turned off: whatever waits goes on at once."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting = list(self.waiting)
        self.waiting.clear()
        for waiter in waiting:
            self._admit(waiter, Level.NORMAL)
