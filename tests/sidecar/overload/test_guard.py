"""The guard's shed answers: made once, made again when the config changes them. The
guard times its event loop for the limits while it has gates."""

from __future__ import annotations

import pytest

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.overload import OverloadConfig
from sidecar.choice import Upstream
from sidecar.overload.guard import LAG_PERIOD, LAG_RESOLUTION, OverloadGuard
from tests.sidecar.overload.test_standing_queue import Timers


def test_shed_answers_are_reused_until_the_config_changes_them() -> None:
    clock = FakeClock()
    guard = OverloadGuard(
        OverloadConfig(),
        monotonic=clock.monotonic,
        call_later=lambda d, c: None,  # type: ignore[arg-type, return-value]
    )
    first, status = guard.shed_response("over_limit", "canary", "exp-1", close=False)
    again, _ = guard.shed_response("over_limit", "canary", "exp-1", close=False)
    assert status == 429 and again is first
    closing, _ = guard.shed_response("over_limit", "canary", "exp-1", close=True)
    assert closing.endswith(first[first.index(b"\r\n\r\n") :])
    assert b"Connection: close" in closing and b"Connection: close" not in first
    other, _ = guard.shed_response("queue_timeout", "canary", None, close=False)
    assert b"queue_timeout" in other and b"experiment" not in other

    guard.configure(OverloadConfig(shed_status=503, retry_after_s=9))
    changed, status = guard.shed_response("over_limit", "canary", "exp-1", close=False)
    assert status == 503
    assert changed.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"Retry-After: 9\r\n" in changed


def test_the_loop_is_timed_while_there_are_gates_and_its_lateness_reaches_the_limits() -> None:
    clock, timers = FakeClock(), Timers()
    guard = OverloadGuard(
        OverloadConfig(min_rtt_samples=2),
        monotonic=clock.monotonic,
        call_later=timers.call_later,  # type: ignore[arg-type]
    )
    assert timers.due() == []  # no gate, no timer
    gate = guard.gate_for(Upstream.parse("http://u:1"))
    assert timers.due() == [LAG_PERIOD]
    guard.gate_for(Upstream.parse("http://v:1"))  # one timer for every gate
    assert timers.due() == [LAG_PERIOD]
    now = clock.monotonic()
    for _ in range(2):  # the no-load measurement: 12 ms (the clock is the timer's)
        gate.limiter.on_sample(now, 0.012, 1, admitted_at=now)
    assert gate.limiter.state().min_rtt == pytest.approx(0.012)
    clock.advance(LAG_PERIOD + 0.004)  # the loop got to it 4 ms late
    timers.fire_next()
    assert guard.state()["loop_lag_ms"] == pytest.approx(4.0)
    assert timers.due() == [LAG_PERIOD]  # timed again, from now
    clock.advance(LAG_PERIOD + LAG_RESOLUTION)  # within the timer's rounding: not counted
    timers.fire_next()
    clock.advance(0.1)  # an interval's latency of 12 ms, 1.5 of them the loop's
    gate.limiter.on_sample(clock.monotonic(), 0.012, 1, admitted_at=now)
    # the readings after rounding: 3 ms and 0, a mean of 1.5
    assert gate.limiter.state().sample_rtt == pytest.approx(0.0105)
    guard.release_all()  # protection off: no more timing
    assert timers.due() == []
