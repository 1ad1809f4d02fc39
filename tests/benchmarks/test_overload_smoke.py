"""`canary bench overload` in tiny durations: every part runs (the upstream, the sidecar
with its etcd config, the generator, the step change) and the JSON has its shape. The
figures are not checked: on a shared machine they belong to the recorded full run."""

from __future__ import annotations

import json

import pytest

from controlplane.benchmarks import overload, overload_tuning
from controlplane.benchmarks.overload import LOADS, Durations, run
from controlplane.cli.bench import BENCHMARKS

pytestmark = [pytest.mark.e2e, pytest.mark.real]

TINY = Durations(warmup_s=0.2, measure_s=0.5, step_before_s=0.5, step_after_s=0.6)
FIGURES = {
    "load", "offered_rps", "achieved_rps", "sent", "send_lag_p99_ms", "goodput_rps",
    "goodput_share", "admitted_p50_ms", "admitted_p99_ms", "shed", "shed_by_reason",
    "status", "timeouts", "errors", "started_late_s", "sidecar_limit_at_end",
}  # fmt: skip


def test_the_overload_benchmark_is_registered() -> None:
    assert BENCHMARKS["overload"] == "controlplane.benchmarks.overload:run"


def test_a_tiny_run_reports_every_load_both_ways_and_the_step(
    etcd_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANARY_BENCH_ETCD", etcd_endpoint)
    result = run(quick=True, progress=False, durations=TINY)
    json.dumps(result, allow_nan=False)
    assert result["benchmark"] == "overload"
    assert result["setup"]["capacity_rps"] == 800
    assert set(result["unloaded"]) >= FIGURES
    for mode in ("off", "on"):
        assert set(result["runs"][mode]) == {f"{load:g}x" for load in LOADS}
        for figures in result["runs"][mode].values():
            assert set(figures) >= FIGURES, set(figures) ^ FIGURES
            assert figures["sent"] > 0
    assert result["runs"]["off"]["4x"]["sidecar_limit_at_end"] is None  # protection off
    assert result["runs"]["on"]["4x"]["sidecar_limit_at_end"]["limit"] >= 1
    step = result["step"]
    assert step["concurrency"] == [8, 4]
    assert step["trace"] and {"t", "limit", "estimate", "phase"} <= set(step["trace"][0])
    assert {"first_in_band_s", "settled_in_band_s", "settled_mean_in_band_s", "band"} <= set(step)
    targets = result["targets"]
    verdicts = ("goodput_ok", "admitted_p99_ok", "half_load_ok", "adapt_ok")
    for verdict in (*verdicts, "adapt_every_sample_ok"):
        assert isinstance(targets[verdict], bool)
    assert isinstance(result["notes"], list)
    assert targets["accounting_leak"] is False  # the sidecar's counts are back to 0
    assert {"in_flight", "queued"} == set(result["runs"]["on"]["4x"]["after_idle"])


def test_the_tuning_comparison_runs_every_variant(
    etcd_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANARY_BENCH_ETCD", etcd_endpoint)
    result = overload_tuning.run(quick=True, progress=False, reps=1, durations=TINY)
    json.dumps(result, allow_nan=False)
    assert BENCHMARKS["overload-tuning"] == "controlplane.benchmarks.overload_tuning:run"
    assert set(result["queue"]["by_load"]) == {"1x", "2x", "4x"}
    for by_variant in result["queue"]["by_load"].values():
        assert set(by_variant) == {name for name, _ in overload_tuning.QUEUE_VARIANTS}
        assert all(len(v["runs"]) == 1 for v in by_variant.values())
    assert set(result["step"]["runs"]) == {name for name, _ in overload_tuning.STEP_VARIANTS}
    assert overload.PROTECTION == {}  # the shipped defaults again
