"""`canary bench decision-metrics`: its pieces on a few seeds (shape and sense, not speed)."""

from __future__ import annotations

from controlplane.benchmarks import decision_metrics as bench
from controlplane.kernel.routes import BASELINE, CANARY
from controlplane.providers.evidence import MetricEvidence


def test_an_aa_schedule_with_the_metric_judged_every_look_is_promoted() -> None:
    result = bench.aa_run((bench.METRIC_SEED, 5.0))
    assert result["promoted"] and not result["tripped"], result


def test_a_canary_whose_own_error_share_rises_is_cut_by_the_metric() -> None:
    found = [bench.detection_run((bench.DETECTION_SEED + i, 5.0, 0.2)) for i in range(3)]
    assert all(r["cut_after_s"] is not None and not r["before_onset"] for r in found), found
    assert all("error_ratio" in r["tripped_by"] for r in found), found


def test_the_board_is_read_once_per_interval_and_counts_the_window() -> None:
    import numpy as np

    counters = bench.ServiceCounters(np.random.default_rng(1), 5.0, 10)
    for tick in range(80):  # 20 s at 100 % baseline, 0 % canary
        counters.generate(tick * 0.25, (tick + 1) * 0.25, 0)
    first = counters.read(20.0)["error_ratio"]
    assert isinstance(first, MetricEvidence) and first.read_at == 20.0
    assert counters.read(24.9)["error_ratio"] is first  # cached until the next read
    assert counters.read(25.0)["error_ratio"].read_at == 25.0
    assert first.canary.no_data and not first.baseline.no_data
    assert first.baseline.total is not None and 1500 < first.baseline.total < 2500
    assert {BASELINE, CANARY} == set(counters.share)
