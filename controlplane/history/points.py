"""What one history point holds and how points merge into coarser ones. Pure.

A point is what the controller judged at one second: each variant's window (the
rule's window, so the plotted percentile is the one compared with the threshold),
the bounds in force and the canary weight. Merging points into a bucket keeps what a
plot drawn against a bound must not hide:

    latency percentiles, failure ratio   the peak (a breach seen stays visible)
    count, request rate, shed, shed rate the mean
    threshold, failure bound             the strictest (lowest)
    canary weight                        the lowest (a cut-back stays visible)
    window_sec                           the longest
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from controlplane.kernel.routes import BASELINE, CANARY
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot

VARIANTS = (BASELINE, CANARY)

# a plot needs no more points than a screen has columns
MAX_POINTS = 1000
# per-second points of a running experiment are kept this long, then merged by minute
RAW_RETENTION_SEC = 24 * 3600
RETAINED_BUCKET_SEC = 60
# an ended experiment keeps at most this many points
ENDED_POINTS = 1000


@dataclass(frozen=True)
class VariantPoint:
    """One variant's window at one point; percentiles are None on an empty window."""

    count: int
    rps: float
    failure_ratio: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    # requests the sidecars' overload protection answered themselves: never in `count`
    shed: int = 0
    shed_rps: float = 0.0


EMPTY = VariantPoint(count=0, rps=0.0, failure_ratio=0.0, p50_ms=None, p95_ms=None, p99_ms=None)


@dataclass(frozen=True)
class HistoryPoint:
    """Both variants of one experiment from second `at` for `span_sec` seconds."""

    experiment_id: int
    at: int
    span_sec: int
    window_sec: int
    canary_weight_bp: int
    threshold_ms: float | None
    failure_bound: float | None
    baseline: VariantPoint
    canary: VariantPoint

    def variant(self, name: str) -> VariantPoint:
        return self.baseline if name == BASELINE else self.canary


def variant_point(snapshot: WindowSnapshot | None) -> VariantPoint:
    """A snapshot's plotted numbers; the rate over the span the window actually held."""
    if snapshot is None:
        return EMPTY
    held = snapshot.window_end - snapshot.window_start
    span = held if held > 0 else float(snapshot.window_sec)
    return VariantPoint(
        count=snapshot.count,
        rps=snapshot.count / span if span > 0 else 0.0,
        failure_ratio=snapshot.failure_ratio,
        p50_ms=snapshot.p50_ms,
        p95_ms=snapshot.p95_ms,
        p99_ms=snapshot.p99_ms,
        shed=snapshot.shed,
        shed_rps=snapshot.shed / span if span > 0 else 0.0,
    )


def point_of(
    experiment_id: int,
    snapshots: Mapping[str, WindowSnapshot],
    rule: BreakerRule,
    canary_bp: int,
    now: float,
) -> HistoryPoint:
    """The point for second `now` from the windows the controller judged."""
    return HistoryPoint(
        experiment_id=experiment_id,
        at=int(now),
        span_sec=1,
        window_sec=rule.window_sec,
        canary_weight_bp=canary_bp,
        threshold_ms=rule.threshold_ms,
        failure_bound=rule.failure_ratio,
        baseline=variant_point(snapshots.get(BASELINE)),
        canary=variant_point(snapshots.get(CANARY)),
    )


def point_due(last_at: int | None, now: float) -> bool:
    """One point per experiment and second: due once the clock enters a new second."""
    return last_at is None or int(now) > last_at


def bucket_width(start: int, end: int, points: int) -> int:
    """The smallest whole number of seconds that covers [start, end] in `points` buckets."""
    if points < 1:
        raise ValueError("points must be at least 1")
    span = max(end - start + 1, 1)
    return max(1, math.ceil(span / points))


def _peak(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _lowest(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def merge_variant(points: Sequence[VariantPoint]) -> VariantPoint:
    n = len(points)
    return VariantPoint(
        count=round(sum(p.count for p in points) / n),
        rps=sum(p.rps for p in points) / n,
        failure_ratio=max(p.failure_ratio for p in points),
        p50_ms=_peak([p.p50_ms for p in points]),
        p95_ms=_peak([p.p95_ms for p in points]),
        p99_ms=_peak([p.p99_ms for p in points]),
        shed=round(sum(p.shed for p in points) / n),
        shed_rps=sum(p.shed_rps for p in points) / n,
    )


def merge(points: Sequence[HistoryPoint], at: int, span_sec: int) -> HistoryPoint:
    """The points of one bucket as one point starting at `at` (see the module's table)."""
    if not points:
        raise ValueError("nothing to merge")
    return HistoryPoint(
        experiment_id=points[0].experiment_id,
        at=at,
        span_sec=span_sec,
        window_sec=max(p.window_sec for p in points),
        canary_weight_bp=min(p.canary_weight_bp for p in points),
        threshold_ms=_lowest([p.threshold_ms for p in points]),
        failure_bound=_lowest([p.failure_bound for p in points]),
        baseline=merge_variant([p.baseline for p in points]),
        canary=merge_variant([p.canary for p in points]),
    )


class _Timed(Protocol):
    @property
    def at(self) -> int: ...


_P = TypeVar("_P", bound=_Timed)


def bucketed(points: Sequence[_P], origin: int, width: int) -> list[list[_P]]:
    """Points (sorted by `at`) grouped into buckets of `width` seconds counted from
    `origin`, in order; empty buckets are left out."""
    if width < 1:
        raise ValueError("a bucket is at least one second wide")
    buckets: list[list[_P]] = []
    index: int | None = None
    for point in points:
        i = (point.at - origin) // width
        if not buckets or i != index:
            buckets.append([])
        buckets[-1].append(point)
        index = i
    return buckets


def downsample(points: Sequence[HistoryPoint], origin: int, width: int) -> list[HistoryPoint]:
    """Points (sorted by `at`) merged into buckets of `width` seconds counted from
    `origin`; each bucket starts at its first point. A bucket of one point is that
    point unchanged."""
    return [_close(bucket, width) for bucket in bucketed(points, origin, width)]


def _close(bucket: list[HistoryPoint], width: int) -> HistoryPoint:
    if len(bucket) == 1:
        return bucket[0]
    return merge(bucket, bucket[0].at, max(width, max(p.span_sec for p in bucket)))
