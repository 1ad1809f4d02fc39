"""API requests as spans: the caller's trace continued, the route template as the name.

The real OpenTelemetry SDK with its in-memory exporter, behind `create_app`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from controlplane.api.app import create_app
from controlplane.kernel.settings import Settings
from controlplane.kernel.tracing_config import TracingConfig
from controlplane.runtime import Backends
from controlplane.tracer import tracer_provider
from tests.api.conftest import API_BASE, experiment_body
from tests.support.auth import bearer

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def traced(
    settings: Settings, backends: Backends, exporter: InMemorySpanExporter
) -> AsyncIterator[httpx.AsyncClient]:
    provider = tracer_provider(TracingConfig(None, 1.0), SimpleSpanProcessor(exporter), {})
    app = create_app(settings, backends=backends, tracer_provider=provider)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=API_BASE, headers=bearer()
        ) as http:
            yield http
    provider.shutdown()


async def test_a_request_continues_the_callers_trace_under_its_route_name(
    traced: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    created = await traced.post("/v1/experiments", json=experiment_body())
    assert created.status_code == 201
    exporter.clear()
    experiment = created.json()["id"]
    response = await traced.get(
        f"/v1/experiments/{experiment}", headers={"traceparent": f"00-{TRACE}-{CALLER_SPAN}-01"}
    )
    assert response.status_code == 200
    [span] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert span.name == "GET /v1/experiments/{experiment_id}"
    assert span.context is not None and span.parent is not None
    assert span.context.trace_id == int(TRACE, 16)
    assert span.parent.span_id == int(CALLER_SPAN, 16)
    attributes = dict(span.attributes or {})
    assert attributes["http.route"] == "/v1/experiments/{experiment_id}"
    assert attributes["url.path"] == f"/v1/experiments/{experiment}"
    assert attributes["http.response.status_code"] == 200
    assert span.resource.attributes["service.name"] == "canary-control-plane"


async def test_refusals_and_unknown_paths_are_traced_without_a_route(
    traced: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    refused = await traced.get("/v1/experiments", headers={"host": "evil.example"})
    assert refused.status_code == 400
    missing = await traced.get("/nowhere/" + "x" * 1000)
    assert missing.status_code == 404
    spans = exporter.get_finished_spans()
    assert [(s.name, dict(s.attributes or {})["http.response.status_code"]) for s in spans] == [
        ("GET", 400),
        ("GET", 404),
    ]
    assert len(str(dict(spans[1].attributes or {})["url.path"])) == 256
    assert all(s.parent is None for s in spans)  # no traceparent: new traces


async def test_a_server_error_marks_the_span(
    settings: Settings, backends: Backends, exporter: InMemorySpanExporter
) -> None:
    provider = tracer_provider(TracingConfig(None, 1.0), SimpleSpanProcessor(exporter), {})
    app = create_app(settings, backends=backends, tracer_provider=provider)

    @app.get("/boom", include_in_schema=False)
    async def boom() -> Any:
        raise RuntimeError("broken")

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=API_BASE) as http:
            assert (await http.get("/boom")).status_code == 500
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
