"""`canary bench history`: what the plots' history costs the database.

On PostgreSQL (a database of its own on CANARY_BENCH_DATABASE_URL's server, default
postgresql://postgres@127.0.0.1:5432/postgres) and on a SQLite file:

- writes: the leader's rounds as they run with 50 running experiments, one
  transaction of 50 points a second; per round, against a reference measured in the
  same run: a transaction appending one event (the smallest commit the controller
  makes for a decision);
- size: one experiment-day of per-second points (86,400), table and index;
- reads: the dashboard's query, a day merged into 1,000 points in the database,
  against the reference of fetching the day's rows as they are stored (what merging
  in Python would start from); and the page's per-second poll, the last 5 seconds;
- merging the ended day into at most 1,000 points.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/postgres"
EXPERIMENTS = 50
DAY = 86_400
T0 = 1_800_000_000


def _points(experiment_id: int, start: int, seconds: int) -> list[Any]:
    from controlplane.history.points import HistoryPoint, VariantPoint

    def variant(i: int) -> VariantPoint:
        p50 = 40.0 + (i % 17)
        return VariantPoint(
            count=3000 + i % 100,
            rps=100.0 + (i % 7),
            failure_ratio=0.001,
            p50_ms=p50,
            p95_ms=p50 * 2.1,
            p99_ms=p50 * 3.3,
        )

    return [
        HistoryPoint(
            experiment_id=experiment_id,
            at=start + i,
            span_sec=1,
            window_sec=60,
            canary_weight_bp=500,
            threshold_ms=250.0,
            failure_bound=0.3,
            baseline=variant(i),
            canary=variant(i + 5),
        )
        for i in range(seconds)
    ]


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


def _size_bytes(database: Any) -> int:
    with database.engine.connect() as conn:
        if database.engine.dialect.name == "postgresql":
            return int(
                conn.exec_driver_sql("SELECT pg_total_relation_size('history_points')").scalar_one()
            )
        pages = conn.exec_driver_sql(
            "SELECT count(*) FROM dbstat WHERE name IN "
            "('history_points', 'sqlite_autoindex_history_points_1')"
        ).scalar_one()
        size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
        return int(pages) * int(size)


async def _measure(url: str, rounds: int, progress: bool) -> dict[str, Any]:
    from controlplane.db import migrate
    from controlplane.db.history import SqlHistoryStore, read_rows
    from controlplane.db.session import Database, make_engine
    from controlplane.db.store import SqlExperimentStore
    from controlplane.experiments.events import EventKind
    from controlplane.experiments.store import ExperimentSpec, StepSpec
    from controlplane.history.points import MAX_POINTS, bucket_width
    from controlplane.history.store import ended_width

    migrate.upgrade(url)
    database = Database(make_engine(url))
    store, history = SqlExperimentStore(database), SqlHistoryStore(database)
    try:
        ids = []
        async with store.transaction() as tx:
            for n in range(EXPERIMENTS + 1):
                spec = ExperimentSpec(
                    name=f"bench {n}",
                    service=f"svc-{n}",
                    baseline_upstream="http://127.0.0.1:9001",
                    canary_upstream="http://127.0.0.1:9002",
                    steps=(StepSpec(500, 60),),
                    sticky_header="x-user-id",
                    sticky_cookie=None,
                    rule=None,
                )
                created = await tx.create_experiment(
                    spec=spec, salt="s", now=datetime.fromtimestamp(T0, UTC)
                )
                ids.append(created.id)
        writers, day_id = ids[:EXPERIMENTS], ids[EXPERIMENTS]

        event: list[float] = []
        rounds_s: list[float] = []
        at = datetime.fromtimestamp(T0, UTC)
        for second in range(rounds):
            started = time.perf_counter()
            async with store.transaction() as tx:
                await tx.append_event(
                    service="svc-0", at=at, actor="bench", kind=EventKind.UPDATED,
                    experiment_id=writers[0],
                )
            event.append(time.perf_counter() - started)
            batch = [p for e in writers for p in _points(e, T0 + second, 1)]
            started = time.perf_counter()
            await history.append(batch)
            rounds_s.append(time.perf_counter() - started)
        if progress:
            print(f"  {url.split(':')[0]}: {rounds} rounds written", file=sys.stderr)

        before = _size_bytes(database)
        day = _points(day_id, T0, DAY)
        for i in range(0, DAY, 3600):
            await history.append(day[i : i + 3600])
        size = _size_bytes(database) - before

        width = bucket_width(T0, T0 + DAY - 1, MAX_POINTS)
        merged_reads: list[float] = []
        raw_reads: list[float] = []
        for _ in range(7):
            started = time.perf_counter()
            got = await history.read(experiment_id=day_id, start=T0, end=T0 + DAY - 1, width=width)
            merged_reads.append(time.perf_counter() - started)
            started = time.perf_counter()
            raw = await database.read(read_rows, experiment_id=day_id, start=T0, end=T0 + DAY - 1)
            raw_reads.append(time.perf_counter() - started)
        assert raw == DAY and len(got) <= MAX_POINTS
        tail_reads: list[float] = []
        for _ in range(50):
            started = time.perf_counter()
            await history.read(experiment_id=day_id, start=T0 + DAY - 5, end=T0 + DAY - 1, width=1)
            tail_reads.append(time.perf_counter() - started)

        ended = ended_width(DAY, T0, T0 + DAY - 1, MAX_POINTS)
        assert ended is not None
        started = time.perf_counter()
        await history.compact(experiment_id=day_id, before=None, origin=T0, width=ended)
        compact_s = time.perf_counter() - started
        kept = (await history.spans(experiment_ids=[day_id]))[day_id][0]
        round_ms, event_ms = _median_ms(rounds_s), _median_ms(event)
        merged_ms, raw_ms = _median_ms(merged_reads), _median_ms(raw_reads)
        return {
            "write_round_50_points_ms": round_ms,
            "one_event_transaction_ms": event_ms,
            "write_round_vs_one_event": round(round_ms / event_ms, 2),
            "points_per_second_written_at_one_round_a_second": EXPERIMENTS,
            "leader_db_time_per_second_pct": round(round_ms / 10, 2),
            "experiment_day_bytes": size,
            "experiment_day_mib": round(size / 2**20, 2),
            "bytes_per_point": round(size / DAY, 1),
            "read_day_as_1000_points_ms": merged_ms,
            "read_day_raw_rows_ms": raw_ms,
            "read_merged_vs_raw": round(merged_ms / raw_ms, 3),
            "read_last_5_seconds_ms": _median_ms(tail_reads),
            "points_returned": len(got),
            "compact_ended_day_ms": round(compact_s * 1000, 1),
            "points_kept_after_end": kept,
        }
    finally:
        database.dispose()


def run(*, quick: bool = False, progress: bool = True) -> dict[str, Any]:
    from controlplane.db.scratch import scratch_database

    rounds = 60 if quick else 600
    server = os.environ.get("CANARY_BENCH_DATABASE_URL", DEFAULT_DATABASE)
    result: dict[str, Any] = {"benchmark": "history", "rounds": rounds, "experiments": EXPERIMENTS}
    with scratch_database(server, tag="canary_bench") as url:
        result["postgresql"] = asyncio.run(_measure(url, rounds, progress))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "history.db"
        result["sqlite"] = asyncio.run(_measure(f"sqlite:///{path}", rounds, progress))
    return result
