"""The route table the sidecars apply (architecture §4): weights in basis points, sum 10000.

The API, the controller and every sidecar parse routes with these models, whose
field types come from kernel.values: what the API admits is what a sidecar applies.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.rules import pydantic_field_errors
from controlplane.kernel.values import (
    HttpToken,
    RouteExperiment,
    RouteRevision,
    Salt,
    UpstreamUrl,
    VariantName,
)

TOTAL_WEIGHT = 10_000
BASELINE = "baseline"
CANARY = "canary"


class RouteState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    TRIPPED = "tripped"
    HALF_OPEN = "half_open"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


class Sticky(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    header: HttpToken | None = Field(default="x-user-id")
    cookie: HttpToken | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Sticky:
        if self.header is None and self.cookie is None:
            raise ValueError("sticky needs a header or a cookie name")
        return self


class RouteVariant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: VariantName
    upstream: UpstreamUrl
    weight: int = Field(strict=True, ge=0, le=TOTAL_WEIGHT)


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment: RouteExperiment
    revision: RouteRevision
    salt: Salt
    sticky: Sticky = Field(default_factory=Sticky)
    variants: tuple[RouteVariant, ...] = Field(min_length=1, max_length=16)
    state: RouteState

    @model_validator(mode="after")
    def _weights_sum(self) -> Route:
        total = sum(v.weight for v in self.variants)
        if total != TOTAL_WEIGHT:
            raise ValueError(f"variant weights sum to {total}, not {TOTAL_WEIGHT}")
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError("variant names must be unique")
        return self

    def weight_of(self, name: str) -> int:
        return next((v.weight for v in self.variants if v.name == name), 0)

    def to_json(self) -> str:
        return self.model_dump_json()


def two_way_variants(
    baseline_url: str, canary_url: str, canary_bp: int
) -> tuple[RouteVariant, ...]:
    """The baseline/canary pair with canary_bp basis points to the canary."""
    if not 0 <= canary_bp <= TOTAL_WEIGHT:
        raise ValueError(f"canary weight {canary_bp} outside 0..{TOTAL_WEIGHT}")
    return (
        RouteVariant(name=BASELINE, upstream=baseline_url, weight=TOTAL_WEIGHT - canary_bp),
        RouteVariant(name=CANARY, upstream=canary_url, weight=canary_bp),
    )


def parse_route(raw: bytes | str | dict[str, Any]) -> Route:
    """Parse a route value from etcd; raises ValidationFailed, never a bare crash."""
    try:
        data = json.loads(raw) if isinstance(raw, bytes | str) else raw
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationFailed(f"route is not JSON: {exc}") from exc
    try:
        return Route.model_validate(data)
    except ValidationError as exc:
        raise ValidationFailed("invalid route", pydantic_field_errors(exc)) from exc
