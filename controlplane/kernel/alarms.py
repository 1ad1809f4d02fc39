"""A collector's word that an experiment's canary just turned worse (decision 0070).

At N = 1,000 experiments a controller's round takes seconds, and a canary that turns
bad waited for the round to reach it. A collector sees every batch as it arrives:
when an experiment's canary looks worse in its last seconds than both the baseline
in the same seconds and its own earlier window (`collector/alarm_screen.py`), the
collector raises an *alarm*, and the controller judges that experiment at its next
tick, between the experiments of its round, as it judges the suspects of decision
0069.

An alarm is a hint for the controller's schedule, never evidence: the judge decides
on the windows as always, so an alarm can make a look come sooner, never a decision
differ. Anyone who can write Redis can forge one, so it is parsed strictly, a reader
reads a bounded number, and the controller's looks on alarms are bounded per tick.

Wire form: one sorted set per namespace, member the experiment id, score the
collector's wall-clock time of its latest alarm for it (ZADD GT: a later alarm moves
the score forward, an earlier one never back). Each writer trims what is older than
KEEP_SEC or dated further ahead than CLOCK_SKEW_SEC.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

KEEP_SEC = 30.0  # alarms older than this are removed by the next writer
CLOCK_SKEW_SEC = 10.0  # an alarm dated further ahead is a clock far off (or a forgery)
MAX_READ = 1024  # a reader takes at most this many of the newest alarms
MAX_ID_DIGITS = 18  # an experiment id within a signed 64-bit row id


def parse_alarm(member: str, score: float) -> tuple[int, float] | None:
    """(experiment id, time) from the wire form; None (dropped) when it is not one a
    collector wrote."""
    # experiments are numbered rows: any other id a stats key allows ("abc") is not
    # one, and must not reach int()
    if not (member.isascii() and member.isdigit()) or len(member) > MAX_ID_DIGITS:
        return None
    if not math.isfinite(score) or score <= 0:
        return None
    return int(member), score


def parsed_alarms(members: Iterable[tuple[str, float]]) -> tuple[dict[int, float], int]:
    """The well-formed alarms of `members` (experiment id -> time), and how many were
    dropped."""
    found: dict[int, float] = {}
    dropped = 0
    for member, score in members:
        alarm = parse_alarm(member, score)
        if alarm is None:
            dropped += 1
        else:
            found[alarm[0]] = max(alarm[1], found.get(alarm[0], 0.0))
    return found, dropped


@runtime_checkable
class Alarms(Protocol):
    """Implemented by the sample-stream backends (Redis, in-process)."""

    async def raise_alarms(self, experiments: Mapping[str, float], now: float) -> None:
        """Record an alarm for each experiment id at its time; forget alarms older
        than KEEP_SEC or dated more than CLOCK_SKEW_SEC after `now`."""
        ...

    async def alarms_since(self, since: float) -> tuple[dict[int, float], int]:
        """The newest MAX_READ alarms dated after `since` (experiment id -> time), and
        how many members were dropped as malformed."""
        ...
