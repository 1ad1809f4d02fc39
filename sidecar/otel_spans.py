"""The sidecar's spans, handed to OpenTelemetry: imported only when tracing is on.

`sidecar.proxy.tracing` keeps what the proxy measured of each recorded request; this
module turns those into finished OpenTelemetry spans (`ReadableSpan`) with the ids the
proxy already sent upstream and the times it already took, and gives them to a span
processor — a `BatchSpanProcessor` over OTLP/HTTP in production, whatever a test
wants otherwise. The spans never exist as live SDK spans: nothing is started or ended
on the data path, and the sampling decision was the proxy's.

Span: kind SERVER, named after the method (`HTTP` for a method outside RFC 9110's),
attributes `canary.experiment`, `canary.variant`, `canary.outcome`,
`canary.upstream`, `server.address`, `server.port`, `http.request.method`,
`http.response.status_code` or `rpc.grpc.status_code`, `error.type` on failures;
events when the request went upstream and when the response head went out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, GRPC_STATUS, TIMEOUT
from controlplane.kernel.tracing_config import TracingConfig
from sidecar.proxy.tracing import FinishedSpan

SCOPE = InstrumentationScope("canary.sidecar")
# RFC 9110 §9 and PATCH: any other method is named `_OTHER` (semantic conventions)
_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
_FAILURES = {CONNECT_ERROR: "connect_error", TIMEOUT: "timeout", ABORTED: "aborted"}
# gRPC codes a server span marks as errors (semantic conventions for RPC)
_GRPC_SERVER_ERRORS = frozenset({2, 4, 12, 13, 14, 15})
MAX_TRACESTATE_BYTES = 512  # Trace Context §3.3.1.5: a vendor may drop a longer one
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_ERROR = Status(StatusCode.ERROR)


def _ns(epoch_seconds: float) -> int:
    return int(epoch_seconds * 1e9)


def _trace_state(raw: bytes | None) -> TraceState:
    if not raw or len(raw) > MAX_TRACESTATE_BYTES:
        return TraceState()
    try:
        return TraceState.from_header([raw.decode("ascii")])
    except (UnicodeDecodeError, ValueError):
        return TraceState()


def readable_span(span: FinishedSpan, resource: Resource) -> ReadableSpan:
    """One finished request as an OpenTelemetry span."""
    trace = span.trace
    state = _trace_state(trace.tracestate)
    context = SpanContext(trace.trace_id, trace.span_id, False, _SAMPLED, state)
    parent = (
        SpanContext(trace.trace_id, trace.parent_id, True, _SAMPLED, state)
        if trace.parent_id
        else None
    )
    method = trace.method.decode("latin-1")
    known = method in _METHODS
    upstream = span.upstream
    attributes: dict[str, str | int] = {
        "canary.variant": span.variant,
        "canary.outcome": span.outcome,
        "canary.upstream": str(upstream),
        "server.address": upstream.host,
        "server.port": upstream.port,
        "http.request.method": method if known else "_OTHER",
    }
    if span.experiment is not None:
        attributes["canary.experiment"] = span.experiment
    outcome = span.outcome
    status = _UNSET
    if outcome >= GRPC_STATUS:
        code = outcome - GRPC_STATUS
        attributes["rpc.grpc.status_code"] = code
        if code in _GRPC_SERVER_ERRORS:
            status = _ERROR
            attributes["error.type"] = str(code)
    elif outcome >= 100:
        attributes["http.response.status_code"] = outcome
        if outcome >= 500:
            status = _ERROR
            attributes["error.type"] = str(outcome)
    else:
        attributes["error.type"] = _FAILURES.get(outcome, "other")
        status = _ERROR if outcome != ABORTED else _UNSET
    events = []
    if span.sent is not None:
        events.append(Event("upstream request sent", timestamp=_ns(span.sent)))
    if span.first_byte is not None:
        events.append(Event("response head sent", timestamp=_ns(span.first_byte)))
    return ReadableSpan(
        name=method if known else "HTTP",
        context=context,
        parent=parent,
        resource=resource,
        attributes=attributes,
        events=events,
        kind=SpanKind.SERVER,
        status=status,
        start_time=_ns(span.start),
        end_time=_ns(span.end),
        instrumentation_scope=SCOPE,
    )


class OtelSpanSink:
    """A `SpanSink` feeding an OpenTelemetry span processor."""

    def __init__(self, processor: SpanProcessor, resource: Resource) -> None:
        self.processor = processor
        self.resource = resource

    def export(self, spans: Sequence[FinishedSpan]) -> None:
        on_end, resource = self.processor.on_end, self.resource
        for span in spans:
            on_end(readable_span(span, resource))

    def close(self) -> None:
        self.processor.shutdown()


def sidecar_resource(service: str, environ: Mapping[str, str]) -> Resource:
    """`service.name` canary-sidecar unless OTEL_SERVICE_NAME (or service.name in
    OTEL_RESOURCE_ATTRIBUTES) says otherwise; `canary.service`: the service fronted."""
    own: dict[str, str] = {"canary.service": service}
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    base = Resource.create()
    if not named:
        own["service.name"] = "canary-sidecar"
    return base.merge(Resource(own))


def otlp_sink(config: TracingConfig, *, service: str) -> OtelSpanSink:
    """Spans batched and sent over OTLP/HTTP (protobuf) from a background thread."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter(endpoint=config.traces_url)
    return OtelSpanSink(BatchSpanProcessor(exporter), sidecar_resource(service, os.environ))
