"""Overload protection of a service: `<prefix>/overload/<service>` in etcd.

Written by operators (or the API), read by every sidecar of the service, which keeps
the last valid value when a new one is refused. Every field is strict and bounded;
unknown fields are refused. Absent key, or `enabled: false`: no protection.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.rules import pydantic_field_errors
from controlplane.kernel.values import ServiceName

MAX_OVERLOAD_BYTES = 16 * 1024
MAX_LIMIT = 100_000
MAX_PATH_RULES = 64

# a path prefix: printable ASCII from "/", no spaces, as it appears in a request target
PathPrefix = Annotated[str, Field(strict=True, pattern=r"^/[\x21-\x7e]{0,255}$")]


def _real(*, ge: float | None = None, gt: float | None = None, le: float, default: float) -> Any:
    return Field(default=default, ge=ge, gt=gt, le=le, strict=True, allow_inf_nan=False)


def _count(*, ge: int, le: int, default: int) -> Any:
    return Field(default=default, ge=ge, le=le, strict=True)


class OverloadConfig(BaseModel):
    """Adaptive concurrency limits and graded shedding for one service's upstreams."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, strict=True)
    # the limit (sidecar.overload.limit): bounds, start, no-load measurement
    min_limit: int = _count(ge=1, le=MAX_LIMIT, default=1)
    max_limit: int = _count(ge=1, le=MAX_LIMIT, default=1000)
    initial_limit: int = _count(ge=1, le=MAX_LIMIT, default=20)
    update_interval_ms: int = _count(ge=10, le=60_000, default=100)
    percentile: float = _real(gt=0, le=1, default=0.5)
    rtt_buffer: float = _real(ge=0, le=1, default=0.1)
    smoothing: float = _real(gt=0, le=1, default=0.5)
    min_rtt_interval_s: float = _real(ge=1, le=86_400, default=60)
    min_rtt_samples: int = _count(ge=1, le=10_000, default=25)
    min_rtt_concurrency: int = _count(ge=1, le=MAX_LIMIT, default=3)
    # the queue of requests over the limit
    queue_size: int = _count(ge=0, le=100_000, default=100)
    queue_timeout_ms: int = _count(ge=0, le=60_000, default=50)
    # levels: pressure = (in flight + queued) / limit
    light_at: float = _real(gt=0, le=100, default=1.0)
    heavy_at: float = _real(gt=0, le=100, default=1.5)
    severe_at: float = _real(gt=0, le=100, default=2.0)
    light_shed_share: float = _real(ge=0, le=1, default=0.5)
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
        return self.config().model_dump_json().encode()


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
