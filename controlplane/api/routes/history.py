"""/v1/experiments/{id}/history: the plots' series, downsampled in the database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from controlplane.api.deps import BackendsDep, ExperimentId
from controlplane.api.problems import problem_responses
from controlplane.api.schemas import ExperimentHistory, HistoryMark, MetricSeries, VariantSeries
from controlplane.api.security import require
from controlplane.auth.roles import Role
from controlplane.experiments.events import ACTIONS, DECIDED
from controlplane.history.metric_points import MetricPoint
from controlplane.history.points import MAX_POINTS, VARIANTS, HistoryPoint, bucket_width
from controlplane.kernel.errors import FieldError, ValidationFailed

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])

DEFAULT_POINTS = 600
MAX_RANGE_SEC = 400 * 24 * 3600
MAX_MARKS = 500
MARK_KINDS = frozenset(kind.value for kind in DECIDED | ACTIONS)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def history_range(
    start: datetime | None,
    end: datetime | None,
    *,
    created: datetime,
    now: float,
    points: int,
) -> tuple[int, int, int]:
    """(first second, last second, bucket width) of a request, or ValidationFailed.
    Pure. By default the range runs from the experiment's creation to now; a `from`
    in the future without a `to` is an empty range (a poll for new points)."""
    last = int(_aware(end).timestamp()) if end is not None else int(now)
    if start is not None:
        first = int(_aware(start).timestamp())
        if end is None and first > last:
            last = first  # asking for what is newer than the newest: nothing yet
    else:  # from the creation, and at least the last second before `to`
        first = min(int(created.timestamp()), last - 1)
    errors: list[FieldError] = []
    if first < 0 or last < 0:
        errors.append(
            FieldError(
                ("query", "from" if first < 0 else "to"), "must not be before 1970-01-01T00:00:00Z"
            )
        )
    elif first > last:
        errors.append(FieldError(("query", "to"), "must not be before from"))
    elif last - first > MAX_RANGE_SEC:
        errors.append(
            FieldError(("query", "to"), f"the range may span at most {MAX_RANGE_SEC // 86400} days")
        )
    if errors:
        raise ValidationFailed("invalid history range", errors)
    return first, last, bucket_width(first, last, points)


def series_of(points: list[HistoryPoint]) -> dict[str, VariantSeries]:
    return {
        name: VariantSeries(
            count=[p.variant(name).count for p in points],
            rps=[p.variant(name).rps for p in points],
            failure_ratio=[p.variant(name).failure_ratio for p in points],
            p50_ms=[p.variant(name).p50_ms for p in points],
            p95_ms=[p.variant(name).p95_ms for p in points],
            p99_ms=[p.variant(name).p99_ms for p in points],
            shed=[p.variant(name).shed for p in points],
            shed_rps=[p.variant(name).shed_rps for p in points],
        )
        for name in VARIANTS
    }


def metric_series_of(points: list[MetricPoint]) -> dict[str, MetricSeries]:
    """Points sorted by name, then `at`, as one series per metric."""
    by_name: dict[str, list[MetricPoint]] = {}
    for point in points:
        by_name.setdefault(point.name, []).append(point)
    return {
        name: MetricSeries(
            at=[p.at for p in found],
            span_sec=[p.span_sec for p in found],
            baseline=[p.baseline for p in found],
            canary=[p.canary for p in found],
            bound=[p.bound for p in found],
            kind=found[-1].kind,
            compare=found[-1].compare,
        )
        for name, found in by_name.items()
    }


@router.get(
    "/{experiment_id}/history",
    response_model=ExperimentHistory,
    responses=problem_responses(notes={404: "no such experiment"}),
    dependencies=[require(Role.VIEWER)],
)
async def get_history(
    experiment_id: ExperimentId,
    backends: BackendsDep,
    start: Annotated[
        datetime | None,
        Query(
            alias="from",
            description="first instant (ISO 8601 or epoch seconds); "
            "default: the experiment's creation",
        ),
    ] = None,
    end: Annotated[
        datetime | None,
        Query(alias="to", description="last instant; default: now"),
    ] = None,
    points: Annotated[
        int, Query(ge=2, le=MAX_POINTS, description="at most this many points")
    ] = DEFAULT_POINTS,
) -> ExperimentHistory:
    """Each variant's judged windows over time (P50/P95/P99, failure ratio, request
    rate), the bounds in force, the canary weight, the rules' provider metrics with
    the bound each was held to, and the events to mark, merged server-side into at
    most `points` buckets (per metric too)."""
    async with backends.store.transaction() as tx:
        experiment = await tx.load_experiment(experiment_id=experiment_id)  # NotFound: 404
    first, last, width = history_range(
        start, end, created=experiment.created_at, now=backends.clock.now(), points=points
    )
    found = await backends.history.read(
        experiment_id=experiment_id, start=first, end=last, width=width
    )
    readings = await backends.history.read_metrics(
        experiment_id=experiment_id, start=first, end=last, width=width
    )
    marks, total = await backends.history.marks(
        experiment_id=experiment_id,
        start=datetime.fromtimestamp(first, UTC),
        end=datetime.fromtimestamp(last + 1, UTC),
        kinds=MARK_KINDS,
        limit=MAX_MARKS,
    )
    return ExperimentHistory(
        experiment_id=experiment_id,
        start=datetime.fromtimestamp(first, UTC),
        end=datetime.fromtimestamp(last, UTC),
        bucket_sec=width,
        t=[p.at for p in found],
        span_sec=[p.span_sec for p in found],
        window_sec=[p.window_sec for p in found],
        canary_weight_bp=[p.canary_weight_bp for p in found],
        threshold_ms=[p.threshold_ms for p in found],
        failure_bound=[p.failure_bound for p in found],
        variants=series_of(found),
        metrics=metric_series_of(readings),
        marks=[HistoryMark(at=m.at, kind=m.kind, actor=m.actor, reason=m.reason) for m in marks],
        marks_total=total,
    )
