"""/v1/experiments: definition, validation and problem+json, on both backend sets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.api.conftest import experiment_body

PROBLEM = "application/problem+json"
Create = Callable[..., Any]


def field_paths(problem: dict[str, Any]) -> list[str]:
    return [".".join(str(p) for p in e["loc"]) for e in problem["errors"]]


async def test_create_answers_201_with_location_and_a_draft(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/experiments", json=experiment_body())
    assert response.status_code == 201
    created = response.json()
    assert response.headers["location"] == f"/v1/experiments/{created['id']}"
    assert created["state"] == "draft"
    assert created["current_step"] == -1
    assert created["canary_weight_bp"] == 0
    assert created["breaker_state"] == "closed"
    assert len(created["salt"]) >= 8
    assert [s["weight_pct"] for s in created["steps"]] == [1, 5, 25, 100]

    fetched = await client.get(response.headers["location"])
    assert fetched.status_code == 200
    detail_only = ("live", "route_applied", "route_note", "route_confirmation")
    assert {k: v for k, v in fetched.json().items() if k not in detail_only} == created


async def test_inline_rule_takes_the_experiments_service(client: httpx.AsyncClient) -> None:
    body = experiment_body(rule={"threshold_ms": 500, "percentile": 99})
    response = await client.post("/v1/experiments", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["rule"]["service"] == "payment-api"
    assert response.json()["rule"]["threshold_ms"] == 500


async def test_list_filters_by_service_and_state_and_pages_with_a_total(
    client: httpx.AsyncClient, create: Create
) -> None:
    for i in range(3):
        await create(name=f"a{i}", service="alpha")
    started = await create(name="b0", service="beta")
    await create(name="b1", service="beta")
    assert (await client.post(f"/v1/experiments/{started['id']}/start")).status_code == 200

    page = (await client.get("/v1/experiments", params={"limit": 2})).json()
    assert page["total"] == 5 and len(page["items"]) == 2 and page["limit"] == 2
    rest = (await client.get("/v1/experiments", params={"limit": 2, "offset": 4})).json()
    assert len(rest["items"]) == 1
    ids = [e["id"] for e in page["items"]] + [e["id"] for e in rest["items"]]
    assert ids == sorted(ids, reverse=True)  # newest first

    alpha = (await client.get("/v1/experiments", params={"service": "alpha"})).json()
    assert alpha["total"] == 3 and {e["service"] for e in alpha["items"]} == {"alpha"}
    running = (await client.get("/v1/experiments", params={"state": "running"})).json()
    assert [e["id"] for e in running["items"]] == [started["id"]]
    beta_drafts = (
        await client.get("/v1/experiments", params={"service": "beta", "state": "draft"})
    ).json()
    assert beta_drafts["total"] == 1

    bad = await client.get("/v1/experiments", params={"state": "exploded", "limit": 0})
    assert bad.status_code == 422
    assert {"query.state", "query.limit"} <= set(field_paths(bad.json()))


async def test_invalid_body_answers_422_problem_naming_the_field(
    client: httpx.AsyncClient,
) -> None:
    steps = [{"weight_pct": 5, "hold_sec": 60}, {"weight_pct": 0, "hold_sec": 1}]
    body = experiment_body(steps=steps)
    response = await client.post("/v1/experiments", json=body)
    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert problem["status"] == 422 and problem["title"]
    assert "body.steps.1.weight_pct" in field_paths(problem)


async def test_steps_must_increase_strictly(client: httpx.AsyncClient) -> None:
    steps = [{"weight_pct": 5, "hold_sec": 60}, {"weight_pct": 5, "hold_sec": 60}]
    response = await client.post("/v1/experiments", json=experiment_body(steps=steps))
    assert response.status_code == 422
    problem = response.json()
    assert "body.steps" in field_paths(problem)
    assert "steps.1.weight_pct" in problem["errors"][0]["msg"]


async def test_other_invalid_fields_are_named(client: httpx.AsyncClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"steps": []}, "body.steps"),
        ({"steps": [{"weight_pct": 101, "hold_sec": 1}]}, "body.steps.0.weight_pct"),
        ({"service": "Payment API"}, "body.service"),
        (
            {"variants": {"baseline": {"upstream": "ftp://x"}, "canary": {"upstream": "http://c"}}},
            "body.variants.baseline.upstream",
        ),
        ({"rule": {"service": "other", "threshold_ms": 100}}, "body"),
        ({"rule": {"threshold_ms": 0}}, "body.rule.threshold_ms"),
        ({"sticky": {"header": None, "cookie": None}}, "body.sticky"),
        ({"colour": "blue"}, "body.colour"),
    ]
    for overrides, path in cases:
        response = await client.post("/v1/experiments", json=experiment_body(**overrides))
        assert response.status_code == 422, (overrides, response.text)
        assert response.headers["content-type"] == PROBLEM
        assert path in field_paths(response.json()), (overrides, response.json())


async def test_unknown_experiment_answers_404_problem(client: httpx.AsyncClient) -> None:
    for method, path in [
        ("GET", "/v1/experiments/999"),
        ("PATCH", "/v1/experiments/999"),
        ("DELETE", "/v1/experiments/999"),
        ("POST", "/v1/experiments/999/start"),
        ("GET", "/v1/experiments/999/events"),
    ]:
        response = await client.request(method, path, json={} if method == "PATCH" else None)
        assert response.status_code == 404, (method, path, response.text)
        assert response.headers["content-type"] == PROBLEM
        assert "999" in response.json()["detail"]
    unknown_route = await client.get("/v2/nothing")
    assert unknown_route.status_code == 404
    assert unknown_route.headers["content-type"] == PROBLEM


async def test_patch_changes_a_draft_and_validates_the_whole(
    client: httpx.AsyncClient, create: Create
) -> None:
    created = await create()
    url = f"/v1/experiments/{created['id']}"
    response = await client.patch(
        url, json={"name": "renamed", "steps": [{"weight_pct": 10, "hold_sec": 30}]}
    )
    assert response.status_code == 200, response.text
    patched = response.json()
    assert patched["name"] == "renamed"
    assert patched["steps"] == [{"weight_pct": 10, "hold_sec": 30}]
    assert patched["variants"] == created["variants"]
    assert (await client.get(url)).json()["steps"] == [{"weight_pct": 10, "hold_sec": 30}]

    bad = await client.patch(url, json={"steps": [{"weight_pct": 10, "hold_sec": -1}]})
    assert bad.status_code == 422
    assert "body.steps.0.hold_sec" in field_paths(bad.json())

    mismatch = await client.patch(url, json={"rule": {"service": "other", "threshold_ms": 1}})
    assert mismatch.status_code == 422
    assert (await client.get(url)).json()["name"] == "renamed"


async def test_patch_and_delete_outside_draft_answer_409_naming_the_state(
    client: httpx.AsyncClient, create: Create
) -> None:
    created = await create()
    url = f"/v1/experiments/{created['id']}"
    assert (await client.post(f"{url}/start")).status_code == 200
    for response in (await client.patch(url, json={"name": "x"}), await client.delete(url)):
        assert response.status_code == 409
        assert response.headers["content-type"] == PROBLEM
        assert response.json()["current_state"] == "running"
        assert "running" in response.json()["detail"]


async def test_delete_removes_a_draft(client: httpx.AsyncClient, create: Create) -> None:
    created = await create()
    url = f"/v1/experiments/{created['id']}"
    response = await client.delete(url)
    assert response.status_code == 204
    assert (await client.get(url)).status_code == 404
