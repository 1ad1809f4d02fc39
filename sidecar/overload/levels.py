"""Graded overload: how hard a gate is pressed, and what that means for one request.

Pure functions of what the gate measures (in flight, queued, the limit) and the
service's thresholds; the gate applies the verdicts. The other signals (request rate,
the service's own) and hysteresis are in `signals.py`; the gate's level is the highest
any signal gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum


class Level(IntEnum):
    NORMAL = 0
    LIGHT = 1  # shed a share of low-priority requests
    HEAVY = 2  # shed every low-priority request; ask the upstream to degrade
    SEVERE = 3  # shed everything beyond the limit: nothing more is queued


class Verdict(Enum):
    ADMIT = "admit"
    QUEUE = "queue"
    SHED = "shed"


# why a request was shed (metrics label `reason`)
LOW_PRIORITY = "low_priority"
OVER_LIMIT = "over_limit"  # severe: beyond the limit, not queued
QUEUE_FULL = "queue_full"
QUEUE_TIMEOUT = "queue_timeout"
ABANDONED = "abandoned"  # the client left while its request waited
REASONS = (LOW_PRIORITY, OVER_LIMIT, QUEUE_FULL, QUEUE_TIMEOUT, ABANDONED)


@dataclass(frozen=True, slots=True)
class Thresholds:
    light_at: float = 1.0
    heavy_at: float = 1.5
    severe_at: float = 2.0


def pressure_of(in_flight: int, queued: int, limit: int) -> float:
    return (in_flight + queued) / limit if limit > 0 else float("inf")


def verdict_for(
    level: Level, *, low: bool, has_slot: bool, queue_room: bool, light_draw: bool
) -> tuple[Verdict, str]:
    """What happens to an arriving request (`light_draw`: a light level's share falls
    on this one). Returns the verdict and, when shed, why."""
    if low and (level >= Level.HEAVY or (level is Level.LIGHT and light_draw)):
        return Verdict.SHED, LOW_PRIORITY
    if has_slot:
        return Verdict.ADMIT, ""
    if level is Level.SEVERE:
        return Verdict.SHED, OVER_LIMIT
    if queue_room:
        return Verdict.QUEUE, ""
    return Verdict.SHED, QUEUE_FULL


class ShareDraw:
    """Falls on exactly `share` of the calls, spread evenly (deterministic: an error
    accumulator, not a random draw, so tests and small counts see the exact share)."""

    __slots__ = ("_credit", "share")

    def __init__(self, share: float) -> None:
        self.share = share
        self._credit = 0.0

    def __call__(self) -> bool:
        self._credit += self.share
        if self._credit >= 1.0 - 1e-9:
            self._credit -= 1.0
            return True
        return False
