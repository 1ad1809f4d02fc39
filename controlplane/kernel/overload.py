"""Overload protection of a service: `<prefix>/overload/<service>` in etcd.

Committed through the API (kept in SQL, published by the leader: kernel.service_configs),
read by every sidecar of the service, which keeps the last valid value when a new one
is refused. Every field is strict and bounded; unknown fields are refused. Absent key,
or `enabled: false`: no protection.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.hosts import parse_host
from controlplane.kernel.rules import pydantic_field_errors
from controlplane.kernel.values import ServiceName, UpstreamPolicy

MAX_OVERLOAD_BYTES = 16 * 1024
MAX_LIMIT = 100_000
MAX_PATH_RULES = 64

# a path prefix: printable ASCII from "/", no spaces, as it appears in a request target
PathPrefix = Annotated[str, Field(strict=True, pattern=r"^/[\x21-\x7e]{0,255}$")]


def _real(
    *,
    ge: float | None = None,
    gt: float | None = None,
    lt: float | None = None,
    le: float,
    default: float,
) -> Any:
    return Field(default=default, ge=ge, gt=gt, lt=lt, le=le, strict=True, allow_inf_nan=False)


def _count(*, ge: int, le: int, default: int) -> Any:
    return Field(default=default, ge=ge, le=le, strict=True)


MAX_SIGNAL_VALUE = 1e12
MAX_SOURCE_CHARS = 2048
Failure = Literal["ignore", "light", "heavy", "severe"]


class _Graded(BaseModel):
    """Three ordered thresholds of one signal's value: at or above `light`, the light
    level, and so on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    light: float = Field(strict=True, ge=0, le=MAX_SIGNAL_VALUE, allow_inf_nan=False)
    heavy: float = Field(strict=True, ge=0, le=MAX_SIGNAL_VALUE, allow_inf_nan=False)
    severe: float = Field(strict=True, ge=0, le=MAX_SIGNAL_VALUE, allow_inf_nan=False)

    @model_validator(mode="after")
    def _ordered_levels(self) -> _Graded:
        if not 0 < self.light <= self.heavy <= self.severe:
            raise ValueError("thresholds must be ordered: 0 < light <= heavy <= severe")
        return self


class RateSignal(_Graded):
    """Requests per second arriving for one upstream (per sidecar worker)."""


class ExternalSignal(_Graded):
    """A number the service reports, polled: `http://host:port/path` (the body is the
    number), `file:/absolute/path` (the file holds it), or `nvml` (the used share of GPU
    `gpu`'s memory, 0..1, when NVML and a GPU are there)."""

    source: str = Field(strict=True, min_length=4, max_length=MAX_SOURCE_CHARS)
    gpu: int = _count(ge=0, le=63, default=0)
    interval_ms: int = _count(ge=50, le=60_000, default=1000)
    timeout_ms: int = _count(ge=10, le=10_000, default=200)
    # a reading older than this is stale: ignored, as a failing probe is
    stale_after_ms: int = _count(ge=50, le=600_000, default=5000)
    # the level while the probe fails or its reading is stale ("ignore": none)
    on_failure: Failure = "ignore"

    @model_validator(mode="after")
    def _probe(self) -> ExternalSignal:
        source_kind(self.source)  # raises ValueError naming what is wrong
        if self.timeout_ms > self.interval_ms:
            raise ValueError("timeout_ms must not exceed interval_ms")
        if self.stale_after_ms < self.interval_ms:
            raise ValueError("stale_after_ms must be at least interval_ms")
        return self


def source_kind(source: str) -> Literal["http", "file", "nvml"]:
    """What an external signal's source is; ValueError when it is none of them."""
    if source == "nvml":
        return "nvml"
    if any(ord(c) <= 0x20 or ord(c) >= 0x7F for c in source):
        raise ValueError("source must be printable ASCII without spaces")
    if source.startswith("file:/"):
        path = source[len("file:") :]
        if path.startswith("//"):
            raise ValueError("a file source is file:/absolute/path")
        return "file"
    url = urlsplit(source)
    if url.scheme != "http" or not url.hostname or url.username or url.password:
        raise ValueError("source must be http://host[:port]/path, file:/path or nvml")
    try:
        url.port  # noqa: B018 - a port out of range raises
    except ValueError as exc:
        raise ValueError(f"source port: {exc}") from exc
    try:
        host = parse_host(url.hostname)
    except ValueError as exc:
        raise ValueError(f"source {exc}") from None
    # a load signal is never on a metadata service: no allow-list admits one here
    refused = UpstreamPolicy(what="source").refusal(host)
    if refused is not None:
        raise ValueError(refused)
    return "http"


class Signals(BaseModel):
    """Signals beside in-flight pressure; the level is the highest any of them gives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: RateSignal | None = None
    external: ExternalSignal | None = None


class OverloadConfig(BaseModel):
    """Adaptive concurrency limits and graded shedding for one service's upstreams."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, strict=True)
    # the limit (sidecar.overload.limit): bounds, start, no-load measurement
    min_limit: int = _count(ge=1, le=MAX_LIMIT, default=1)
    max_limit: int = _count(ge=1, le=MAX_LIMIT, default=1000)
    initial_limit: int = _count(ge=1, le=MAX_LIMIT, default=20)
    update_interval_ms: int = _count(ge=10, le=60_000, default=100)
    # how an interval's latencies are summarised (decision 0032): their mean, or the
    # `percentile` of them
    statistic: Literal["mean", "percentile"] = "mean"
    percentile: float = _real(gt=0, le=1, default=0.5)
    rtt_buffer: float = _real(ge=0, le=1, default=0.05)
    smoothing: float = _real(gt=0, le=1, default=0.3)
    min_rtt_interval_s: float = _real(ge=1, le=86_400, default=60)
    min_rtt_samples: int = _count(ge=1, le=10_000, default=25)
    min_rtt_concurrency: int = _count(ge=1, le=MAX_LIMIT, default=3)
    # the queue of requests over the limit
    queue_size: int = _count(ge=0, le=100_000, default=100)
    queue_timeout_ms: int = _count(ge=0, le=60_000, default=50)
    # a queue that has not been empty for `queue_standing_after_ms` is a standing one
    # (sustained overload, not a burst): what joins it then waits at most
    # `queue_standing_timeout_ms` (CoDel's target and interval, decision 0026)
    queue_standing_after_ms: int = _count(ge=1, le=60_000, default=100)
    queue_standing_timeout_ms: int = _count(ge=0, le=60_000, default=5)
    # a standing queue is served newest first (adaptive LIFO, decision 0032)
    queue_standing_lifo: bool = Field(default=True, strict=True)
    # levels: pressure = (in flight + queued) / limit
    light_at: float = _real(gt=0, le=100, default=1.0)
    heavy_at: float = _real(gt=0, le=100, default=1.5)
    severe_at: float = _real(gt=0, le=100, default=2.0)
    light_shed_share: float = _real(ge=0, le=1, default=0.5)
    # a level is left only once its signal is below its threshold by this share
    hysteresis: float = _real(ge=0, lt=1, le=1, default=0.1)
    signals: Signals = Field(default_factory=Signals)
    # what a shed request gets
    shed_status: Literal[429, 503] = 429
    retry_after_s: int = _count(ge=0, le=3600, default=1)
    # requests under these path prefixes are low priority, as with `X-Priority: low`
    low_priority_paths: tuple[PathPrefix, ...] = Field(default=(), max_length=MAX_PATH_RULES)

    @model_validator(mode="after")
    def _ordered(self) -> OverloadConfig:
        if self.min_limit > self.max_limit:
            raise ValueError("min_limit must not exceed max_limit")
        if not self.light_at <= self.heavy_at <= self.severe_at:
            raise ValueError("levels must be ordered: light_at <= heavy_at <= severe_at")
        return self


class ServiceOverload(OverloadConfig):
    """The config as the API and files carry it: with the service it protects. The key
    names the service, so the stored value (`to_stored`) leaves it out."""

    service: ServiceName

    def config(self) -> OverloadConfig:
        return OverloadConfig.model_validate(self.model_dump(exclude={"service"}))

    def to_stored(self) -> bytes:
        """The config as stored; the fields added with signals are left out while at
        their defaults, so sidecars that predate them accept the value."""
        config = self.config()
        later = (
            "hysteresis",
            "signals",
            "queue_standing_after_ms",
            "queue_standing_timeout_ms",
            "statistic",
            "queue_standing_lifo",
        )
        unset = {name for name in later if getattr(config, name) == getattr(DEFAULTS, name)}
        return config.model_dump_json(exclude=unset).encode()


DEFAULTS = OverloadConfig()


def parse_overload(raw: bytes | str | dict[str, Any]) -> OverloadConfig:
    """Parse a service's overload protection; raises ValidationFailed naming the fields."""
    if isinstance(raw, bytes | str):
        if len(raw) > MAX_OVERLOAD_BYTES:
            raise ValidationFailed(f"overload config larger than {MAX_OVERLOAD_BYTES} bytes")
        try:
            raw = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValidationFailed(f"overload config is not JSON: {exc}") from exc
    try:
        return OverloadConfig.model_validate(raw)
    except ValidationError as exc:
        raise ValidationFailed("invalid overload config", pydantic_field_errors(exc)) from exc
