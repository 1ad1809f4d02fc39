"""Prometheus metrics of one app, in its own registry (never the process-global one:
a process, or a test session, may build many apps).

Requests are labelled by route template (`/v1/experiments/{experiment_id}`), not by
raw path, so the label set stays bounded.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.api.security import require
from controlplane.auth.roles import Role
from controlplane.kernel.exposition import TextRegistry, render
from controlplane.runtime import ExportsMetrics, ExportsText

UNMATCHED = "<unmatched>"


class ApiMetrics:
    def __init__(self, registry: TextRegistry | None = None) -> None:
        # a TextRegistry: the parts that write their own text are on the same page
        self.registry = registry or TextRegistry(auto_describe=True)
        self.requests = Counter(
            "canary_api_requests",
            "HTTP requests answered by the API",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "canary_api_request_duration_seconds",
            "Time to answer an HTTP request",
            ["method", "route", "status"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )

        self.rejected = Counter(
            "canary_api_rejected_requests",
            "Requests refused before routing (untrusted Host, method, not JSON, too large)",
            ["reason"],
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "canary_api_auth_failures",
            "Requests whose credentials were missing or did not verify",
            ["reason"],
            registry=self.registry,
        )
        self.jwks_fetches = Counter(
            "canary_api_oidc_jwks_fetches",
            "Fetches of the OIDC issuer's JWKS, by outcome (ok, or why it failed)",
            ["outcome"],
            registry=self.registry,
        )
        self.jwks_skipped_keys = Counter(
            "canary_api_oidc_jwks_keys_skipped",
            "Keys of fetched JWKS left out (not for signing, symmetric, malformed...)",
            ["reason"],
            registry=self.registry,
        )
        self.insecure = Gauge(
            "canary_api_insecure",
            "1 when the API serves without authentication (--insecure)",
            registry=self.registry,
        )

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

    def jwks_fetched(self, outcome: str) -> None:
        self.jwks_fetches.labels(outcome).inc()

    def jwks_keys_skipped(self, reason: str, keys: int) -> None:
        self.jwks_skipped_keys.labels(reason).inc(keys)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        labels = (method, route, str(status))
        self.requests.labels(*labels).inc()
        self.latency.labels(*labels).observe(seconds)

    def render(self) -> bytes:
        return render(self.registry)

    def export(self, part: object) -> None:
        """A background part's own series on this /metrics, if it has any: its
        collector's families, and the text it writes itself."""
        if isinstance(part, ExportsMetrics):
            self.registry.register(part.metrics_collector())
        if isinstance(part, ExportsText):
            self.registry.add_text(part.metrics_text)


class MetricsMiddleware:
    """Times every HTTP request and counts it by method, route template and status."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            # The router records the matched route in the scope it was given.
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED
            self.metrics.observe(scope["method"], template, status, time.perf_counter() - started)


def install(app: FastAPI, metrics: ApiMetrics) -> ApiMetrics:
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    # the counters tell which experiments and services exist: viewers only
    @app.get("/metrics", include_in_schema=False, dependencies=[require(Role.VIEWER)])
    async def metrics_endpoint(request: Request) -> Response:
        return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return metrics
