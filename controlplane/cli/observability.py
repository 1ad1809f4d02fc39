"""The flags every long-running command shares for its logs, its traces and its
liveness."""

from __future__ import annotations

from typing import Annotated

import typer

LivenessBoundOption = Annotated[
    float,
    typer.Option(
        "--liveness-bound", min=1.0, max=3600.0,
        help="seconds without a heartbeat of the main loop before the --admin /healthz "
        "answers 503",
    ),
]
LogFormatOption = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        help="text, or json: one JSON object per line (time, level, logger, message, "
        "exception) [env CANARY_LOG_FORMAT]",
    ),
]
OtelEndpointOption = Annotated[
    str | None,
    typer.Option(
        "--otel-endpoint",
        help="send traces over OTLP/HTTP to this collector (http(s)://host:4318); off "
        "by default [env CANARY_OTEL_ENDPOINT, or the standard OTEL_EXPORTER_OTLP_ENDPOINT]",
    ),
]
SampleRatioOption = Annotated[
    float | None,
    typer.Option(
        "--trace-sample-ratio",
        help="share of new traces recorded, 0..1 (default 1); a request whose parent "
        "was sampled is always recorded [env CANARY_OTEL_SAMPLE_RATIO]",
    ),
]


def observability_settings(
    log_format: str | None, otel_endpoint: str | None = None, sample_ratio: float | None = None
) -> dict[str, str]:
    """The Settings fields these flags give (as text, the way a worker's spec holds them)."""
    given = {
        "log_format": log_format,
        "otel_endpoint": otel_endpoint,
        "otel_sample_ratio": None if sample_ratio is None else repr(sample_ratio),
    }
    return {key: value for key, value in given.items() if value is not None}
