"""The signals beside in-flight pressure (pure, on an injected clock): hysteresis, the
request rate, the service's own signal going stale or failing, and a gate's level as
the highest of them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from controlplane.kernel.clock import FakeClock
from sidecar.overload.gate import QueuePolicy, ShedCounts, UpstreamGate
from sidecar.overload.levels import Level, Thresholds
from sidecar.overload.limit import GradientLimit, LimitSettings
from sidecar.overload.signals import (
    TIMEOUT,
    ExternalReading,
    Grades,
    RateMeter,
    graded,
)

G = Grades(light=10.0, heavy=20.0, severe=40.0)
N, L, H, S = Level.NORMAL, Level.LIGHT, Level.HEAVY, Level.SEVERE


@pytest.mark.parametrize(
    ("value", "current", "hysteresis", "level"),
    [
        (5.0, N, 0.1, N),
        (10.0, N, 0.1, L),  # entered at its threshold
        (39.9, L, 0.1, H),
        (40.0, N, 0.1, S),  # several levels at once, upwards
        (9.5, L, 0.1, L),  # under the threshold, not under it by 10%: kept
        (9.0, L, 0.1, L),  # 10 * 0.9 = 9: not below
        (8.9, L, 0.1, N),
        (9.5, L, 0.0, N),  # no hysteresis: left at once
        (37.0, S, 0.1, S),
        (35.0, S, 0.1, H),
        (19.0, S, 0.1, H),  # below severe's band, within heavy's: heavy
        (17.0, S, 0.1, L),
        (1.0, S, 0.1, N),  # several levels at once, downwards
    ],
)
def test_graded_enters_at_a_threshold_and_leaves_below_its_band(
    value: float, current: Level, hysteresis: float, level: Level
) -> None:
    assert graded(value, G, current, hysteresis) is level


def test_a_value_hovering_at_a_threshold_does_not_flap() -> None:
    level, changes = N, 0
    for value in [10.0, 9.8, 10.1, 9.7, 10.0, 9.6] * 10:
        new = graded(value, G, level, 0.1)
        changes += new is not level
        level = new
    assert (level, changes) == (L, 1)
    assert [graded(v, G, N, 0.0) for v in (10.0, 9.8)] == [L, N]  # without it, it would


@pytest.mark.parametrize(
    ("arrivals", "at", "rate"),
    [
        ([], 0.5, 0.0),
        ([0.1 * i for i in range(10)], 0.95, 10.0),  # 10 in the first window
        ([0.01 * i for i in range(100)], 1.0, 100.0),  # a window just closed: all of it
        ([0.01 * i for i in range(100)], 1.5, 50.0),  # half of the previous window
        ([0.01 * i for i in range(100)], 2.0, 0.0),  # a second later: none left
        ([0.01 * i for i in range(100)], 7.3, 0.0),  # idle for long
        ([0.01 * i for i in range(200)], 2.25, 75.0),  # 100 in [1, 2), weighed 0.75
    ],
)
def test_rate_meter_counts_the_last_second(arrivals: list[float], at: float, rate: float) -> None:
    meter = RateMeter(0.0)
    for t in arrivals:
        meter.add(t)
    assert meter.rate(at) == pytest.approx(rate)


def reading(on_failure: Level = N) -> ExternalReading:
    return ExternalReading(G, hysteresis=0.1, stale_after=5.0, failure_level=on_failure)


@pytest.mark.parametrize(
    ("steps", "at", "on_failure", "level"),
    [
        ([], 0.0, N, N),  # never read: nothing to go by
        ([], 0.0, H, H),  # unless the operator said a silent probe means heavy
        ([(0.0, 25.0)], 1.0, N, H),
        ([(0.0, 25.0)], 5.0, N, H),  # 5 s old: still fresh
        ([(0.0, 25.0)], 5.1, N, N),  # stale: ignored
        ([(0.0, 25.0)], 5.1, L, L),  # stale: the failure level
        ([(0.0, 25.0), (1.0, TIMEOUT)], 2.0, S, H),  # a failed read: the last one holds
        ([(0.0, 25.0), (1.0, 19.0)], 2.0, N, H),  # hysteresis: 19 >= 20 * 0.9 is heavy still
        ([(0.0, 25.0), (1.0, 17.0)], 2.0, N, L),
        ([(0.0, 45.0), (1.0, TIMEOUT), (6.0, TIMEOUT)], 6.0, N, N),  # failing, stale
    ],
)
def test_external_reading_gives_its_level_while_fresh(
    steps: list[tuple[float, float | str]], at: float, on_failure: Level, level: Level
) -> None:
    r = reading(on_failure)
    for t, step in steps:
        if isinstance(step, str):
            r.fail(TIMEOUT, "no answer")
        else:
            r.record(t, step)
    assert r.level_at(at) is level


def test_failures_are_counted_by_reason() -> None:
    r = reading()
    r.record(0.0, 1.0)
    r.fail(TIMEOUT, "no answer within 0.2 s")
    r.fail(TIMEOUT, "no answer within 0.2 s")
    assert (r.failures, r.failing, r.last_error) == (
        {"timeout": 2},
        True,
        "timeout: no answer within 0.2 s",
    )
    r.record(1.0, 2.0)
    assert (r.failing, r.reads, r.value) == (False, 2, 2.0)


# --- a gate's level: the highest of the signals --------------------------------


@dataclass
class Waiter:
    admitted: list[bool] = field(default_factory=list)
    shed_for: list[str] = field(default_factory=list)

    def admit(self, gate: UpstreamGate, degrade: bool) -> None:
        self.admitted.append(degrade)

    def shed(self, gate: UpstreamGate, reason: str) -> None:
        self.shed_for.append(reason)


def gate(
    clock: FakeClock, *, rate: Grades | None = None, external: ExternalReading | None = None
) -> UpstreamGate:
    loop = asyncio.new_event_loop()
    settings = LimitSettings(min_limit=100, max_limit=100, initial_limit=100)
    g = UpstreamGate(
        "http://u:1",
        GradientLimit(settings, clock.monotonic()),
        QueuePolicy(size=10, timeout=30.0, hysteresis=0.1, rate=rate, thresholds=Thresholds()),
        monotonic=clock.monotonic,
        call_later=lambda delay, callback: loop.call_later(3600, callback),
        shed_counts=ShedCounts(),
        external=external,
    )
    loop.close()
    return g


def test_the_request_rate_raises_the_level_with_few_in_flight() -> None:
    clock = FakeClock()
    g = gate(clock, rate=Grades(light=50.0, heavy=100.0, severe=1000.0))
    w = Waiter()
    levels = []
    for _ in range(150):  # 150 arrivals over 1 s, each released at once
        clock.advance(1 / 150)
        g.enter(w, "baseline", False)
        g.release(clock.monotonic() - 0.001)
        levels.append(g.level)
    assert g.in_flight == 0 and g.pressure_level is N
    assert (levels[48], levels[50], levels[99], levels[-1]) == (N, L, H, H)
    assert w.admitted[-1] is True  # heavy: the upstream is asked to degrade
    low = Waiter()
    g.enter(low, "baseline", True)  # heavy: a low-priority request is shed
    assert low.shed_for == ["low_priority"]
    # the rate falls: heavy until below 100 * 0.9 = 90 per second, then light
    clock.advance(0.45)  # 150 * 0.55 = 82.5 per second
    g.enter(w, "baseline", False)
    assert g.rate_level is L
    clock.advance(2.0)
    g.enter(w, "baseline", False)
    assert (g.rate_level, g.level) == (N, N)


def test_the_service_signal_raises_the_level_until_it_is_stale() -> None:
    clock = FakeClock()
    ext = reading()
    g = gate(clock, external=ext)
    w = Waiter()
    ext.record(clock.monotonic(), 41.0)
    g.enter(w, "baseline", False)
    assert (g.level, g.pressure_level) == (S, N)
    g.enter(Waiter(), "baseline", True)  # severe: low priority is shed even with room
    ext.record(clock.monotonic(), 15.0)
    g.enter(w, "baseline", False)
    assert g.level is L
    clock.advance(5.5)  # no reading since: stale, ignored
    g.enter(w, "baseline", False)
    assert g.level is N
    assert w.admitted == [True, False, False]  # degrade asked while severe only
