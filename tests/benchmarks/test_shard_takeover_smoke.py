"""`canary bench shard-takeover` at its smallest: replica processes on PostgreSQL and
etcd, one killed, its shards taken over; the JSON has its shape. Figures are
sanity-checked, not judged: speed belongs to the recorded run."""

from __future__ import annotations

import os

import pytest

from controlplane.benchmarks.replicas import cpu_seconds
from controlplane.benchmarks.shard_takeover import measure_takeover, quantile, summary
from controlplane.cli.bench import BENCHMARKS
from controlplane.db.migrate import upgrade


def test_the_benchmark_is_registered() -> None:
    assert BENCHMARKS["shard-takeover"] == "controlplane.benchmarks.shard_takeover:run"


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([3.0], 0.95, 3.0), ([1.0, 2.0], 0.5, 1.0), ([4.0, 1.0, 3.0, 2.0], 0.5, 2.0),
     ([float(n) for n in range(1, 21)], 0.95, 19.0), ([1.0, 2.0, 3.0], 1.0, 3.0)],
)
def test_quantiles_are_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert quantile(values, q) == expected


def test_a_summary_needs_values() -> None:
    with pytest.raises(ValueError, match="no values"):
        summary([])


def test_a_process_cpu_is_read_from_proc() -> None:
    spent = cpu_seconds(os.getpid())
    assert spent > 0
    sum(range(2_000_000))
    assert cpu_seconds(os.getpid()) >= spent


@pytest.mark.e2e
@pytest.mark.real
async def test_one_kill_is_taken_over_and_reported(pg_url: str, etcd_endpoint: str) -> None:
    upgrade(pg_url)
    result = await measure_takeover(database_url=pg_url, etcd=etcd_endpoint, replicas=2,
                                    shards=8, experiments=16, kills=1, lease_ttl=2)  # fmt: skip
    assert result["kills"] == 1
    for measure in ("claimed", "fenced", "judged"):
        figures = result[measure]
        # the kill comes once every shard is held as assigned and fenced in SQL, so
        # nothing of the dead replica's moves before its lease runs out
        assert 0 < figures["min_s"] <= figures["p50_s"] <= figures["p95_s"] <= figures["max_s"]
        assert figures["max_s"] < 60
    assert set(result["runs"][0]) == {"claimed", "fenced", "judged"}
