"""POST /v1/judge: a one-shot judgment over HTTP, strict about what it is given."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from controlplane.api.routes.judge import MAX_SAMPLES

BASELINE = [1.0, 2.0, 3.0, 4.0]
SLOWER = [10.0, 20.0, 30.0, 40.0]


async def test_a_slower_canary_is_high_with_the_numbers_behind_it(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/judge",
        json={"baseline": BASELINE, "canary": SLOWER, "direction": "either", "confidence": 0.95},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["classification"] == "high"
    latency = body["metrics"]["latency"]
    assert latency["classification"] == "high"
    evidence = latency["evidence"]
    # by hand: the 16 differences are 6..9, 16..19, 26..29, 36..39
    assert (evidence["interval_low"], evidence["interval_high"]) == (6.0, 39.0)
    assert evidence["shift_estimate"] == 22.5
    assert evidence["tolerance_bound"] == pytest.approx(0.25 * 22.5)
    assert evidence["mean_ratio"] == pytest.approx(25 / 2.5)
    assert evidence["effect_kind"] == "mean_ratio" and evidence["effect_max"] == 1.0


async def test_direction_decrease_and_failures(client: httpx.AsyncClient) -> None:
    body = {
        "baseline": SLOWER,
        "canary": BASELINE,
        "direction": "decrease",
        "confidence": 0.975,
        "failures": {"baseline": [10, 1000], "canary": {"failures": 60, "count": 1000}},
    }
    response = await client.post("/v1/judge", json=body)
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["metrics"]["latency"]["classification"] == "low"
    assert got["metrics"]["failures"]["classification"] == "high"
    assert got["classification"] == "high"  # high outranks low
    assert got["metrics"]["failures"]["evidence"]["canary_ratio"] == 0.06


async def test_nodata_when_a_side_is_empty(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/judge", json={"baseline": [], "canary": [1.0]})
    assert response.status_code == 200
    assert response.json()["classification"] == "nodata"


async def test_effect_gate_and_min_samples(client: httpx.AsyncClient) -> None:
    body = {
        "baseline": BASELINE,
        "canary": SLOWER,
        "effect": {"kind": "cles", "max": 0.9},
        "min_samples": 4,
    }
    got = (await client.post("/v1/judge", json=body)).json()
    assert got["metrics"]["latency"]["evidence"]["effect_size"] == 1.0
    assert got["classification"] == "high"
    body["min_samples"] = 5
    assert (await client.post("/v1/judge", json=body)).json()["classification"] == "nodata"


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"baseline": [-1.0], "canary": [1.0]}, ["body", "baseline", 0]),
        ({"baseline": ["5"], "canary": [1.0]}, ["body", "baseline", 0]),
        ({"baseline": [1e10], "canary": [1.0]}, ["body", "baseline", 0]),
        ({"baseline": [1.0], "canary": [1.0], "confidence": 1.0}, ["body", "confidence"]),
        ({"baseline": [1.0], "canary": [1.0], "direction": "up"}, ["body", "direction"]),
        ({"baseline": [1.0], "canary": [1.0], "extra": 1}, ["body", "extra"]),
        ({"baseline": [1.0]}, ["body", "canary"]),
        (
            {"baseline": [1.0], "canary": [1.0], "effect": {"kind": "cles", "max": 2}},
            ["body", "effect"],
        ),
        (
            {
                "baseline": [1.0],
                "canary": [1.0],
                "failures": {"baseline": [5, 4], "canary": [0, 1]},
            },
            ["body", "failures", "baseline"],
        ),
        (
            {"baseline": [1.0], "canary": [1.0], "failures": {"baseline": [1], "canary": [0, 1]}},
            ["body", "failures", "baseline"],
        ),
        (
            {
                "baseline": [1.0],
                "canary": [1.0],
                "failures": {"baseline": [0, 1.5], "canary": [0, 1]},
            },
            ["body", "failures", "baseline", "count"],
        ),
    ],
)
async def test_bad_input_is_a_problem_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], loc: list[Any]
) -> None:
    response = await client.post("/v1/judge", json=body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["type"] == "urn:canary:problem:validation-failed"
    assert any(e["loc"][: len(loc)] == loc for e in problem["errors"]), problem["errors"]


async def test_non_finite_numbers_and_broken_json_are_refused(client: httpx.AsyncClient) -> None:
    headers = {"content-type": "application/json"}
    for raw in (b'{"baseline": [NaN], "canary": [1]}', b'{"baseline": [Infinity], "canary": [1]}'):
        response = await client.post("/v1/judge", content=raw, headers=headers)
        assert response.status_code == 422, raw
        assert response.json()["errors"][0]["loc"][:2] == ["body", "baseline"]
    broken = await client.post("/v1/judge", content=b'{"baseline": [1,', headers=headers)
    assert broken.status_code == 422


async def test_more_than_the_sample_bound_is_refused(client: httpx.AsyncClient) -> None:
    body = {"baseline": [1.0] * (MAX_SAMPLES + 1), "canary": [1.0]}
    response = await client.post("/v1/judge", json=body)
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["body", "baseline"]


async def test_full_sample_sets_fit_the_judges_own_body_limit(client: httpx.AsyncClient) -> None:
    """Two sets at the bound are megabytes of JSON: the judge takes them, while every
    other route keeps the API's body limit."""
    rng = random.Random(7)
    body = {
        "baseline": [round(rng.uniform(50, 150), 3) for _ in range(MAX_SAMPLES)],
        "canary": [round(rng.uniform(50, 150), 3) for _ in range(MAX_SAMPLES)],
    }
    raw = json.dumps(body).encode()
    assert len(raw) > 1024 * 1024  # over the default limit of every other route
    response = await client.post(
        "/v1/judge", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["classification"] == "pass"
    elsewhere = await client.post(
        "/v1/experiments", content=raw, headers={"content-type": "application/json"}
    )
    assert elsewhere.status_code == 413
    assert elsewhere.headers["content-type"].startswith("application/problem+json")
