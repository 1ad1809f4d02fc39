"""GET /v1/services/{service}/rule/recommendation, from the collectors' real history."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest

from controlplane.controller.reconciler import RouteReconciler
from controlplane.decision.recommend import (
    BaselineWindow,
    NotEnoughHistory,
    baseline_windows,
    quantile,
    recommend,
)
from controlplane.kernel.clock import FakeClock
from controlplane.runtime import Backends
from tests.api.conftest import experiment_body
from tests.api.traffic import collecting

WINDOW_SEC = 5


async def start(
    client: httpx.AsyncClient, backends: Backends, service: str, **rule: Any
) -> int:
    if rule:
        response = await client.put(f"/v1/services/{service}/rule", json=rule)
        assert response.status_code == 200, response.text
        # the leader publishes the rule where the collectors read it
        assert not await RouteReconciler().reconcile(backends, None)
    created = (await client.post("/v1/experiments", json=experiment_body(service=service))).json()
    assert (await client.post(f"/v1/experiments/{created['id']}/start")).status_code == 200
    experiment_id: int = created["id"]
    return experiment_id


async def test_recommendation_is_the_p95_of_the_baselines_window_p95s_times_1_25(
    stream_client: httpx.AsyncClient, stream_backends: Backends, clock: FakeClock
) -> None:
    rule = {"threshold_ms": 900, "window_sec": WINDOW_SEC, "min_samples": 100}
    ours = await start(stream_client, stream_backends, "reco-api", **rule)
    theirs = await start(stream_client, stream_backends, "other-api", **rule)
    rng = np.random.default_rng(5)
    raw_ts, raw_rt, raw_failed = [], [], []
    async with collecting(stream_backends, clock) as traffic:
        for _ in range(56):
            # a baseline whose latency and errors drift, so the windows differ
            sent = await traffic.second(
                "reco-api", ours, median_ms={"baseline": float(rng.uniform(30, 60)), "canary": 45},
                failure_rate=float(rng.uniform(0, 0.04)),
            )  # fmt: skip
            raw_ts.append(sent.ts["baseline"])
            raw_rt.append(sent.rt_ms["baseline"])
            raw_failed.append(sent.failed["baseline"])
            await traffic.second(
                "other-api", theirs, median_ms={"baseline": 400}, advance=False
            )

    response = await stream_client.get(
        "/v1/services/reco-api/rule/recommendation", params={"windows": True}
    )

    assert response.status_code == 200, response.text
    body = response.json()
    windows = body["per_window"]
    assert body["windows"] == len(windows) == 12  # ends at 56, 51, …, 1: five seconds apart
    assert body["experiments"] == [str(ours)], "another service's windows are not used"
    assert body["window_sec"] == [WINDOW_SEC] and body["percentile"] == 95
    ends = [w["ts"] for w in windows]
    assert np.all(np.diff(ends) >= WINDOW_SEC), "kept windows must not overlap"

    # every window's numbers are those of the samples the test sent in it
    ts, rt, failed = np.concatenate(raw_ts), np.concatenate(raw_rt), np.concatenate(raw_failed)
    for window in windows:
        assert window["window_end"] - window["window_start"] <= WINDOW_SEC
        inside = (ts >= window["window_start"]) & (ts < window["window_end"])
        assert window["count"] == int(inside.sum())
        assert window["failures"] == int(failed[inside].sum())
        exact = np.percentile(rt[inside], 95, method="inverted_cdf")
        assert window["latency_ms"] == pytest.approx(exact, rel=0.02)

    # and the proposal is numpy's arithmetic on those per-window values
    p95s = np.array([w["latency_ms"] for w in windows])
    ratios = np.array([w["failure_ratio"] for w in windows])
    assert body["threshold_ms"] == pytest.approx(np.percentile(p95s, 95) * 1.25, abs=0.1)
    assert body["threshold_ms"] >= np.percentile(p95s, 95) * 1.25, "rounded up, never down"
    expected_ratio = min(max(np.percentile(ratios, 95) * 2, 0.01), 1.0)
    assert body["failure_ratio"] == pytest.approx(expected_ratio, abs=1e-4)
    summary = body["latency"]["summary"]
    assert summary["count"] == 12
    assert summary["min"] == pytest.approx(p95s.min())
    assert summary["median"] == pytest.approx(np.median(p95s))
    assert summary["p95"] == pytest.approx(np.percentile(p95s, 95))
    assert summary["max"] == pytest.approx(p95s.max())
    assert body["latency"]["multiplier"] == 1.25 and body["failures"]["multiplier"] == 2.0
    assert body["current"] == {"threshold_ms": 900, "failure_ratio": 0.3}
    assert body["ready"] is True

    # the other service's proposal comes from its own (much slower) baseline
    other = (await stream_client.get("/v1/services/other-api/rule/recommendation")).json()
    assert other["experiments"] == [str(theirs)]
    assert other["threshold_ms"] > 400 * 1.25 > body["threshold_ms"]
    assert "per_window" not in other, "the per-window list only when asked for"


async def test_too_little_history_is_a_409_saying_found_and_needed(
    stream_client: httpx.AsyncClient, stream_backends: Backends, clock: FakeClock
) -> None:
    experiment = await start(
        stream_client, stream_backends, "young-api",
        threshold_ms=900, window_sec=WINDOW_SEC, min_samples=100,
    )
    async with collecting(stream_backends, clock) as traffic:
        for _ in range(12):
            await traffic.second("young-api", experiment, median_ms={"baseline": 40})

    response = await stream_client.get("/v1/services/young-api/rule/recommendation")

    assert response.status_code == 409
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "urn:canary:problem:insufficient-history"
    assert (problem["windows_found"], problem["windows_needed"]) == (3, 10)
    assert "found 3" in problem["detail"] and "at least 10" in problem["detail"]

    unknown = await stream_client.get("/v1/services/never-ran/rule/recommendation")
    assert unknown.status_code == 409 and unknown.json()["windows_found"] == 0

    # a page that polls asks for the same answer as a 200: not ready, what is missing
    polled = await stream_client.get(
        "/v1/services/young-api/rule/recommendation", params={"partial": True, "windows": True}
    )
    assert polled.status_code == 200, polled.text
    assert polled.json() == {
        "ready": False, "service": "young-api", "windows_found": 3, "windows_needed": 10,
        "detail": problem["detail"],
    }  # fmt: skip


def entry(experiment: str, ts: float, count: int, p95: float | None) -> dict[str, str]:
    baseline = {"count": count, "failures": count // 50, "p95_ms": p95, "p99_ms": None}
    return {
        "kind": "snapshot", "experiment": experiment, "ts": repr(ts),
        "window_sec": str(WINDOW_SEC), "variants": json.dumps({"baseline": baseline}),
    }  # fmt: skip


def test_windows_skip_other_experiments_small_counts_overlaps_and_garbage() -> None:
    entries = [
        entry("1", 100.0, 500, 40.0),
        entry("1", 99.0, 500, 41.0),  # overlaps the window ending at 100
        entry("2", 95.0, 500, 42.0),  # another service's experiment
        entry("1", 95.0, 20, 43.0),  # too few samples for a percentile
        entry("1", 94.5, 500, None),  # an empty percentile
        {"kind": "snapshot", "experiment": "1", "ts": "oops"},
        entry("1", 94.0, 500, 44.0),
        entry("1", 89.0, 500, 45.0),
    ]

    kept = baseline_windows(entries, {"1"}, percentile=95, min_samples=100)

    assert [(w.ts, w.latency_ms) for w in kept] == [(89.0, 45.0), (94.0, 44.0), (100.0, 40.0)]
    assert baseline_windows(entries, {"1"}, percentile=95, min_samples=100, limit=2)[0].ts == 94


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], list(range(37))])
@pytest.mark.parametrize("q", [0, 5, 50, 95, 100])
def test_quantile_is_numpys_linear_percentile(values: list[float], q: float) -> None:
    assert quantile(values, q) == pytest.approx(np.percentile(values, q))


def test_a_baseline_that_never_fails_proposes_the_failure_floor() -> None:
    windows = [
        BaselineWindow("1", i * 5.0, 5, i * 5.0 - 5, i * 5.0, 1000, 0, 40.0 + i) for i in range(10)
    ]

    proposal = recommend("svc", windows, percentile=95, min_samples=100)

    assert proposal.failure_ratio == 0.01
    assert proposal.threshold_ms == pytest.approx(np.percentile(range(40, 50), 95) * 1.25, abs=0.1)
    with pytest.raises(NotEnoughHistory) as caught:
        recommend("svc", windows[:9], percentile=95, min_samples=100)
    assert (caught.value.found, caught.value.needed) == (9, 10)
