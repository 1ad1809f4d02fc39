"""/healthz, /readyz, /metrics and the OpenAPI document."""

from __future__ import annotations

import httpx

from controlplane.api.app import create_app
from controlplane.controller.runner import Controller
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends
from tests.api.conftest import API_BASE
from tests.support.auth import bearer


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


async def test_metrics_carry_the_controller_counters_when_it_runs_in_the_app(
    settings: Settings, backends: Backends
) -> None:
    controller = Controller(identity="metrics-test")
    app = create_app(settings, backends=backends, services=[controller])
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=API_BASE, headers=bearer()
        ) as http:
            controller.stats.routes_reconciled = 3  # as if three rounds had repaired one
            controller.stats.conflicts = 2
            text = (await http.get("/metrics")).text
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("canary_controller_")
    }
    assert values["canary_controller_routes_reconciled_total"] == 3.0
    assert values["canary_controller_conflicts_total"] == 2.0
    assert values["canary_controller_leader"] in (0.0, 1.0)
    assert {"canary_controller_evaluations_total", "canary_controller_leadership_terms_total",
            "canary_controller_errors_total"} <= values.keys()


async def test_metrics_have_no_controller_counters_without_a_controller(
    client: httpx.AsyncClient,
) -> None:
    assert "canary_controller_" not in (await client.get("/metrics")).text
