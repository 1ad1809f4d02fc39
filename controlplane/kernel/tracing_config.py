"""Whether a process exports traces, and where: decided once at start-up, from the
settings and the standard OpenTelemetry environment.

Tracing is off unless an endpoint is configured: `CANARY_OTEL_ENDPOINT` (or the
`--otel-endpoint` flag), or the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
`OTEL_EXPORTER_OTLP_ENDPOINT`, which the OTLP exporter then reads itself (with
`OTEL_EXPORTER_OTLP_HEADERS` and the rest). `OTEL_SDK_DISABLED=true` turns it off
whatever else is set. Nothing here imports OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_URL_CHARS = 2048
TRACES_PATH = "/v1/traces"
_STANDARD_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


@dataclass(frozen=True, slots=True)
class TracingConfig:
    # the OTLP/HTTP traces URL; None: the exporter takes it from OTEL_EXPORTER_OTLP_*
    traces_url: str | None
    sample_ratio: float  # share of new traces recorded, 0..1


def otlp_base_url(value: str) -> str:
    """An OTLP/HTTP base URL, `http(s)://host[:port][/path]`, without a trailing slash;
    raises ValueError naming the problem."""
    text = value.strip()
    if len(text) > MAX_URL_CHARS:
        raise ValueError(f"OTLP endpoint longer than {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"invalid OTLP endpoint {text!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"OTLP endpoint {text!r} must be http(s)://host[:port][/path]")
    if parts.username is not None or parts.password is not None:
        raise ValueError("OTLP endpoint must not carry credentials (OTEL_EXPORTER_OTLP_HEADERS)")
    if parts.query or parts.fragment:
        raise ValueError(f"OTLP endpoint {text!r} must not carry a query or fragment")
    return text.rstrip("/")


def tracing_config(
    endpoint: str | None, sample_ratio: float, environ: Mapping[str, str]
) -> TracingConfig | None:
    """The tracing in force, or None when tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if not 0.0 <= sample_ratio <= 1.0:
        raise ValueError(f"sample ratio {sample_ratio} outside 0..1")
    if endpoint:
        return TracingConfig(otlp_base_url(endpoint) + TRACES_PATH, sample_ratio)
    if any(environ.get(name, "").strip() for name in _STANDARD_ENDPOINTS):
        return TracingConfig(None, sample_ratio)
    return None
