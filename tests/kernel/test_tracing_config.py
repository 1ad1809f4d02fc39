"""When tracing is on, and where it goes: the settings and the standard environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controlplane.kernel.settings import Settings
from controlplane.kernel.tracing_config import TracingConfig, tracing_config


@pytest.mark.parametrize(
    ("endpoint", "environ", "expected"),
    [
        (None, {}, None),
        ("http://otel:4318", {}, TracingConfig("http://otel:4318/v1/traces", 0.5)),
        ("https://otel:4318/base/", {}, TracingConfig("https://otel:4318/base/v1/traces", 0.5)),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318"}, TracingConfig(None, 0.5)),
        (
            None,
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://o/v1/traces"},
            TracingConfig(None, 0.5),
        ),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, None),
        ("http://otel:4318", {"OTEL_SDK_DISABLED": "True"}, None),
    ],
)
def test_tracing_is_on_only_with_an_endpoint(
    endpoint: str | None, environ: dict[str, str], expected: TracingConfig | None
) -> None:
    assert tracing_config(endpoint, 0.5, environ) == expected


@pytest.mark.parametrize(
    "endpoint",
    [
        "otel:4318",
        "ftp://otel",
        "http://user:pw@otel:4318",
        "http://otel:4318/?q=1",
        "http://otel:99999",
        "http://",
        "http://otel/" + "x" * 2100,
    ],
)
def test_a_bad_endpoint_is_refused(endpoint: str) -> None:
    with pytest.raises(ValidationError, match="OTLP endpoint"):
        Settings(otel_endpoint=endpoint)


@pytest.mark.parametrize("ratio", [-0.1, 1.5, float("nan")])
def test_the_ratio_is_bounded(ratio: float) -> None:
    with pytest.raises(ValidationError):
        Settings(otel_sample_ratio=ratio)


def test_the_environment_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANARY_OTEL_ENDPOINT", "http://otel:4318")
    monkeypatch.setenv("CANARY_OTEL_SAMPLE_RATIO", "0.01")
    monkeypatch.setenv("CANARY_LOG_FORMAT", "json")
    settings = Settings()
    assert (settings.otel_endpoint, settings.otel_sample_ratio, settings.log_format) == (
        "http://otel:4318",
        0.01,
        "json",
    )
