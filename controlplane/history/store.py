"""What the history writer and the API ask of the history's storage.

One writer per store: the controller's leader appends and compacts; the API reads.
The SQL implementation is controlplane.db.history.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from controlplane.history.metric_points import MetricPoint
from controlplane.history.points import HistoryPoint

HistorySpan = tuple[int, int, int]  # points, first second, last second


@dataclass(frozen=True)
class Mark:
    """An event worth a line on the time axis (a trip, a probe, a step, an action)."""

    at: datetime
    kind: str
    actor: str
    reason: str


class HistoryStore(Protocol):
    async def append(
        self, points: Sequence[HistoryPoint], metrics: Sequence[MetricPoint] = ()
    ) -> None:
        """Store the windows' points and the metrics' readings, in one transaction; a
        second already stored for an experiment (and metric) is kept as it was."""
        ...

    async def read_metrics(
        self, *, experiment_id: int, start: int, end: int, width: int
    ) -> list[MetricPoint]:
        """The metrics' points in [start, end], each metric's merged into buckets of
        `width` seconds from `start` (metric_points.downsample_metric), by name, then
        oldest first."""
        ...

    async def read(
        self, *, experiment_id: int, start: int, end: int, width: int
    ) -> list[HistoryPoint]:
        """The points in [start, end], merged into buckets of `width` seconds from
        `start` (points.downsample's rules), oldest first."""
        ...

    async def marks(
        self,
        *,
        experiment_id: int,
        start: datetime,
        end: datetime,
        kinds: Collection[str],
        limit: int,
    ) -> tuple[list[Mark], int]:
        """The newest `limit` events of `kinds` in [start, end], oldest first, and how
        many there were in all."""
        ...

    async def compact(
        self, *, experiment_id: int, before: int | None, origin: int, width: int
    ) -> int:
        """Merge the points (windows and metrics, in one transaction) before second
        `before` (all when None) into buckets of `width` seconds counted from `origin`
        (points as wide already stay); how many points were merged."""
        ...

    async def spans(self, *, experiment_ids: Collection[int] | None) -> dict[int, HistorySpan]:
        """Per experiment with points (of those given, or of every ended one):
        (points, first second, last second)."""
        ...

    async def metric_spans(
        self, *, experiment_ids: Collection[int] | None
    ) -> dict[int, HistorySpan]:
        """As `spans`, for the metrics' readings: the points of the metric with the most."""
        ...


def ended_width(points: int, first: int, last: int, keep: int) -> int | None:
    """The bucket width that leaves an ended experiment at most `keep` points; None
    when it holds no more than that already."""
    if points <= keep:
        return None
    span = max(last - first + 1, 1)
    return max(2, -(-span // keep))
