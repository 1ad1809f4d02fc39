"""Provider metrics in the history: one point per metric per reading. Pure.

The metric board reads a provider every `interval_sec` (15 s by default), not every
second, so a metric's points are its readings, stamped with the second they were
read (`MetricEvidence.read_at`), apart from the windows' per-second points. Each
point holds both variants' values and the bound the canary was held to: the rule's
absolute bound, or the baseline's value with the margin applied. A variant without
data is None (a gap in the plot), as is a baseline-relative bound without a
baseline value.

Merging keeps, as for the windows (points.py), what a plot against a bound must not
hide: where a rise is bad (or either change), each value's peak and the strictest
(lowest) bound; where a fall is bad, each value's trough and the highest bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controlplane.history.points import bucketed
from controlplane.kernel.judgment import Direction
from controlplane.kernel.metric_specs import MetricCompare, MetricKind, MetricSpec
from controlplane.providers.evidence import MetricEvidence, Reading


@dataclass(frozen=True)
class MetricPoint:
    """One metric of one experiment from second `at` for `span_sec` seconds."""

    experiment_id: int
    name: str
    at: int
    span_sec: int
    kind: str
    compare: str
    baseline: float | None
    canary: float | None
    bound: float | None
    direction: str = Direction.INCREASE.value


def _value(reading: Reading) -> float | None:
    value = reading.value
    if reading.no_data or value is None or not math.isfinite(value):
        return None
    return value


def metric_bound(spec: MetricSpec, baseline: float | None) -> float | None:
    """What the canary's value was compared with (decision/metric_guardrails.py): the
    absolute bound, or the baseline's value widened by the margin (added for a ratio,
    a share for a gauge or histogram), on the bad side; above for `either`."""
    if spec.compare is MetricCompare.ABSOLUTE:
        return spec.bound
    if baseline is None:
        return None
    widen = spec.margin if spec.kind is MetricKind.RATIO else abs(baseline) * spec.margin
    bound = baseline - widen if spec.direction is Direction.DECREASE else baseline + widen
    return bound if math.isfinite(bound) else None


def metric_point_of(experiment_id: int, spec: MetricSpec, evidence: MetricEvidence) -> MetricPoint:
    """The point of one reading, at the second it was read."""
    baseline = _value(evidence.baseline)
    return MetricPoint(
        experiment_id=experiment_id,
        name=spec.name,
        at=int(evidence.read_at),
        span_sec=1,
        kind=spec.kind.value,
        compare=spec.compare.value,
        baseline=baseline,
        canary=_value(evidence.canary),
        bound=metric_bound(spec, baseline),
        direction=spec.direction.value,
    )


def new_readings(
    experiment_id: int,
    specs: Iterable[MetricSpec],
    evidence: Mapping[str, MetricEvidence],
    last_read: Mapping[str, float],
) -> list[MetricPoint]:
    """The points of the readings not recorded yet (`last_read`: per metric, the
    `read_at` last recorded); a reading with an unusable clock is skipped."""
    found: list[MetricPoint] = []
    for spec in specs:
        reading = evidence.get(spec.name)
        if reading is None or not math.isfinite(reading.read_at) or reading.read_at < 0:
            continue
        if last_read.get(spec.name) == reading.read_at:
            continue
        found.append(metric_point_of(experiment_id, spec, reading))
    return found


def _peak(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _lowest(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def merge_metric(points: Sequence[MetricPoint], at: int, span_sec: int) -> MetricPoint:
    """One metric's points of one bucket as one point starting at `at`."""
    if not points:
        raise ValueError("nothing to merge")
    direction = max(p.direction for p in points)
    worst, strictest = (
        (_lowest, _peak) if direction == Direction.DECREASE.value else (_peak, _lowest)
    )
    return MetricPoint(
        experiment_id=points[0].experiment_id,
        name=points[0].name,
        at=at,
        span_sec=span_sec,
        kind=max(p.kind for p in points),
        compare=max(p.compare for p in points),
        baseline=worst([p.baseline for p in points]),
        canary=worst([p.canary for p in points]),
        bound=strictest([p.bound for p in points]),
        direction=direction,
    )


def downsample_metric(points: Sequence[MetricPoint], origin: int, width: int) -> list[MetricPoint]:
    """One metric's points (sorted by `at`) in buckets of `width` seconds from
    `origin`, as points.downsample does for the windows."""
    return [_close(bucket, width) for bucket in bucketed(points, origin, width)]


def _close(bucket: list[MetricPoint], width: int) -> MetricPoint:
    if len(bucket) == 1:
        return bucket[0]
    return merge_metric(bucket, bucket[0].at, max(width, max(p.span_sec for p in bucket)))
