"""A span per API request, child of the caller's W3C `traceparent` when it sends one.

Installed by `create_app` only when tracing is configured (outermost, so refusals by
the hygiene middlewares are traced too). Span: kind SERVER, named `METHOD /route/{id}`
after the route template (the method alone when no route matched), attributes
`http.request.method`, `http.route`, `url.path` (at most 256 characters),
`http.response.status_code`; a 5xx or an exception marks it an error.

Written here rather than taken from opentelemetry-instrumentation-fastapi, which
wraps FastAPI's constructor and pulls in the ASGI instrumentation, the
instrumentation framework and a semantic-conventions release for the same few lines.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_PATH_CHARS = 256
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"})


class TracingMiddleware:
    def __init__(self, app: ASGIApp, *, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in _TRACE_HEADERS
        }
        method = scope.get("method", "")
        method = method if method in _METHODS else "_OTHER"
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.path": scope.get("path", "")[:MAX_PATH_CHARS],
            "url.scheme": scope.get("scheme", "http"),
        }
        name = method if method != "_OTHER" else "HTTP"
        with self.tracer.start_as_current_span(
            name,
            context=_PROPAGATOR.extract(carrier),
            kind=SpanKind.SERVER,
            attributes=attributes,
        ) as span:
            status = 0

            async def send_traced(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                await send(message)

            try:
                await self.app(scope, receive, send_traced)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if isinstance(route, str):
                    span.update_name(f"{name} {route}")
                    span.set_attribute("http.route", route)
                if status:
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
