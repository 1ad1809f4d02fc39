"""The control plane's OpenTelemetry tracer provider, when tracing is configured.

`open_tracer_provider(settings)` is None when tracing is off (then no OpenTelemetry
module is imported); otherwise a provider sampling new traces at the configured
ratio, following a caller's sampled parent (ParentBased), and batching spans to OTLP
over HTTP. The API's middleware and the controller take tracers from it; whoever
opened it shuts it down (which sends what is queued).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from controlplane.kernel.settings import Settings
from controlplane.kernel.tracing_config import TracingConfig, tracing_config

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler

SERVICE_NAME = "canary-control-plane"


def open_tracer_provider(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> TracerProvider | None:
    environ = os.environ if environ is None else environ
    config = tracing_config(settings.otel_endpoint, settings.otel_sample_ratio, environ)
    if config is None:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter = OTLPSpanExporter(endpoint=config.traces_url)
    return tracer_provider(config, BatchSpanProcessor(exporter), environ)


def tracer_provider(
    config: TracingConfig, processor: SpanProcessor, environ: Mapping[str, str]
) -> TracerProvider:
    """A provider over `processor` (a test passes one around an in-memory exporter)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create()
    if not named:
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource, sampler=_sampler(config.sample_ratio))
    provider.add_span_processor(processor)
    return provider


def _sampler(ratio: float) -> Sampler:
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    return ParentBased(TraceIdRatioBased(ratio))
