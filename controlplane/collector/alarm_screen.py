"""Has an experiment's canary just turned worse? A collector's screen (decision 0070).

A screen, not a judge: it decides only whether the controller should look at the
experiment at its next tick rather than when its round reaches it
(`kernel/alarms.py`). What it misses, the round still judges; what it raises in vain
costs a look, and the controller bounds those looks per tick. It must cost a
collector microseconds per publish, so it reads scalars the rings keep already.

The canary's last RECENT_SEC seconds (the newest one the collector holds samples of
and the one before) against two references: the other variants in the same seconds,
and the canary's own past, its whole window as a screen PAST_SEC or more ago found it
(`PastWindows`). A reference counts once it holds MIN_REFERENCE samples; the
canary is worse when it is worse than every reference that counts, on one of:

- the share of failures, or the share above the rule's threshold (a rule with one):
  at least MIN_EVENTS of them, twice the reference's share or more, and the binomial
  tail of so many beyond chance (its Chernoff bound under 5e-3) against the
  reference's share, smoothed by one event either way;
- the share of slow samples, those above the baseline window's 90th percentile (its
  histogram, which the ring keeps summed): the same test. A share, not a mean, so
  that a heavy tail in the few samples of two seconds raises nothing.

Worse than both, not either: a canary worse than the baseline all along is the
round's to judge (raising it every tick would spend the controller's looks on it for
nothing new), and a canary that slowed with its baseline (a shared dependency) is not
what a canary's breaker is for. A canary bad from its first second has no earlier
window, so the baseline alone is its reference; so is a canary too thin to have
MIN_REFERENCE samples in its past (under ~4 a second).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from controlplane.collector.ring import VariantRing
from controlplane.collector.windows import ExperimentWindow
from controlplane.kernel.routes import CANARY

RECENT_SEC = 2
# the canary's past is its window as a screen this long ago found it: a change is
# raised from the first publish after it, however seldom the experiment is
# published (a collector behind its streams publishes one every few seconds), until
# the window of this long before is as bad
PAST_SEC = 5.0
MIN_RECENT = 5
MIN_REFERENCE = 20
MIN_EVENTS = 3
# -log of the tail bound a share must beat: exp(-5.3) = 5e-3 a screen, an upper
# bound; with the one-event smoothing the false alarms measured are far fewer
LOG_EVIDENCE = 5.3
# "slow": above this quantile of the baseline's window, so a reference's share of slow
# samples is about 1 - SLOW_QUANTILE whatever the shape of the latencies
SLOW_QUANTILE = 0.9

FAILURES = "failures"
ABOVE = "above_threshold"
LATENCY = "latency"


class Sums:
    """A variant's counts over some seconds: what the screen compares."""

    __slots__ = ("above", "above_count", "count", "failures", "slow")

    def __init__(self) -> None:
        self.count = 0
        self.failures = 0
        self.slow = 0  # samples above the baseline window's SLOW_QUANTILE
        self.above = 0
        self.above_count = 0  # samples of seconds whose `above` is for today's threshold


def _share_worse(events: int, count: int, ref_events: int, ref_count: int) -> bool:
    """Is `events` of `count` a larger share than the reference's, beyond chance? The
    Chernoff bound of the binomial tail, exp(-count * KL(share || p0)), below
    MAX_TAIL: a closed form, and conservative (the true tail is smaller still)."""
    if events < MIN_EVENTS or count <= 0 or ref_count < MIN_REFERENCE:
        return False
    p0 = (ref_events + 1) / (ref_count + 2)  # one event either way: never 0 or 1
    share = min(events / count, 1.0)
    if share < 2 * p0:
        return False
    divergence = share * math.log(share / p0)
    if share < 1.0:
        divergence += (1 - share) * math.log((1 - share) / (1 - p0))
    return count * divergence > LOG_EVIDENCE


def _worse_on(kind: str, recent: Sums, ref: Sums) -> bool:
    if kind == FAILURES:
        return _share_worse(recent.failures, recent.count, ref.failures, ref.count)
    if kind == ABOVE:
        return _share_worse(recent.above, recent.above_count, ref.above, ref.above_count)
    return _share_worse(recent.slow, recent.count, ref.slow, ref.count)


def slow_bin(window: ExperimentWindow) -> int | None:
    """The first histogram bin above the SLOW_QUANTILE of the other variants' window
    (the baseline's); None without one or without samples. It moves slowly: a caller
    may keep it for a second."""
    others = [window.ring(name).win_hist for name in window.variants if name != CANARY]
    if not others:
        return None
    cumulative = np.cumsum(others[0] if len(others) == 1 else np.sum(others, axis=0))
    total = int(cumulative[-1])
    if total <= 0:
        return None
    return int(np.searchsorted(cumulative, SLOW_QUANTILE * total, side="right")) + 1


def _add_seconds(into: Sums, ring: VariantRing, seconds: range, slow_from: int) -> None:
    for second in seconds:
        slot = second % ring.capacity
        if int(ring.second[slot]) != second:
            continue
        count = int(ring.count[slot])
        into.count += count
        into.failures += int(ring.failures[slot])
        into.slow += int(ring.hist[slot, slow_from:].sum())
        if not ring.stale[slot]:
            into.above += int(ring.above[slot])
            into.above_count += count


def canary_window(window: ExperimentWindow, slow_from: int | None) -> Sums | None:
    """The canary's whole window now: the past a later screen compares with."""
    if slow_from is None or CANARY not in window.variants:
        return None
    canary = window.ring(CANARY)
    sums = Sums()
    sums.count = canary.win_count
    sums.failures = canary.win_failures
    sums.slow = int(canary.win_hist[slow_from:].sum())
    sums.above = canary.win_above
    # counted as if no second were stale: an under-count of the past's share above
    # the threshold only makes the screen raise more, never miss
    sums.above_count = canary.win_count
    return sums


def turned_worse(
    window: ExperimentWindow, now: float, slow_from: int | None, past: Sums | None
) -> str | None:
    """What the canary's last seconds are worse on (FAILURES, ABOVE or LATENCY) than
    every reference that holds enough samples; None when nothing is, or when there is
    no canary, too few recent samples, or no reference. `slow_from`: `slow_bin`'s;
    `past`: `canary_window` as a screen PAST_SEC or more ago found it (None: none)."""
    if slow_from is None or CANARY not in window.variants:
        return None
    canary = window.ring(CANARY)
    newest = [r.newest_ts for r in map(window.ring, window.variants) if r.newest_ts is not None]
    if not newest:
        return None
    # the last seconds the collector holds samples of: a collector behind its streams
    # applies a batch seconds after it was sent, and judges it as of its own seconds
    current = min(math.floor(now), math.floor(max(newest)))
    seconds = range(max(window.window_start, current - RECENT_SEC + 1), current + 1)
    recent, baseline = Sums(), Sums()
    _add_seconds(recent, canary, seconds, slow_from)
    if recent.count < MIN_RECENT:
        return None
    for name in window.variants:
        if name != CANARY:
            _add_seconds(baseline, window.ring(name), seconds, slow_from)
    references = [ref for ref in (baseline, past) if ref is not None
                  and ref.count >= MIN_REFERENCE]  # fmt: skip
    if not references:
        return None
    kinds = (FAILURES, ABOVE, LATENCY) if window.config.threshold_ms else (FAILURES, LATENCY)
    for kind in kinds:
        if all(_worse_on(kind, recent, ref) for ref in references):
            return kind
    return None


@dataclass
class PastWindows:
    """Per experiment, the canary's window as screens found it, kept for PAST_SEC:
    the oldest one that old is the past the next screen compares with. At most one
    a second is kept, so an experiment holds a few."""

    kept: dict[str, deque[tuple[float, Sums]]] = field(default_factory=dict)

    def past(self, experiment: str, now: float) -> Sums | None:
        found = self.kept.get(experiment)
        if not found:
            return None
        while len(found) > 1 and now - found[1][0] >= PAST_SEC:
            found.popleft()  # a newer one is old enough
        at, sums = found[0]
        return sums if now - at >= PAST_SEC else None

    def keep(self, experiment: str, now: float, sums: Sums | None) -> None:
        if sums is None:
            return
        found = self.kept.setdefault(experiment, deque())
        if not found or now - found[-1][0] >= 1.0:
            found.append((now, sums))

    def forget(self, experiment: str) -> None:
        self.kept.pop(experiment, None)
