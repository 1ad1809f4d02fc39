"""The plots' history on SQL (history.store.HistoryStore), over `Database`: the
windows' points and the provider metrics' readings, side by side.

Buckets are formed in the database (GROUP BY on integer division of the second), so
a day of per-second points reaches the API as at most a thousand rows; the
aggregates are those of history.points.merge, which the tests hold this to.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, func, insert, literal, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from controlplane.db.models import Event, Experiment
from controlplane.db.models import HistoryMetricPoint as MetricRow
from controlplane.db.models import HistoryPoint as Row
from controlplane.db.session import Database
from controlplane.history.metric_points import MetricPoint
from controlplane.history.points import HistoryPoint, VariantPoint
from controlplane.history.store import HistorySpan, Mark
from controlplane.kernel.judgment import Direction

ENDED_STATES = ("promoted", "rolled_back", "aborted")
_VARIANT_FIELDS = (
    "count", "rps", "failure_ratio", "p50_ms", "p95_ms", "p99_ms", "shed", "shed_rps"
)  # fmt: skip


def _values(point: HistoryPoint) -> dict[str, Any]:
    values: dict[str, Any] = {
        "experiment_id": point.experiment_id,
        "at": point.at,
        "span_sec": point.span_sec,
        "window_sec": point.window_sec,
        "canary_weight_bp": point.canary_weight_bp,
        "threshold_ms": point.threshold_ms,
        "failure_bound": point.failure_bound,
    }
    for prefix, variant in (("b", point.baseline), ("c", point.canary)):
        for name in _VARIANT_FIELDS:
            values[f"{prefix}_{name}"] = getattr(variant, name)
    return values


def _metric_values(point: MetricPoint) -> dict[str, Any]:
    return {
        "experiment_id": point.experiment_id,
        "name": point.name,
        "at": point.at,
        "span_sec": point.span_sec,
        "kind": point.kind,
        "compare": point.compare,
        "direction": point.direction,
        "b_value": point.baseline,
        "c_value": point.canary,
        "bound": point.bound,
    }


def _insert_new(session: Session, table: type[Row] | type[MetricRow], rows: list[Any]) -> None:
    """Insert rows; a key already stored keeps what it holds."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        session.execute(pg_insert(table).on_conflict_do_nothing(), rows)
    elif dialect == "sqlite":
        session.execute(sqlite_insert(table).on_conflict_do_nothing(), rows)
    else:  # pragma: no cover - database_url() admits these two only
        session.execute(insert(table), rows)


def _append(
    *, session: Session, points: Sequence[HistoryPoint], metrics: Sequence[MetricPoint]
) -> None:
    _insert_new(session, Row, [_values(p) for p in points])
    _insert_new(session, MetricRow, [_metric_values(p) for p in metrics])


def _aggregates() -> list[ColumnElement[Any]]:
    """history.points.merge as SQL aggregates, in the order _point_of reads them."""
    columns: list[ColumnElement[Any]] = [
        func.min(Row.at),
        func.count(),
        func.max(Row.span_sec),
        func.max(Row.window_sec),
        func.min(Row.canary_weight_bp),
        func.min(Row.threshold_ms),
        func.min(Row.failure_bound),
    ]
    for prefix in ("b", "c"):
        col = {name: getattr(Row, f"{prefix}_{name}") for name in _VARIANT_FIELDS}
        columns += [
            func.avg(col["count"]),
            func.avg(col["rps"]),
            func.max(col["failure_ratio"]),
            func.max(col["p50_ms"]),
            func.max(col["p95_ms"]),
            func.max(col["p99_ms"]),
            func.avg(col["shed"]),
            func.avg(col["shed_rps"]),
        ]
    return columns


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _variant_of(values: Sequence[Any]) -> VariantPoint:
    count, rps, failure_ratio, p50, p95, p99, shed, shed_rps = values
    return VariantPoint(
        count=round(float(count)),
        rps=float(rps),
        failure_ratio=float(failure_ratio),
        p50_ms=_float(p50),
        p95_ms=_float(p95),
        p99_ms=_float(p99),
        shed=round(float(shed)),
        shed_rps=float(shed_rps),
    )


def _point_of(experiment_id: int, row: Sequence[Any], width: int) -> HistoryPoint:
    at, n, span, window, weight, threshold, bound = row[:7]
    return HistoryPoint(
        experiment_id=experiment_id,
        at=int(at),
        span_sec=int(span) if n == 1 else max(width, int(span)),
        window_sec=int(window),
        canary_weight_bp=int(weight),
        threshold_ms=_float(threshold),
        failure_bound=_float(bound),
        baseline=_variant_of(row[7:15]),
        canary=_variant_of(row[15:23]),
    )


def _bucketed(
    session: Session,
    experiment_id: int,
    where: Sequence[ColumnElement[bool]],
    origin: int,
    width: int,
) -> list[HistoryPoint]:
    bucket = (Row.at - literal(origin)) // literal(width)
    query = (
        select(*_aggregates())
        .where(Row.experiment_id == experiment_id, *where)
        .group_by(bucket)
        .order_by(bucket)
    )
    return [_point_of(experiment_id, tuple(row), width) for row in session.execute(query)]


def _read(
    *, session: Session, experiment_id: int, start: int, end: int, width: int
) -> list[HistoryPoint]:
    return _bucketed(session, experiment_id, (Row.at >= start, Row.at <= end), start, width)


def _metric_bucketed(
    session: Session,
    experiment_id: int,
    where: Sequence[ColumnElement[bool]],
    origin: int,
    width: int,
) -> list[MetricPoint]:
    """metric_points.downsample_metric in SQL, per metric; by name, then oldest first."""
    bucket = (MetricRow.at - literal(origin)) // literal(width)
    query = (
        select(
            MetricRow.name,
            func.min(MetricRow.at),
            func.count(),
            func.max(MetricRow.span_sec),
            func.max(MetricRow.kind),
            func.max(MetricRow.compare),
            func.max(MetricRow.direction),
            func.max(MetricRow.b_value),
            func.max(MetricRow.c_value),
            func.min(MetricRow.bound),
            func.min(MetricRow.b_value),
            func.min(MetricRow.c_value),
            func.max(MetricRow.bound),
        )
        .where(MetricRow.experiment_id == experiment_id, *where)
        .group_by(MetricRow.name, bucket)
        .order_by(MetricRow.name, bucket)
    )
    found = []
    for name, at, n, span, kind, compare, direction, b_hi, c_hi, bound_lo, b_lo, c_lo, bound_hi in (
        session.execute(query)
    ):
        # metric_points.merge_metric: troughs and the highest bound where a fall is bad
        falls = direction == Direction.DECREASE.value
        found.append(MetricPoint(
            experiment_id=experiment_id,
            name=str(name),
            at=int(at),
            span_sec=int(span) if n == 1 else max(width, int(span)),
            kind=str(kind),
            compare=str(compare),
            baseline=_float(b_lo if falls else b_hi),
            canary=_float(c_lo if falls else c_hi),
            bound=_float(bound_hi if falls else bound_lo),
            direction=str(direction),
        ))  # fmt: skip
    return found


def _read_metrics(
    *, session: Session, experiment_id: int, start: int, end: int, width: int
) -> list[MetricPoint]:
    where = (MetricRow.at >= start, MetricRow.at <= end)
    return _metric_bucketed(session, experiment_id, where, start, width)


def _marks(
    *,
    session: Session,
    experiment_id: int,
    start: datetime,
    end: datetime,
    kinds: Collection[str],
    limit: int,
) -> tuple[list[Mark], int]:
    where = (
        Event.experiment_id == experiment_id,
        Event.kind.in_(sorted(kinds)),
        Event.at >= start,
        Event.at <= end,
    )
    total = session.scalar(select(func.count()).select_from(Event).where(*where)) or 0
    rows = session.execute(
        select(Event.at, Event.kind, Event.actor, Event.reason)
        .where(*where)
        .order_by(Event.id.desc())
        .limit(limit)
    ).all()
    marks = [Mark(at=r.at, kind=r.kind, actor=r.actor, reason=r.reason) for r in rows]
    return marks[::-1], total


def _compact(
    *, session: Session, experiment_id: int, before: int | None, origin: int, width: int
) -> int:
    """Replace the points before `before` that are narrower than `width` by their
    buckets, in the caller's transaction; points merged before stay as they are."""
    return _compact_windows(session, experiment_id, before, origin, width) + _compact_metrics(
        session, experiment_id, before, origin, width
    )


def _compact_windows(
    session: Session, experiment_id: int, before: int | None, origin: int, width: int
) -> int:
    where: list[ColumnElement[bool]] = [Row.span_sec < width]
    if before is not None:
        where.append(Row.at < before)
    replaced = (
        session.scalar(select(func.count()).where(Row.experiment_id == experiment_id, *where)) or 0
    )
    if replaced == 0:
        return 0
    merged = _bucketed(session, experiment_id, where, origin, width)
    session.execute(delete(Row).where(Row.experiment_id == experiment_id, *where))
    session.execute(insert(Row), [_values(p) for p in merged])
    return replaced


def _compact_metrics(
    session: Session, experiment_id: int, before: int | None, origin: int, width: int
) -> int:
    where: list[ColumnElement[bool]] = [MetricRow.span_sec < width]
    if before is not None:
        where.append(MetricRow.at < before)
    replaced = (
        session.scalar(
            select(func.count()).where(MetricRow.experiment_id == experiment_id, *where)
        )
        or 0
    )
    if replaced == 0:
        return 0
    merged = _metric_bucketed(session, experiment_id, where, origin, width)
    session.execute(delete(MetricRow).where(MetricRow.experiment_id == experiment_id, *where))
    session.execute(insert(MetricRow), [_metric_values(p) for p in merged])
    return replaced


def _spans(*, session: Session, experiment_ids: Collection[int] | None) -> dict[int, HistorySpan]:
    query = select(Row.experiment_id, func.count(), func.min(Row.at), func.max(Row.at))
    if experiment_ids is None:
        ended = select(Experiment.id).where(Experiment.state.in_(ENDED_STATES))
        query = query.where(Row.experiment_id.in_(ended))
    else:
        if not experiment_ids:
            return {}
        query = query.where(Row.experiment_id.in_(sorted(experiment_ids)))
    query = query.group_by(Row.experiment_id)
    return {int(e): (int(n), int(a), int(b)) for e, n, a, b in session.execute(query)}


def _metric_spans(
    *, session: Session, experiment_ids: Collection[int] | None
) -> dict[int, HistorySpan]:
    """Per experiment: (the most points any one metric has, first second, last second)."""
    per_metric = select(
        MetricRow.experiment_id.label("e"),
        func.count().label("n"),
        func.min(MetricRow.at).label("a"),
        func.max(MetricRow.at).label("b"),
    )
    if experiment_ids is None:
        ended = select(Experiment.id).where(Experiment.state.in_(ENDED_STATES))
        per_metric = per_metric.where(MetricRow.experiment_id.in_(ended))
    else:
        if not experiment_ids:
            return {}
        per_metric = per_metric.where(MetricRow.experiment_id.in_(sorted(experiment_ids)))
    sub = per_metric.group_by(MetricRow.experiment_id, MetricRow.name).subquery()
    query = select(sub.c.e, func.max(sub.c.n), func.min(sub.c.a), func.max(sub.c.b)).group_by(
        sub.c.e
    )
    return {int(e): (int(n), int(a), int(b)) for e, n, a, b in session.execute(query)}


def read_rows(*, session: Session, experiment_id: int, start: int, end: int) -> int:
    """How many stored rows [start, end] holds, each fetched whole: the cost of reading
    the history as it is stored (the benchmark's reference for merged reads)."""
    query = select(Row).where(
        Row.experiment_id == experiment_id, Row.at >= start, Row.at <= end
    )
    return len(session.execute(query.execution_options(yield_per=10_000)).all())


class SqlHistoryStore:
    """HistoryStore on the SQL database: each call one short transaction."""

    def __init__(self, database: Database) -> None:
        self.database = database

    async def append(
        self, points: Sequence[HistoryPoint], metrics: Sequence[MetricPoint] = ()
    ) -> None:
        async with self.database.transaction() as tx:
            await tx.run(_append, points=points, metrics=metrics)

    async def read_metrics(
        self, *, experiment_id: int, start: int, end: int, width: int
    ) -> list[MetricPoint]:
        return await self.database.read(
            _read_metrics, experiment_id=experiment_id, start=start, end=end, width=width
        )

    async def metric_spans(
        self, *, experiment_ids: Collection[int] | None
    ) -> dict[int, HistorySpan]:
        return await self.database.read(_metric_spans, experiment_ids=experiment_ids)

    async def read(
        self, *, experiment_id: int, start: int, end: int, width: int
    ) -> list[HistoryPoint]:
        return await self.database.read(
            _read, experiment_id=experiment_id, start=start, end=end, width=width
        )

    async def marks(
        self,
        *,
        experiment_id: int,
        start: datetime,
        end: datetime,
        kinds: Collection[str],
        limit: int,
    ) -> tuple[list[Mark], int]:
        return await self.database.read(
            _marks,
            experiment_id=experiment_id,
            start=start,
            end=end,
            kinds=kinds,
            limit=limit,
        )

    async def compact(
        self, *, experiment_id: int, before: int | None, origin: int, width: int
    ) -> int:
        async with self.database.transaction() as tx:
            return await tx.run(
                _compact,
                experiment_id=experiment_id,
                before=before,
                origin=origin,
                width=width,
            )

    async def spans(self, *, experiment_ids: Collection[int] | None) -> dict[int, HistorySpan]:
        return await self.database.read(_spans, experiment_ids=experiment_ids)
