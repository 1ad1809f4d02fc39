"""`canary bench scale` at its smallest: every part runs (experiments in SQLite, signed
batches through Redis to a collector process, controller rounds both ways, a trip
reaching a sidecar's route table through etcd, watcher processes) and the JSON has its
shape. The figures are sanity-checked, not judged: speed belongs to the recorded run."""

from __future__ import annotations

import json

import pytest

from controlplane.benchmarks.scale import QUICK, ScaleRun, growth, narrowed, run
from controlplane.cli.bench import BENCHMARKS

pytestmark = [pytest.mark.e2e, pytest.mark.real]

SMALLEST = ScaleRun(sizes=(3,), watchers=(4,), ingest_samples=3_000, tick_rounds=2, warm_sec=1.0,
                    trips=1, route_puts=2, collectors=2)  # fmt: skip


def test_the_scale_benchmark_is_registered() -> None:
    assert BENCHMARKS["scale"] == "controlplane.benchmarks.scale:run"


@pytest.mark.parametrize(
    ("per_n", "expected"),
    [
        ({10: {"a": 2.0}, 100: {"a": 2.0}}, {"a": {"10": 1.0, "100": 1.0}}),
        ({10: {"a": 2.0}, 100: {"a": 5.0}}, {"a": {"10": 1.0, "100": 2.5}}),
        ({100: {"a": 4.0}, 10: {"a": 8.0, "b": 0.0}}, {"a": {"10": 1.0, "100": 0.5}}),
        ({}, {}),
    ],
    ids=["flat", "grows", "smallest-first-and-zero-skipped", "empty"],
)
def test_growth_is_each_per_unit_figure_over_the_smallest_ns(
    per_n: dict[int, dict[str, float]], expected: dict[str, dict[str, float]]
) -> None:
    assert growth(per_n) == expected


@pytest.mark.parametrize(
    ("only", "sizes", "watchers", "collectors"),
    [
        ("1000", (1000,), (), QUICK.collectors),
        ("100, 1000,watch", (100, 1000), QUICK.watchers, QUICK.collectors),
        ("watch,collectors=3", QUICK.sizes, QUICK.watchers, 3),
        ("collectors=1", QUICK.sizes, (), 1),
    ],
)
def test_only_picks_the_sizes_the_fan_out_and_the_collectors(
    only: str, sizes: tuple[int, ...], watchers: tuple[int, ...], collectors: int
) -> None:
    plan = narrowed(QUICK, only)
    assert (plan.sizes, plan.watchers, plan.collectors) == (sizes, watchers, collectors)
    assert plan.ingest_samples == QUICK.ingest_samples


@pytest.mark.parametrize("only", ["0", "10001", "ten", "collectors=0", "collectors=9", "watchers"])
def test_only_refuses_what_it_does_not_know_or_cannot_bound(only: str) -> None:
    with pytest.raises(ValueError, match="scale --only"):
        narrowed(QUICK, only)


def test_the_smallest_run_reports_every_part(
    etcd_endpoint: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANARY_BENCH_ETCD", etcd_endpoint)
    monkeypatch.setenv("CANARY_BENCH_REDIS", redis_url)
    result = run(quick=True, progress=False, plan=SMALLEST)
    json.dumps(result, allow_nan=False)
    assert result["benchmark"] == "scale"
    assert set(result["sizes"]) == {"3"} and set(result["watch"]) == {"4"}
    size = result["sizes"]["3"]

    collector = size["collector"]
    assert collector["samples"] == 3_000  # 1,000 per experiment
    assert collector["publishes"] >= 3, "every experiment's window was published"
    assert collector["cpu_s"] >= 0 and collector["steady"]["samples_per_experiment_s"] > 0
    # the smallest run's steady span is short: it may hold no publish (then the CPU
    # per publish is over one)
    assert collector["steady"]["publishes_per_s"] >= 0
    assert collector["steady"]["cpu_ms_per_publish"] >= 0
    assert "collector_steady_cpu_ms_per_publish" in result["per_unit"]["3"]
    assert size["redis"]["stats_bytes_per_experiment"] > 0
    assert size["redis"]["stream_bytes_per_service"] > 0
    assert size["redis"]["steady"]["stats_bytes_per_experiment"] > 0

    tick = size["tick"]
    assert tick["evaluated_per_round"] == 3, "every running experiment is evaluated"
    assert set(tick["first_round_ms"]) == {"retention_all", "retention_bounded"}
    for mode in ("batched", "one_by_one", "batched_in_a_row"):
        assert tick[mode]["round_ms"] > 0 and tick[mode]["round_cpu_ms"] > 0
        assert tick[mode]["ms_per_experiment"] == pytest.approx(tick[mode]["round_ms"] / 3,
                                                                abs=0.01)  # fmt: skip

    trip = size["trip"]
    assert trip["trips"] == 1 and trip["missed"] == 0
    assert trip["leader_rounds_to_sql"] > 0
    # the sidecar sees the cut after the database holds the trip
    assert trip["to_sidecar_route"]["p50_ms"] >= trip["to_sql"]["p50_ms"] > 0
    # the leader's admin listener answered its probes throughout
    assert trip["leader_admin"]["n"] > 0 and trip["leader_admin"]["missed"] == 0
    # trip by trip, as many as the summary counts
    assert len(trip["each_ms"]["to_sql"]) == trip["to_sql"]["n"]
    assert len(trip["each_ms"]["to_sidecar_route"]) == trip["to_sidecar_route"]["n"]
    # each path's own figures, which together are the whole
    paths = trip["leader_admin"]["by_path"]
    assert set(paths) == {"/healthz", "/metrics"}
    assert sum(p["n"] for p in paths.values()) == trip["leader_admin"]["n"]
    assert size["collector"]["admin"]["missed"] == 0

    several = size["several"]
    assert several["collectors"] == 2
    assert several["steady"]["cpu_s_per_s"] >= 0 and several["steady"]["publishes_per_s"] >= 0
    # the second trip is another experiment's, judged with both collectors running
    assert several["trip"]["trips"] == 1 and several["trip"]["missed"] == 0

    watch = result["watch"]["4"]
    assert watch["applied"] == 4 * 2 and watch["missed"] == 0
    assert 0 <= watch["put_to_applied"]["p50_ms"] <= watch["put_to_applied"]["p99_ms"]

    # a figure that measured zero (CPU below the clock tick) has no ratio
    assert set(result["growth"]) <= set(result["per_unit"]["3"])
    assert "tick_cpu_ms_per_experiment" in result["growth"]
    assert result["per_unit"]["3"]["tick_in_a_row_cpu_ms_per_experiment"] > 0
    assert all(row == {"3": 1.0} for row in result["growth"].values())
    assert len(result["load_avg"]["before"]) == 3
