"""The signals graded overload reads beside in-flight pressure, as pure state fed with
times (`now`, monotonic seconds) and values; nothing here reads a clock or does I/O.

- `graded`: a value against three thresholds, with hysteresis: a level is entered at
  its threshold and left only below `threshold * (1 - hysteresis)`, so a signal that
  hovers at a threshold does not flap the level with every request.
- `RateMeter`: requests per second arriving for one upstream, from two fixed windows
  (the previous one weighed by how much of it the sliding window still covers).
- `ExternalReading`: the last value a probe (`probe.py`) read of the service's own
  signal, its level, and the probe's failures. A failing probe or a reading older than
  `stale_after` gives the configured failure level — none by default: a broken probe
  never sheds unless the operator asked for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal, get_args

from sidecar.overload.levels import Level

RATE_WINDOW = 1.0  # seconds
MAX_ERROR_CHARS = 300  # of the last failure's description, as shown on /overload

# why an external reading failed (`failures` keys; metrics label `reason`)
FailureReason = Literal[
    "timeout", "unreachable", "bad_status", "too_large", "not_a_number", "unavailable"
]
TIMEOUT: Final[FailureReason] = "timeout"
UNREACHABLE: Final[FailureReason] = "unreachable"
BAD_STATUS: Final[FailureReason] = "bad_status"
TOO_LARGE: Final[FailureReason] = "too_large"
NOT_A_NUMBER: Final[FailureReason] = "not_a_number"
UNAVAILABLE: Final[FailureReason] = "unavailable"  # NVML or its GPU absent
FAILURES: tuple[FailureReason, ...] = get_args(FailureReason)


@dataclass(frozen=True, slots=True)
class Grades:
    """Thresholds of one signal, ordered: light <= heavy <= severe."""

    light: float
    heavy: float
    severe: float

    def at(self, level: Level) -> float:
        return (math.inf, self.light, self.heavy, self.severe)[level]


def graded(value: float, grades: Grades, current: Level, hysteresis: float) -> Level:
    """The level of `value`, given the level it is at (`current`)."""
    if value >= grades.severe:
        raw = Level.SEVERE
    elif value >= grades.heavy:
        raw = Level.HEAVY
    elif value >= grades.light:
        raw = Level.LIGHT
    else:
        raw = Level.NORMAL
    level = current
    while level > raw and value < grades.at(level) * (1.0 - hysteresis):
        level = Level(level - 1)
    return max(level, raw)


class RateMeter:
    """Arrivals per second over the last `RATE_WINDOW` (approximately: the previous
    window's count weighs what share of it the last second still covers)."""

    __slots__ = ("_count", "_previous", "_start")

    def __init__(self, now: float) -> None:
        self._start = now
        self._count = 0
        self._previous = 0

    def _roll(self, now: float) -> float:
        elapsed = now - self._start
        if elapsed >= RATE_WINDOW:
            windows = math.floor(elapsed / RATE_WINDOW)
            self._previous = self._count if windows == 1 else 0
            self._count = 0
            self._start += windows * RATE_WINDOW
            elapsed -= windows * RATE_WINDOW
        return elapsed

    def add(self, now: float) -> float:
        """One arrival at `now`; the rate including it."""
        self._roll(now)
        self._count += 1
        return self.rate(now)

    def rate(self, now: float) -> float:
        elapsed = self._roll(now)
        weight = max(0.0, 1.0 - elapsed / RATE_WINDOW)
        return (self._previous * weight + self._count) / RATE_WINDOW


class ExternalReading:
    """The service's own signal, as its probe last read it."""

    __slots__ = (
        "failing",
        "failure_level",
        "failures",
        "grades",
        "hysteresis",
        "last_error",
        "level",
        "read_at",
        "reads",
        "stale_after",
        "value",
    )

    def __init__(
        self, grades: Grades, *, hysteresis: float, stale_after: float, failure_level: Level
    ) -> None:
        self.grades = grades
        self.hysteresis = hysteresis
        self.stale_after = stale_after
        self.failure_level = failure_level
        self.value: float | None = None
        self.read_at: float | None = None
        self.level = Level.NORMAL  # of the last good reading
        self.reads = 0
        self.failures: dict[FailureReason, int] = {}
        self.failing = False  # the last attempt failed
        self.last_error: str | None = None

    def record(self, now: float, value: float) -> None:
        self.value = value
        self.read_at = now
        self.reads += 1
        self.failing = False
        self.level = graded(value, self.grades, self.level, self.hysteresis)

    def fail(self, reason: FailureReason, detail: str) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.failing = True
        self.last_error = f"{reason}: {detail}"[:MAX_ERROR_CHARS]

    def fresh(self, now: float) -> bool:
        return self.read_at is not None and now - self.read_at <= self.stale_after

    def level_at(self, now: float) -> Level:
        """The level the signal gives at `now`: its last good reading's while that is
        fresh, else the failure level (a stale value says nothing of the service now)."""
        if self.fresh(now):
            return self.level
        return self.failure_level
