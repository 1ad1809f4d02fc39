"""Injected time: nothing in a decision path reads the system clock or sleeps."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch, for timestamps."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes back, for durations."""
        ...


class SystemClock:
    # the functions themselves rather than methods that call them: the proxy reads
    # the clock a few times per request, and a Python frame each time shows
    now = staticmethod(time.time)
    monotonic = staticmethod(time.monotonic)


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 0.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._now += seconds
        self._mono += seconds


def utc_now(clock: Clock) -> datetime:
    """The clock's time as an aware UTC datetime, for stored timestamps."""
    return datetime.fromtimestamp(clock.now(), UTC)
