from __future__ import annotations

from typing import Any

import pytest

from controlplane.benchmarks.decision import SCENARIOS, SECTIONS, parse_sections, run
from controlplane.cli.bench import BENCHMARKS, merge_results


def test_decision_benchmark_is_registered() -> None:
    assert BENCHMARKS["decision"] == "controlplane.benchmarks.decision:run"


@pytest.mark.slow
@pytest.mark.timeout(900)  # the whole quick benchmark: two minutes of one core, idle
def test_quick_decision_benchmark_reports_rates_and_detection_times(
    quick_decision_report: dict[str, Any],
) -> None:
    # the report as saved: JSON, no NaN or infinity (conftest.py)
    result = quick_decision_report
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


def test_sections_are_picked_by_name_and_unknown_ones_refused() -> None:
    assert parse_sections(None) == frozenset(SECTIONS)
    assert parse_sections("srm_clustered, detection_clustered") == {
        "srm_clustered",
        "detection_clustered",
    }
    for bad in ("nope", "", "aa,nope"):
        with pytest.raises(ValueError, match="section"):
            parse_sections(bad)


def test_a_partial_run_holds_only_its_sections_and_merges_into_a_saved_run() -> None:
    partial = run(quick=True, progress=False, only="srm_clustered")
    assert partial["sections"] == ["srm_clustered"]
    assert "aa" not in partial and "detection" not in partial
    real = partial["srm_clustered"]["real_srm_zipf_1"]
    assert real["runs"] == 3 and 0 <= real["detected"] <= 3
    # no clustered A/A ran, so no false-warning figure is claimed
    assert "false_warnings" not in partial["srm_clustered"]
    saved = {
        "aa": {"absolute": {"runs": 400}},
        "srm_clustered": {"aa_runs": 1600, "false_warnings": 0, "real_srm_zipf_1": {"runs": 400}},
    }
    merged = merge_results(saved, partial)
    assert merged["aa"] == saved["aa"]
    assert merged["srm_clustered"]["aa_runs"] == 1600
    assert merged["srm_clustered"]["real_srm_zipf_1"] == real
