"""Graded overload levels and what each does to a request (pure)."""

from __future__ import annotations

import pytest

from sidecar.overload.levels import (
    LOW_PRIORITY,
    OVER_LIMIT,
    QUEUE_FULL,
    Level,
    ShareDraw,
    Thresholds,
    Verdict,
    pressure_of,
    verdict_for,
)
from sidecar.overload.signals import Grades, graded

T = Thresholds(light_at=1.0, heavy_at=1.5, severe_at=2.0)


@pytest.mark.parametrize(
    ("in_flight", "queued", "limit", "level"),
    [
        (0, 0, 10, Level.NORMAL),
        (9, 0, 10, Level.NORMAL),
        (10, 0, 10, Level.LIGHT),
        (10, 4, 10, Level.LIGHT),
        (10, 5, 10, Level.HEAVY),
        (10, 9, 10, Level.HEAVY),
        (10, 10, 10, Level.SEVERE),
        (3, 0, 0, Level.SEVERE),  # no limit at all
    ],
)
def test_level_follows_pressure(in_flight: int, queued: int, limit: int, level: Level) -> None:
    grades = Grades(T.light_at, T.heavy_at, T.severe_at)
    assert graded(pressure_of(in_flight, queued, limit), grades, Level.NORMAL, 0.0) is level


@pytest.mark.parametrize(
    ("level", "low", "has_slot", "queue_room", "draw", "verdict", "reason"),
    [
        (Level.NORMAL, True, True, True, False, Verdict.ADMIT, ""),
        (Level.NORMAL, False, False, True, False, Verdict.QUEUE, ""),
        (Level.NORMAL, False, False, False, False, Verdict.SHED, QUEUE_FULL),
        (Level.LIGHT, True, False, True, True, Verdict.SHED, LOW_PRIORITY),
        (Level.LIGHT, True, False, True, False, Verdict.QUEUE, ""),
        (Level.LIGHT, False, False, True, True, Verdict.QUEUE, ""),
        (Level.HEAVY, True, True, True, False, Verdict.SHED, LOW_PRIORITY),
        (Level.HEAVY, False, False, True, False, Verdict.QUEUE, ""),
        (Level.HEAVY, False, True, True, False, Verdict.ADMIT, ""),
        (Level.SEVERE, False, False, True, False, Verdict.SHED, OVER_LIMIT),
        (Level.SEVERE, False, True, True, False, Verdict.ADMIT, ""),
        (Level.SEVERE, True, True, True, False, Verdict.SHED, LOW_PRIORITY),
    ],
)
def test_verdict_by_level_and_priority(
    level: Level,
    low: bool,
    has_slot: bool,
    queue_room: bool,
    draw: bool,
    verdict: Verdict,
    reason: str,
) -> None:
    assert verdict_for(
        level, low=low, has_slot=has_slot, queue_room=queue_room, light_draw=draw
    ) == (verdict, reason)


@pytest.mark.parametrize(
    ("share", "calls", "hits"), [(0.0, 100, 0), (0.25, 100, 25), (1.0, 7, 7), (1 / 3, 99, 33)]
)
def test_share_draw_falls_on_exactly_the_share(share: float, calls: int, hits: int) -> None:
    draw = ShareDraw(share)
    assert sum(draw() for _ in range(calls)) == hits
