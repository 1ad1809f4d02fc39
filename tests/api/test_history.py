"""GET /v1/experiments/{id}/history: the plots' series, on both backend sets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from controlplane.auth.roles import Role
from controlplane.history.metric_points import MetricPoint
from controlplane.history.points import HistoryPoint, VariantPoint
from controlplane.kernel.clock import FakeClock
from controlplane.runtime import Backends
from tests.support.auth import bearer

PROBLEM = "application/problem+json"


def variant(p95: float, rps: float = 10.0, shed_rps: float = 0.0) -> VariantPoint:
    return VariantPoint(
        count=int(rps * 30), rps=rps, failure_ratio=0.0, p50_ms=p95 / 2, p95_ms=p95, p99_ms=p95 * 2,
        shed=int(shed_rps * 30), shed_rps=shed_rps,
    )  # fmt: skip


def points(experiment_id: int, start: int, seconds: int) -> list[HistoryPoint]:
    return [
        HistoryPoint(
            experiment_id=experiment_id,
            at=start + i,
            span_sec=1,
            window_sec=30,
            canary_weight_bp=100,
            threshold_ms=250.0,
            failure_bound=0.25,
            baseline=variant(50.0, shed_rps=2.0 if i % 2 else 0.0),
            canary=variant(float(i % 100)),
        )
        for i in range(seconds)
    ]


async def test_a_day_of_seconds_comes_back_as_at_most_the_points_asked_for(
    client: httpx.AsyncClient,
    create: Callable[..., Any],
    backends: Backends,
    clock: FakeClock,
) -> None:
    created = await create()
    start = int(clock.now())
    await backends.history.append(points(created["id"], start, 86_400))
    clock.advance(86_400)

    body = (
        await client.get(f"/v1/experiments/{created['id']}/history", params={"points": 1000})
    ).json()

    assert body["bucket_sec"] == 87 and len(body["t"]) == 994
    assert all(b - a == 87 for a, b in zip(body["t"], body["t"][1:], strict=False))
    canary = body["variants"]["canary"]
    assert max(canary["p95_ms"]) == 99.0, "each bucket keeps its peak"
    assert set(body["threshold_ms"]) == {250.0}
    assert len(canary["rps"]) == len(body["t"]) == len(body["variants"]["baseline"]["p50_ms"])
    baseline = body["variants"]["baseline"]
    assert set(canary["shed_rps"]) == {0.0}, "shed is kept per variant"
    # every other second sheds 2/s: a full bucket's mean is 1/s (the last one is shorter)
    assert all(0.97 < r < 1.03 for r in baseline["shed_rps"][:-1]), "a bucket keeps the mean"
    assert all(29 <= n <= 31 for n in baseline["shed"][:-1])


async def test_a_short_range_is_served_second_by_second(
    client: httpx.AsyncClient,
    create: Callable[..., Any],
    backends: Backends,
    clock: FakeClock,
) -> None:
    created = await create()
    start = int(clock.now())
    await backends.history.append(points(created["id"], start, 300))

    body = (
        await client.get(
            f"/v1/experiments/{created['id']}/history",
            params={"from": start + 100, "to": start + 199, "points": 100},
        )
    ).json()

    assert body["bucket_sec"] == 1
    assert body["t"] == list(range(start + 100, start + 200))
    assert body["variants"]["canary"]["p95_ms"] == [float(i) for i in range(100)]
    assert set(body["span_sec"]) == {1}


async def test_a_poll_for_newer_points_gets_only_those(
    client: httpx.AsyncClient, create: Callable[..., Any], backends: Backends,
    clock: FakeClock,
) -> None:
    created = await create()
    start = int(clock.now())
    await backends.history.append(points(created["id"], start, 10))
    clock.advance(9)
    path = f"/v1/experiments/{created['id']}/history"

    tail = (await client.get(path, params={"from": start + 8})).json()
    ahead = await client.get(path, params={"from": start + 60})

    assert tail["t"] == [start + 8, start + 9]
    assert ahead.status_code == 200 and ahead.json()["t"] == []


async def test_the_marks_are_the_rollout_events_in_the_range(
    client: httpx.AsyncClient,
    create: Callable[..., Any],
    clock: FakeClock,
) -> None:
    created = await create()
    await client.post(f"/v1/experiments/{created['id']}/start")
    clock.advance(5)
    await client.post(
        f"/v1/experiments/{created['id']}/pause", json={"reason": "looking at the dashboard"}
    )
    clock.advance(5)

    body = (await client.get(f"/v1/experiments/{created['id']}/history")).json()

    assert [m["kind"] for m in body["marks"]] == ["start", "pause"]
    assert body["marks"][1]["reason"] == "looking at the dashboard"
    assert body["marks_total"] == 2 and body["t"] == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"points": 1001}, "points"),
        ({"points": 1}, "points"),
        ({"points": "many"}, "points"),
        ({"from": "yesterday"}, "from"),
        ({"from": 1_800_000_100, "to": 1_800_000_000}, "to"),
        ({"from": 1_800_000_001, "to": 1_800_000_000}, "to"),
        ({"from": 1_000_000_000, "to": 1_800_000_000}, "to"),
        ({"from": -5, "to": 1_800_000_000}, "from"),
    ],
)
async def test_bad_parameters_are_a_problem_naming_the_field(
    client: httpx.AsyncClient, create: Callable[..., Any], params: dict[str, Any], field: str
) -> None:
    created = await create()

    response = await client.get(f"/v1/experiments/{created['id']}/history", params=params)

    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    assert any(field in error["loc"] for error in response.json()["errors"])


async def test_an_unknown_experiment_is_a_404(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/experiments/987654/history")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith(PROBLEM)


async def test_a_viewer_may_read_the_history_and_nobody_without_a_token(
    client: httpx.AsyncClient, create: Callable[..., Any]
) -> None:
    created = await create()
    path = f"/v1/experiments/{created['id']}/history"

    assert (await client.get(path, headers=bearer(Role.VIEWER))).status_code == 200
    anonymous = await client.get(path, headers={"Authorization": ""})
    assert anonymous.status_code == 401
    assert anonymous.headers["content-type"].startswith(PROBLEM)


def readings(experiment_id: int, start: int, seconds: int, every: int) -> list[MetricPoint]:
    """A gauge read every `every` seconds, against the baseline + 10 %; the canary
    without data at every tenth reading."""
    return [
        MetricPoint(
            experiment_id=experiment_id,
            name="memory",
            at=start + i,
            span_sec=1,
            kind="gauge",
            compare="baseline",
            baseline=100.0,
            canary=None if (i // every) % 10 == 9 else float(i % 97),
            bound=110.0,
        )
        for i in range(0, seconds, every)
    ]


async def test_the_metrics_come_per_name_downsampled_like_the_windows(
    client: httpx.AsyncClient,
    create: Callable[..., Any],
    backends: Backends,
    clock: FakeClock,
) -> None:
    created = await create()
    start = int(clock.now())
    errors = [
        MetricPoint(created["id"], "errors", start + i, 1, "ratio", "absolute", 0.01, 0.02, 0.05)
        for i in range(0, 86_400, 60)
    ]
    await backends.history.append(
        points(created["id"], start, 600), readings(created["id"], start, 86_400, 15) + errors
    )
    clock.advance(86_400)

    body = (
        await client.get(f"/v1/experiments/{created['id']}/history", params={"points": 200})
    ).json()

    assert set(body["metrics"]) == {"memory", "errors"}
    memory = body["metrics"]["memory"]
    assert (memory["kind"], memory["compare"]) == ("gauge", "baseline")
    width = body["bucket_sec"]
    assert width == 433 and len(memory["at"]) <= 200
    assert all(b - a >= width - 15 for a, b in zip(memory["at"], memory["at"][1:], strict=False))
    for key in ("span_sec", "baseline", "canary", "bound"):
        assert len(memory[key]) == len(memory["at"])
    assert max(memory["canary"]) == 96.0, "a bucket keeps its peak"
    assert set(memory["bound"]) == {110.0}
    assert body["metrics"]["errors"]["bound"][0] == 0.05


async def test_a_short_range_serves_each_reading_with_its_gaps(
    client: httpx.AsyncClient,
    create: Callable[..., Any],
    backends: Backends,
    clock: FakeClock,
) -> None:
    created = await create()
    start = int(clock.now())
    await backends.history.append([], readings(created["id"], start, 300, 15))
    clock.advance(300)

    body = (
        await client.get(
            f"/v1/experiments/{created['id']}/history",
            params={"from": start, "to": start + 299, "points": 300},
        )
    ).json()

    memory = body["metrics"]["memory"]
    assert body["bucket_sec"] == 1 and body["t"] == []
    assert memory["at"] == list(range(start, start + 300, 15))
    assert memory["canary"][9] is None and memory["canary"][19] is None, "no data is a gap"
    assert memory["baseline"] == [100.0] * 20
    tail = (
        await client.get(f"/v1/experiments/{created['id']}/history", params={"from": start + 280})
    ).json()
    assert tail["metrics"]["memory"]["at"] == [start + 285]


async def test_an_experiment_without_provider_metrics_has_none(
    client: httpx.AsyncClient, create: Callable[..., Any]
) -> None:
    created = await create()
    body = (await client.get(f"/v1/experiments/{created['id']}/history")).json()
    assert body["metrics"] == {}
