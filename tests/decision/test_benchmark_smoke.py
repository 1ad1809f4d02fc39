from __future__ import annotations

import json

from controlplane.benchmarks.decision import SCENARIOS, run
from controlplane.cli.bench import BENCHMARKS


def test_decision_benchmark_is_registered() -> None:
    assert BENCHMARKS["decision"] == "controlplane.benchmarks.decision:run"


def test_quick_decision_benchmark_reports_rates_and_detection_times() -> None:
    result = run(quick=True, progress=False)
    json.dumps(result, allow_nan=False)
    assert result["aa_runs"] > 0
    assert 0.0 <= result["false_trip_rate"] <= 1.0
    for mode in result["aa"].values():
        assert 0.0 <= mode["false_trip_rate"]["rate"] <= 1.0
        assert 0.0 <= mode["naive_alarm_rate"] <= 1.0
    assert set(result["detection"]) == set(SCENARIOS)
    for name in SCENARIOS:
        times = result["detection"][name]
        assert {"median_s", "p95_s", "runs"} <= set(times)
        assert times["runs"] > 0
        if times["median_s"] is not None:
            assert 0.0 <= times["median_s"] <= times["p95_s"]
        flagger = result["flagger_reference_s"][name]
        assert flagger["median_s"] is None or flagger["median_s"] >= 60.0
    assert result["rule"]["window_sec"] == 10
