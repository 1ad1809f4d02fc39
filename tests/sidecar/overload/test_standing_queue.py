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


def _gate(
    clock: FakeClock, timers: Timers, *, size: int = 10, lifo: bool = True
) -> UpstreamGate:
    settings = LimitSettings(min_limit=1, max_limit=1, initial_limit=1, min_rtt_concurrency=1)
    return UpstreamGate(
        "http://u:1",
        GradientLimit(settings, 0.0),
        QueuePolicy(
            size=size,
            timeout=1.0,
            standing_after=0.1,
            standing_timeout=0.005,
            standing_lifo=lifo,
            thresholds=Thresholds(10.0, 10.0, 10.0),  # levels stay normal: only the queue
        ),
        monotonic=clock.monotonic,
        call_later=timers.call_later,  # type: ignore[arg-type]
        shed_counts=ShedCounts(),
    )


def _standing(gate: UpstreamGate, clock: FakeClock, w: dict[str, Waiter]) -> None:
    """`a` holds the one place, `b` has queued since 0.1 s ago: the queue stands."""
    gate.enter(w["a"], "v", False)
    gate.enter(w["b"], "v", False)
    clock.advance(0.1)


def _release(gate: UpstreamGate, clock: FakeClock) -> None:
    gate.release(clock.monotonic() - 0.01)


def _waiters(log: list[tuple[str, str]]) -> dict[str, Waiter]:
    return {n: Waiter(n, log) for n in "abcdefgh"}


def test_a_standing_queue_serves_the_newest_first() -> None:
    clock, timers, log = FakeClock(), Timers(), []
    gate, w = _gate(clock, timers), _waiters(log)
    _standing(gate, clock, w)
    gate.enter(w["c"], "v", False)
    gate.enter(w["d"], "v", False)
    _release(gate, clock)  # a ends: d, the newest, goes on
    _release(gate, clock)  # d ends: then c
    assert log == [("a", "admitted"), ("d", "admitted"), ("c", "admitted")]
    assert list(gate.waiting) == [w["b"]]  # the oldest waits for its deadline


def test_a_burst_queue_is_served_in_order() -> None:
    clock, timers, log = FakeClock(), Timers(), []
    gate, w = _gate(clock, timers), _waiters(log)
    gate.enter(w["a"], "v", False)
    gate.enter(w["b"], "v", False)
    gate.enter(w["c"], "v", False)
    clock.advance(0.05)  # queued for less than standing_after
    _release(gate, clock)
    assert log == [("a", "admitted"), ("b", "admitted")]


def test_first_in_first_out_when_asked() -> None:
    clock, timers, log = FakeClock(), Timers(), []
    gate, w = _gate(clock, timers, lifo=False), _waiters(log)
    _standing(gate, clock, w)
    gate.enter(w["c"], "v", False)
    _release(gate, clock)
    assert log == [("a", "admitted"), ("b", "admitted")]


def test_a_full_standing_queue_sheds_its_oldest_for_the_newest() -> None:
    clock, timers, log = FakeClock(), Timers(), []
    gate, w = _gate(clock, timers, size=2), _waiters(log)
    _standing(gate, clock, w)
    gate.enter(w["c"], "v", False)  # the queue is full: b, c
    gate.enter(w["d"], "v", False)  # b is shed in its place
    assert log == [("a", "admitted"), ("b", "queue_full")]
    assert list(gate.waiting) == [w["c"], w["d"]]
    assert gate.shed_counts.counts == {("v", "queue_full", "normal"): 1}
    _release(gate, clock)
    assert log[-1] == ("d", "admitted")


def test_a_full_burst_queue_sheds_the_newcomer() -> None:
    clock, timers, log = FakeClock(), Timers(), []
    gate, w = _gate(clock, timers, size=2), _waiters(log)
    gate.enter(w["a"], "v", False)
    gate.enter(w["b"], "v", False)
    gate.enter(w["c"], "v", False)
    gate.enter(w["d"], "v", False)  # not standing yet: d is refused, b and c keep their turn
    assert log == [("a", "admitted"), ("d", "queue_full")]
    assert list(gate.waiting) == [w["b"], w["c"]]


def test_an_instant_of_empty_queue_does_not_end_a_standing_one() -> None:
    clock, timers, log = FakeClock(), Timers(), []
    gate, w = _gate(clock, timers), _waiters(log)
    _standing(gate, clock, w)
    _release(gate, clock)  # b goes on: the queue is empty
    clock.advance(0.004)  # less than the standing timeout later, c arrives
    gate.enter(w["c"], "v", False)
    assert gate.waiting[w["c"]][0] == clock.monotonic() + 0.005  # still standing
    _release(gate, clock)
    clock.advance(0.005)  # empty for the standing timeout: the overload has ended
    gate.enter(w["d"], "v", False)
    assert gate.waiting[w["d"]][0] == clock.monotonic() + 1.0


def test_shedding_with_an_empty_standing_queue_sheds_the_newcomer() -> None:
    # the queue stood and emptied an instant ago (still standing), and the level is
    # severe from pressure alone: 2 in flight on a limit of 1 after the limit fell
    clock, timers, log = FakeClock(), Timers(), []
    gate, w = _gate(clock, timers), _waiters(log)
    policy = QueuePolicy(
        size=10, timeout=1.0, standing_after=0.1, standing_timeout=0.005,
        thresholds=Thresholds(1.0, 1.5, 2.0),
    )  # fmt: skip
    gate.reconfigure(policy, None)
    _standing(gate, clock, w)
    _release(gate, clock)  # b goes on, the queue is empty
    gate.in_flight = 2  # as if the limit had fallen under what was admitted
    gate.enter(w["c"], "v", False)
    assert log[-1] == ("c", "over_limit") and not gate.waiting


def test_a_low_priority_newcomer_does_not_displace_a_normal_waiter() -> None:
    clock, timers, log = FakeClock(), Timers(), []
    gate = _gate(clock, timers, size=2)  # levels stay normal (thresholds 10)
    w = {n: Waiter(n, log) for n in "abcd"}
    gate.enter(w["a"], "v", False)      # holds the one place
    gate.enter(w["b"], "v", False)      # normal priority, queued
    gate.enter(w["c"], "v", False)      # normal priority, queued: the queue is full
    clock.advance(0.1)                  # it stands
    gate.enter(w["d"], "v", True)       # LOW priority arrives at a full standing queue
    # a low-priority request should never cost a normal one its place
    assert ("b", "queue_full") not in log


@dataclass(eq=False)
class Pipelined(Waiter):
    """Shedding it answers its request, and its connection starts the next one at once
    (client.exchange_finished -> following.start() -> guard.enter), re-entering the gate."""
    gate: UpstreamGate | None = None
    follower: Waiter | None = None

    def shed(self, gate: UpstreamGate, reason: str) -> None:
        super().shed(gate, reason)
        if self.follower is not None:
            f, self.follower = self.follower, None
            gate.enter(f, "v", False)


def test_the_queue_never_exceeds_its_size_when_a_shed_re_enters() -> None:
    clock, timers, log = FakeClock(), Timers(), []
    gate = _gate(clock, timers, size=2)
    a, c, d, e = (Waiter(n, log) for n in "acde")
    b = Pipelined("b", log, follower=e)
    gate.enter(a, "v", False)
    gate.enter(b, "v", False)
    gate.enter(c, "v", False)  # full
    clock.advance(0.1)         # standing
    gate.enter(d, "v", False)  # displaces b, whose connection's next request e enters
    assert len(gate.waiting) <= gate.policy.size
    assert [w.name for w in gate.waiting] == ["d", "e"], "e displaced c; b was shed"


def test_a_low_priority_waiter_is_displaced_before_a_normal_one() -> None:
    clock, timers, log = FakeClock(), Timers(), []
    gate = _gate(clock, timers, size=2)
    a, b, c, d = (Waiter(n, log) for n in "abcd")
    gate.enter(a, "v", False)
    gate.enter(b, "v", False)  # normal, the oldest waiter
    gate.enter(c, "v", True)  # low priority
    clock.advance(0.1)
    gate.enter(d, "v", False)
    assert [w.name for w in gate.waiting] == ["b", "d"]
    assert ("c", "queue_full") in log
    assert gate.shed_counts.counts == {("v", "queue_full", "low"): 1}, "c's priority"
