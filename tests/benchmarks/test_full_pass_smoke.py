"""`canary bench full-pass` on a few services: both ways run, on real etcd, and report
their figures. The figures are not checked: they belong to the recorded run."""

from __future__ import annotations

import asyncio
import json

import pytest

from controlplane.benchmarks import full_pass
from controlplane.cli.bench import BENCHMARKS

pytestmark = [pytest.mark.e2e, pytest.mark.real]


def test_the_full_pass_benchmark_is_registered() -> None:
    assert BENCHMARKS["full-pass"] == "controlplane.benchmarks.full_pass:run"


def test_a_tiny_run_times_every_trip_both_ways(
    etcd_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(full_pass, "FULL_PASS_SEC", 0.5)
    result = asyncio.run(full_pass._measure(6, 2, etcd_endpoint, progress=False))
    json.dumps(result, allow_nan=False)
    for way in ("ahead", "after_pass"):
        figures = result[way]
        assert figures["trips"] == 2
        assert len(figures["commit_to_route_each_ms"]) == 2
        assert 0 < figures["commit_to_route_p50_ms"] <= figures["commit_to_route_max_ms"]
        assert 0 <= figures["committed_during_a_full_pass"] <= 2
        assert figures["full_pass_s_median"] > 0
    assert result["full_pass_cpu_ms"] > 0
