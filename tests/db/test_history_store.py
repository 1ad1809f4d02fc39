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
from controlplane.history.metric_points import MetricPoint, downsample_metric
from controlplane.history.points import HistoryPoint, VariantPoint, downsample
from controlplane.history.recorder import HistoryRecorder
from controlplane.history.store import HistoryStore
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.providers.evidence import MetricEvidence, Reading
from tests.support.shared_databases import migrated_pg, pg_url, sqlite_url  # noqa: F401

T0 = 1_800_000_000
NOW = datetime.fromtimestamp(T0, UTC)
RULE = BreakerRule(service="checkout", threshold_ms=250, window_sec=30, failure_ratio=0.2)


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


def random_metric_points(
    experiment_id: int, seconds: list[int], seed: int, name: str = "memory",
    direction: str = "increase",
) -> list[MetricPoint]:
    rng = np.random.default_rng(seed)

    def value() -> float | None:
        return None if rng.random() < 0.2 else f32(rng.uniform(0, 1000))

    return [
        MetricPoint(experiment_id, name, at, 1, "gauge", "baseline", value(), value(), value(),
                    direction)
        for at in seconds
    ]


def assert_same_metrics(got: list[MetricPoint], want: list[MetricPoint]) -> None:
    assert [(p.name, p.at, p.span_sec) for p in got] == [(p.name, p.at, p.span_sec) for p in want]
    for a, b in zip(got, want, strict=True):
        assert (a.kind, a.compare, a.direction) == (b.kind, b.compare, b.direction)
        for field in ("baseline", "canary", "bound"):
            va, vb = getattr(a, field), getattr(b, field)
            assert (va is None) == (vb is None), field
            if va is not None:
                assert va == pytest.approx(vb, rel=1e-6), field


@pytest.mark.parametrize("width", [1, 7, 60])
async def test_the_database_buckets_metric_readings_as_the_pure_downsample_does(
    stores: Stores, width: int
) -> None:
    rng = np.random.default_rng(width)
    seconds = sorted({T0 + int(s) for s in rng.integers(0, 600, 60)})
    memory = random_metric_points(stores.experiment_id, seconds, 1)
    errors = random_metric_points(stores.experiment_id, seconds[::2], 2, name="errors")
    # a metric guarding against a fall: its buckets keep troughs, as the pure one does
    orders = random_metric_points(stores.experiment_id, seconds[1::3], 3, name="orders",
                                  direction="decrease")
    await stores.history.append([], memory + errors + orders)

    start, end = T0 + 13, T0 + 500
    got = await stores.history.read_metrics(
        experiment_id=stores.experiment_id, start=start, end=end, width=width
    )

    want = [
        point
        for series in (errors, memory, orders)  # by name, then oldest first
        for point in downsample_metric([p for p in series if start <= p.at <= end], start, width)
    ]
    assert_same_metrics(got, want)


async def test_a_reading_written_twice_keeps_the_first(stores: Stores) -> None:
    first = random_metric_points(stores.experiment_id, [T0], 1)
    await stores.history.append(random_points(stores.experiment_id, [T0], 1), first)
    await stores.history.append([], random_metric_points(stores.experiment_id, [T0], 2))

    got = await stores.history.read_metrics(
        experiment_id=stores.experiment_id, start=T0, end=T0, width=1
    )
    assert_same_metrics(got, first)


async def test_merging_merges_the_metric_readings_with_the_windows(stores: Stores) -> None:
    windows = random_points(stores.experiment_id, list(range(T0, T0 + 600)), 4)
    readings = random_metric_points(stores.experiment_id, list(range(T0, T0 + 600, 15)), 4)
    await stores.history.append(windows, readings)
    before = T0 + 300

    merged = await stores.history.compact(
        experiment_id=stores.experiment_id, before=before, origin=0, width=60
    )

    assert merged == 300 + 20
    old = [p for p in readings if p.at < before]
    got = await stores.history.read_metrics(
        experiment_id=stores.experiment_id, start=T0, end=T0 + 599, width=1
    )
    assert_same_metrics(got[:-20], downsample_metric(old, 0, 60))
    assert_same_metrics(got[-20:], readings[-20:])
    spans = await stores.history.metric_spans(experiment_ids=[stores.experiment_id])
    assert spans == {stores.experiment_id: (len(got), T0, T0 + 585)}


MEMORY = MetricSpec.model_validate(
    {"name": "memory", "kind": "gauge", "query": 'max(rss{variant="$variant"})',
     "compare": "baseline", "margin": 0.5}
)  # fmt: skip


def reading(canary: float, baseline: float | None, read_at: float) -> dict[str, MetricEvidence]:
    base = Reading(baseline) if baseline is not None else Reading.missing("empty answer")
    return {"memory": MetricEvidence("memory", Reading(canary), base, read_at)}


async def test_the_recorder_writes_each_reading_once_with_the_windows(stores: Stores) -> None:
    recorder = HistoryRecorder()
    snapshots: dict[str, WindowSnapshot] = {}
    for second in range(30):  # evaluated four times a second; read every 15 s
        for quarter in range(4):
            now = T0 + second + quarter / 4
            read_at = T0 + 0.5 + 15 * (second // 15)
            recorder.observe(stores.experiment_id, snapshots, RULE, 500, now)
            recorder.observe_metrics(
                stores.experiment_id, [MEMORY], reading(100.0 + second // 15, 80.0, read_at)
            )
        if second == 3:
            await recorder.flush(stores.history)
    recorder.observe_metrics(stores.experiment_id, [MEMORY], reading(1.0, None, T0 + 30.5))
    await recorder.flush(stores.history)

    got = await stores.history.read_metrics(
        experiment_id=stores.experiment_id, start=T0, end=T0 + 60, width=1
    )
    assert [(p.at, p.canary, p.baseline, p.bound) for p in got] == [
        (T0, 100.0, 80.0, 120.0), (T0 + 15, 101.0, 80.0, 120.0), (T0 + 30, 1.0, None, None)
    ]  # fmt: skip
    windows = await stores.history.read(
        experiment_id=stores.experiment_id, start=T0, end=T0 + 60, width=1
    )
    assert len(windows) == 30 and recorder.stats.written == 33 and recorder.pending == 0


async def test_an_ended_experiment_keeps_at_most_the_bound_per_metric(stores: Stores) -> None:
    recorder = HistoryRecorder(ended_points=50)
    for second in range(400):
        recorder.observe_metrics(
            stores.experiment_id, [MEMORY], reading(float(second), 1.0, T0 + second + 0.1)
        )
    await recorder.flush(stores.history)
    async with stores.experiments.transaction() as tx:
        loaded = await tx.load_experiment(experiment_id=stores.experiment_id)
        await tx.save_state(experiment=replace(loaded, state=ExperimentState.ABORTED))

    await recorder.keep(stores.history, active=[], now=T0 + 500)

    got = await stores.history.read_metrics(
        experiment_id=stores.experiment_id, start=T0, end=T0 + 500, width=1
    )
    assert 40 <= len(got) <= 50 and recorder.stats.compactions == 1
    assert got[-1].canary == 399.0, "a bucket keeps its peak"
    assert sum(p.span_sec for p in got) >= 400 - got[-1].span_sec
