"""The plots' history on PostgreSQL and SQLite: the database's buckets are those of
history.points.downsample, merging bounds what is kept, writes are idempotent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from controlplane.db.history import SqlHistoryStore
from controlplane.db.migrate import upgrade
from controlplane.db.session import Database, make_engine
from controlplane.db.store import SqlExperimentStore
from controlplane.experiments.events import EventKind
from controlplane.experiments.lifecycle import ExperimentState
from controlplane.experiments.store import ExperimentSpec, StepSpec
from controlplane.history.points import HistoryPoint, VariantPoint, downsample
from controlplane.history.store import HistoryStore

T0 = 1_800_000_000
NOW = datetime.fromtimestamp(T0, UTC)


@dataclass
class Stores:
    history: HistoryStore
    experiments: SqlExperimentStore
    experiment_id: int


@pytest.fixture(params=["postgresql", "sqlite"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    url = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    upgrade(url)
    database = Database(make_engine(url))
    experiments = SqlExperimentStore(database)
    spec = ExperimentSpec(
        name="v2",
        service="checkout",
        baseline_upstream="http://127.0.0.1:9001",
        canary_upstream="http://127.0.0.1:9002",
        steps=(StepSpec(500, 30),),
        sticky_header="x-user-id",
        sticky_cookie=None,
        rule=None,
    )
    async with experiments.transaction() as tx:
        created = await tx.create_experiment(spec=spec, salt="s", now=NOW)
    try:
        yield Stores(SqlHistoryStore(database), experiments, created.id)
    finally:
        database.dispose()


def f32(value: float) -> float:
    """What a 4-byte REAL column gives back."""
    return float(np.float32(value))


def variant(rng: np.random.Generator, empty: bool) -> VariantPoint:
    if empty:
        return VariantPoint(
            count=0, rps=0.0, failure_ratio=0.0, p50_ms=None, p95_ms=None, p99_ms=None
        )
    p50 = f32(rng.uniform(10, 100))
    return VariantPoint(
        count=int(rng.integers(1, 5000)),
        rps=f32(rng.uniform(1, 200)),
        failure_ratio=f32(rng.uniform(0, 0.3)),
        p50_ms=p50,
        p95_ms=f32(p50 * 2),
        p99_ms=f32(p50 * 3),
        shed=int(rng.integers(0, 300)) if rng.random() < 0.5 else 0,
        shed_rps=f32(rng.uniform(0, 20)),
    )


def random_points(experiment_id: int, seconds: list[int], seed: int) -> list[HistoryPoint]:
    rng = np.random.default_rng(seed)
    return [
        HistoryPoint(
            experiment_id=experiment_id,
            at=at,
            span_sec=1,
            window_sec=30,
            canary_weight_bp=int(rng.choice([0, 500, 2500])),
            threshold_ms=f32(rng.choice([200.0, 250.0])),
            failure_bound=f32(0.2),
            baseline=variant(rng, empty=False),
            canary=variant(rng, empty=rng.random() < 0.2),
        )
        for at in seconds
    ]


def assert_same(got: list[HistoryPoint], want: list[HistoryPoint]) -> None:
    assert [(p.at, p.span_sec) for p in got] == [(p.at, p.span_sec) for p in want]
    for a, b in zip(got, want, strict=True):
        assert (a.window_sec, a.canary_weight_bp) == (b.window_sec, b.canary_weight_bp)
        assert a.threshold_ms == pytest.approx(b.threshold_ms, rel=1e-6)
        for name in ("baseline", "canary"):
            x, y = a.variant(name), b.variant(name)
            assert abs(x.count - y.count) <= 1  # a mean rounded on either side
            assert abs(x.shed - y.shed) <= 1
            for field in ("rps", "failure_ratio", "p50_ms", "p95_ms", "p99_ms", "shed_rps"):
                vx, vy = getattr(x, field), getattr(y, field)
                assert (vx is None) == (vy is None), field
                if vx is not None:
                    assert vx == pytest.approx(vy, rel=1e-5), field


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("width", [1, 7, 60])
async def test_the_database_buckets_points_as_the_pure_downsample_does(
    stores: Stores, seed: int, width: int
) -> None:
    rng = np.random.default_rng(seed)
    seconds = sorted({T0 + int(s) for s in rng.integers(0, 600, 400)})
    points = random_points(stores.experiment_id, seconds, seed)
    await stores.history.append(points)

    start, end = T0 + 13, T0 + 500
    got = await stores.history.read(
        experiment_id=stores.experiment_id, start=start, end=end, width=width
    )

    inside = [p for p in points if start <= p.at <= end]
    assert_same(got, downsample(inside, start, width))


async def test_a_second_written_twice_keeps_the_first_point(stores: Stores) -> None:
    first = random_points(stores.experiment_id, [T0], 1)
    second = random_points(stores.experiment_id, [T0], 2)
    await stores.history.append(first)
    await stores.history.append(second)  # a new leader repeating its predecessor's second

    got = await stores.history.read(experiment_id=stores.experiment_id, start=T0, end=T0, width=1)
    assert_same(got, first)


async def test_merging_old_points_bounds_them_and_keeps_the_recent_ones(stores: Stores) -> None:
    points = random_points(stores.experiment_id, list(range(T0, T0 + 600)), 4)
    await stores.history.append(points)
    before = T0 + 300

    merged = await stores.history.compact(
        experiment_id=stores.experiment_id, before=before, origin=0, width=60
    )
    again = await stores.history.compact(
        experiment_id=stores.experiment_id, before=before, origin=0, width=60
    )

    assert (merged, again) == (300, 0), "merged points are not merged again"
    spans = await stores.history.spans(experiment_ids=[stores.experiment_id])
    old = [p for p in points if p.at < before]
    assert spans[stores.experiment_id] == (len(downsample(old, 0, 60)) + 300, T0, T0 + 599)
    got = await stores.history.read(
        experiment_id=stores.experiment_id, start=T0, end=T0 + 599, width=1
    )
    assert_same(got[-300:], points[-300:])
    assert_same(got[:-300], downsample(old, 0, 60))


async def test_spans_without_ids_name_only_ended_experiments(stores: Stores) -> None:
    await stores.history.append(random_points(stores.experiment_id, [T0, T0 + 5], 5))
    assert await stores.history.spans(experiment_ids=None) == {}

    async with stores.experiments.transaction() as tx:
        loaded = await tx.load_experiment(experiment_id=stores.experiment_id)
        await tx.save_state(experiment=replace(loaded, state=ExperimentState.ABORTED))

    assert await stores.history.spans(experiment_ids=None) == {
        stores.experiment_id: (2, T0, T0 + 5)
    }


async def test_marks_are_the_newest_events_of_the_kinds_in_the_range(stores: Stores) -> None:
    async with stores.experiments.transaction() as tx:
        for i, kind in enumerate(
            ["started", "route_reconciled", "tripped", "half_open", "probe_failed", "tripped"]
        ):
            await tx.append_event(
                experiment_id=stores.experiment_id,
                service="checkout",
                at=NOW + timedelta(seconds=i),
                actor="controller",
                kind=EventKind(kind),
                reason=f"r{i}",
            )

    marks, total = await stores.history.marks(
        experiment_id=stores.experiment_id,
        start=NOW,
        end=NOW + timedelta(seconds=4),
        kinds={"started", "tripped", "half_open", "probe_failed"},
        limit=3,
    )

    assert total == 4, "route_reconciled is no mark; the last tripped is out of range"
    assert [(m.kind, m.reason) for m in marks] == [
        ("tripped", "r2"),
        ("half_open", "r3"),
        ("probe_failed", "r4"),
    ]
