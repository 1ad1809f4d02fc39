"""`canary bench scale --replicas`: its arguments and figures (pure), then its smallest
run (replica processes over PostgreSQL, etcd, Redis and a collector) with the JSON's
shape. Figures are sanity-checked, not judged: speed belongs to the recorded run."""

from __future__ import annotations

import pytest

from controlplane.benchmarks.scale_replicas import (
    FEED_TOTAL,
    MAX_REPLICAS,
    feed_samples,
    parse_replicas,
    run_replicas,
    spread,
)


@pytest.mark.parametrize(("text", "expected"), [("1,4", (1, 4)), (" 2 ", (2,)), ("4,1", (4, 1))])
def test_replica_counts_are_read_in_the_order_given(text: str, expected: tuple[int, ...]) -> None:
    assert parse_replicas(text) == expected


@pytest.mark.parametrize("text", ["0", str(MAX_REPLICAS + 1), "x", "1,,4", "-1", "4,4", ""])
def test_replica_counts_out_of_bounds_or_repeated_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--replicas"):
        parse_replicas(text)


@pytest.mark.parametrize(
    ("n", "expected"), [(1, FEED_TOTAL), (400, FEED_TOTAL // 400), (4_000, 2), (10_000, 1)]
)
def test_the_feed_shares_one_budget_and_gives_every_experiment_a_sample(
    n: int, expected: int
) -> None:
    assert feed_samples(n) == expected


def test_the_spread_is_max_over_mean_and_each_replica_against_one() -> None:
    figures = spread(
        [{"experiments_held": 90.0, "cpu_ms_per_evaluation": 0.6},
         {"experiments_held": 110.0, "cpu_ms_per_evaluation": 0.4}],
        one=0.5,
    )  # fmt: skip
    assert figures == {
        "experiments_max_over_mean": 1.1,
        "cpu_per_evaluation_mean_ms": 0.5,
        "cpu_per_evaluation_max_over_mean": 1.2,
        "cpu_per_evaluation_over_one_replica": [1.2, 0.8],
    }
    assert spread([{"experiments_held": 5.0, "cpu_ms_per_evaluation": 1.0}], None)[
        "cpu_per_evaluation_over_one_replica"
    ] is None


@pytest.mark.e2e
@pytest.mark.real
def test_the_smallest_run_reports_every_replica(pg_url: str) -> None:
    result = run_replicas(sizes=(12,), counts=(1, 2), seconds=2.0, progress=False,
                          server=pg_url)  # fmt: skip
    by_count = result["sizes"]["12"]
    one, two = by_count["replicas_1"], by_count["replicas_2"]
    assert [r["experiments_held"] for r in one["per_replica"]] == [12]
    # bounded loads: 256 shards over two replicas, 128 each; every experiment judged once
    assert [r["shards_held"] for r in two["per_replica"]] == [128, 128]
    assert sum(r["experiments_held"] for r in two["per_replica"]) == 12
    for run in (one, two):
        for replica in run["per_replica"]:
            assert replica["evaluations"] > 0 and replica["cpu_ms_per_evaluation"] > 0
            assert replica["rounds_per_s"] > 0
    assert one["spread"]["cpu_per_evaluation_over_one_replica"] == [1.0]
    assert len(two["spread"]["cpu_per_evaluation_over_one_replica"]) == 2
