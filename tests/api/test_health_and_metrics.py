"""/healthz, /readyz, /metrics and the OpenAPI document."""

from __future__ import annotations

import httpx

from controlplane.runtime import Backends


async def test_healthz_and_readyz_answer_when_backends_are_up(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"database": "ok", "etcd": "ok"}}


async def test_readyz_answers_503_naming_the_backend_that_is_down(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    await backends.kv.close()
    ready = await client.get("/readyz")
    assert ready.status_code == 503
    checks = ready.json()["checks"]
    assert checks["database"] == "ok" and checks["etcd"] != "ok"


async def test_metrics_count_requests_by_route_template_and_status(
    client: httpx.AsyncClient,
) -> None:
    await client.get("/v1/experiments/41")
    await client.get("/v1/experiments/42")
    text = (await client.get("/metrics")).text
    line = next(
        line
        for line in text.splitlines()
        if line.startswith("canary_api_requests_total")
        and 'route="/v1/experiments/{experiment_id}"' in line
    )
    assert 'status="404"' in line and line.endswith(" 2.0")
    assert "canary_api_request_duration_seconds_bucket" in text


async def test_openapi_describes_the_v1_endpoints(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert {"/v1/experiments", "/v1/experiments/{experiment_id}/start",
            "/v1/services/{service}/rule"} <= set(paths)
    assert (await client.get("/docs")).status_code == 200
