"""`canary bench sidecar-resources`: how measured figures become a container's resources,
the /proc readings they come from, and the sidecar every manifest adds sized by the
recorded run (bench/results/sidecar-resources.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from controlplane.benchmarks.sidecar_resources import cpu_seconds, memory_kib, recommend
from controlplane.injection.sidecar_container import RESOURCES

RESULT = Path(__file__).resolve().parents[2] / "bench" / "results" / "sidecar-resources.json"


@pytest.mark.parametrize(
    ("cores", "pss_mib", "requests", "limits"),
    [
        (0.0896, 65.5, {"cpu": "140m", "memory": "96Mi"}, {"cpu": "1", "memory": "192Mi"}),
        (0.0, 10.0, {"cpu": "50m", "memory": "16Mi"}, {"cpu": "1", "memory": "32Mi"}),
        (0.5, 200.0, {"cpu": "750m", "memory": "256Mi"}, {"cpu": "1", "memory": "512Mi"}),
        (0.1, 51.2, {"cpu": "150m", "memory": "64Mi"}, {"cpu": "1", "memory": "128Mi"}),
    ],
    ids=["recorded", "idle-floor", "busy", "exact-steps"],
)
def test_requests_carry_headroom_rounded_up_and_limits_follow(
    cores: float, pss_mib: float, requests: dict[str, str], limits: dict[str, str]
) -> None:
    found = recommend(cores, pss_mib)
    assert found["requests"] == requests
    assert found["limits"] == limits
    assert found["workers"] == 1


def test_the_readings_of_a_live_process_are_plausible() -> None:
    burn = sum(i * i for i in range(200_000))  # some CPU time for this process
    assert burn > 0
    assert cpu_seconds([os.getpid()]) > 0
    pss, rss = memory_kib([os.getpid()])
    assert 0 < pss <= rss
    assert memory_kib([2**22 + 1]) == (0, 0)  # a process that is gone counts nothing


def test_the_sidecar_is_sized_by_the_recorded_run() -> None:
    """Re-running the benchmark and saving it changes what `canary inject` and the
    patch request: this fails until they are updated together."""
    recorded = json.loads(RESULT.read_text())
    assert not recorded["quick"]
    sizing = next(run for run in recorded["runs"] if run["rate_rps"] == 1000)
    assert sizing["errors"] == 0
    expected = recommend(sizing["cores"], max(r["peak_pss_mib"] for r in recorded["runs"]))
    assert recorded["recommended"] == expected
    assert expected["requests"] == RESOURCES["requests"]
    assert expected["limits"] == RESOURCES["limits"]
