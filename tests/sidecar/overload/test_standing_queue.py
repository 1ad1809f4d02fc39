"""A standing queue (non-empty for `standing_after`) gives what joins it the short
timeout; a burst's queue keeps the long one. On an injected clock and timers fired by
the test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.kernel.clock import FakeClock
from sidecar.overload.gate import QueuePolicy, ShedCounts, UpstreamGate
from sidecar.overload.levels import Thresholds
from sidecar.overload.limit import GradientLimit, LimitSettings


@dataclass
class Timers:
    armed: list[tuple[float, Callable[[], None], Handle]] = field(default_factory=list)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Handle:
        handle = Handle()
        self.armed.append((delay, callback, handle))
        return handle

    def due(self) -> list[float]:
        return [delay for delay, _, handle in self.armed if not handle.cancelled]

    def fire_next(self) -> None:
        live = [(d, cb, h) for d, cb, h in self.armed if not h.cancelled]
        assert len(live) == 1, live  # one timer per gate
        self.armed.clear()
        live[0][1]()


@dataclass
class Handle:
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(eq=False)
class Waiter:
    name: str
    log: list[tuple[str, str]]

    def admit(self, gate: UpstreamGate, degrade: bool) -> None:
        self.log.append((self.name, "admitted"))

    def shed(self, gate: UpstreamGate, reason: str) -> None:
        self.log.append((self.name, reason))


def test_a_standing_queue_sheds_after_the_short_timeout() -> None:
    clock, timers, log = FakeClock(), Timers(), []
    settings = LimitSettings(min_limit=1, max_limit=1, initial_limit=1, min_rtt_concurrency=1)
    gate = UpstreamGate(
        "http://u:1",
        GradientLimit(settings, 0.0),
        QueuePolicy(
            size=10,
            timeout=1.0,
            standing_after=0.1,
            standing_timeout=0.005,
            thresholds=Thresholds(10.0, 10.0, 10.0),  # levels stay normal: only the queue
        ),
        monotonic=clock.monotonic,
        call_later=timers.call_later,  # type: ignore[arg-type]
        shed_counts=ShedCounts(),
    )
    w = {n: Waiter(n, log) for n in ("a", "b", "c", "d", "e")}
    gate.enter(w["a"], "v", False)  # the one place
    gate.enter(w["b"], "v", False)  # queued at 0: a burst, the long timeout
    assert timers.due() == [1.0]
    clock.advance(0.1)
    gate.enter(w["c"], "v", False)  # non-empty for 0.1 s: standing, 5 ms
    assert [round(d, 6) for d in timers.due()] == [0.005]  # re-armed for the earlier one
    clock.advance(0.005)
    timers.fire_next()
    assert log == [("a", "admitted"), ("c", "queue_timeout")]  # b, ahead, still waits
    assert [round(d, 6) for d in timers.due()] == [0.895]
    gate.release(clock.monotonic() - 0.01)  # a ends: b goes on; the queue is empty
    assert log[-1] == ("b", "admitted") and not gate.waiting
    clock.advance(0.5)
    gate.enter(w["d"], "v", False)  # a new queue: the long timeout again
    assert gate.waiting[w["d"]][0] == clock.monotonic() + 1.0
    assert gate.shed_counts.counts == {("v", "queue_timeout", "normal"): 1}
