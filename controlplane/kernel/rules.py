"""The breaker rule (architecture §6): the contract between the API, etcd and the controller."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from controlplane.kernel.errors import FieldError, ValidationFailed, plain_message
from controlplane.kernel.judgment import EffectGate, GuardrailDirections
from controlplane.kernel.metric_specs import GuardrailAction, MetricSpec, check_unique
from controlplane.kernel.values import (
    MAX_COUNT,
    MAX_DURATION_SEC,
    MAX_THRESHOLD_MS,
    SERVICE_PATTERN,
    ServiceName,
)

__all__ = ["SERVICE_PATTERN", "BreakerRule", "ServiceName", "parse_rule"]

# gRPC status codes the breaker may count as failures: every non-zero code, or a list
# of codes gRPC defines (0 OK .. 16 UNAUTHENTICATED, codec.GRPC_MAX_CODE)
GRPC_CODE_MAX = 16
# the bounds the validators below check, stated in the schema too (their messages stay)
GrpcFailureCodes = (
    Annotated[
        list[
            Annotated[
                int, Field(strict=True, json_schema_extra={"minimum": 0, "maximum": GRPC_CODE_MAX})
            ]
        ],
        Field(json_schema_extra={"maxItems": GRPC_CODE_MAX + 1}),
    ]
    | Literal["nonzero"]
)
HttpStatus = Annotated[int, Field(strict=True, json_schema_extra={"minimum": 100, "maximum": 599})]


def check_grpc_codes(value: list[int] | str) -> list[int] | str:
    if isinstance(value, list):
        if len(value) > GRPC_CODE_MAX + 1:
            raise ValueError(f"at most {GRPC_CODE_MAX + 1} gRPC codes")
        bad = [code for code in value if not 0 <= code <= GRPC_CODE_MAX]
        if bad:
            raise ValueError(f"not gRPC status codes (0..{GRPC_CODE_MAX}): {bad}")
    return value


PERCENTILES: tuple[float, ...] = (50, 90, 95, 99, 99.9)


class Compare(StrEnum):
    ABSOLUTE = "absolute"
    BASELINE = "baseline"


# what a breach of latency or failures does: the graded actions every guardrail
# takes (decision 0049); `TripAction` is the name the rule used before provider metrics
TripAction = GuardrailAction


class NoDataPolicy(StrEnum):
    HOLD = "hold"
    FAIL = "fail"


class SrmPolicy(StrEnum):
    WARN = "warn"
    HOLD = "hold"


class OverloadPolicy(StrEnum):
    """A look while the baseline's sidecars shed requests
    (docs/decisions/0025-overload-and-judgment.md)."""

    HOLD = "hold"  # neither breach nor pass: the look is `overloaded`
    JUDGE = "judge"  # judged as any other; the shed counts are evidence only


class Latency(StrEnum):
    """Which response time a rule judges (docs/decisions/0017-first-byte-latency.md)."""

    TOTAL = "total"  # the whole exchange: ordinary request/response services
    FIRST_BYTE = "first_byte"  # to the response head: SSE, token streams, long downloads


class BreakerRule(BaseModel):
    """A service's breaker rule. The first five fields come from the original spec.

    Every number is strict (no bools or strings), finite and bounded above, so the
    controller's arithmetic on them (now + cooldown_sec) stays in range (values.py).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: ServiceName
    threshold_ms: float = Field(
        gt=0,
        le=MAX_THRESHOLD_MS,
        strict=True,
        allow_inf_nan=False,
        description="RT bound on the chosen percentile",
    )
    window_sec: int = Field(default=60, ge=1, le=3600, strict=True, description="sliding window")
    failure_ratio: float = Field(
        default=0.3,
        gt=0,
        le=1,
        strict=True,
        allow_inf_nan=False,
        description="failed / total bound",
    )
    cooldown_sec: float = Field(
        default=300,
        ge=0,
        le=MAX_DURATION_SEC,
        strict=True,
        allow_inf_nan=False,
        description="open time before a probe",
    )
    percentile: float = Field(
        default=95,
        strict=True,
        allow_inf_nan=False,
        description="one of 50, 90, 95, 99, 99.9",
        json_schema_extra={"enum": list(PERCENTILES)},
    )
    min_samples: int = Field(
        default=100, ge=1, le=MAX_COUNT, strict=True, description="no verdict on fewer samples"
    )
    compare: Compare = Compare.ABSOLUTE
    baseline_margin: float = Field(default=1.2, ge=1.0, le=100.0, strict=True, allow_inf_nan=False)
    action: GuardrailAction = Field(
        default=GuardrailAction.STOP,
        description="what a breach of latency or failures does: pause (hold the weight), "
        "step_back, stop (cut to 0, cooldown, probe) or rollback (at once, no probe)",
    )
    half_open_weight: int = Field(
        default=100, ge=1, le=10000, strict=True, description="basis points"
    )
    max_trips: int = Field(default=3, ge=1, le=1000, strict=True)
    failure_statuses: list[HttpStatus] | Literal["5xx"] = Field(
        default="5xx",
        max_length=500,
        description="statuses that count as failures besides connect errors",
    )
    grpc_failure_codes: GrpcFailureCodes = Field(
        default="nonzero",
        description="gRPC status codes (0..16) that count as failures; default every non-zero",
    )
    consecutive_breaches: int = Field(
        default=2,
        ge=1,
        le=100,
        strict=True,
        description="breached evaluations in a row before a trip",
    )
    alpha: float = Field(
        default=0.01,
        gt=0,
        lt=0.5,
        strict=True,
        allow_inf_nan=False,
        description="significance of the tests",
    )
    no_data: NoDataPolicy = NoDataPolicy.HOLD
    no_data_timeout_sec: float = Field(
        default=300, gt=0, le=MAX_DURATION_SEC, strict=True, allow_inf_nan=False
    )
    srm: SrmPolicy = SrmPolicy.WARN
    latency: Latency = Field(
        default=Latency.TOTAL,
        description="the response time judged: total, or first_byte (time to the "
        "response head, for streams whose length says nothing of the service's speed)",
    )
    overload: OverloadPolicy = Field(
        default=OverloadPolicy.HOLD,
        description="while the baseline's sidecars shed requests: hold (no breach, no "
        "pass, the step waits) or judge as usual (shed counts are evidence only)",
    )
    # Kayenta-compatible judgment knobs (docs/decisions/0013); left unset, every
    # decision is the same as without them
    direction: GuardrailDirections = Field(
        default_factory=GuardrailDirections,
        description="per guardrail, which change is bad: increase, decrease or either",
    )
    effect: EffectGate | None = Field(
        default=None, description="effect-size gate of the baseline latency comparison"
    )
    confidence: float | None = Field(
        default=None,
        gt=0.5,
        lt=1,
        allow_inf_nan=False,
        strict=True,
        description="1 - alpha: the chance a healthy canary passes a step; sets alpha",
    )

    metrics: list[MetricSpec] = Field(
        default_factory=list,
        description="provider metrics judged as guardrails beside latency and failures, "
        "each with its own action and no-data policy (at most 16, names unique)",
    )

    @model_validator(mode="before")
    @classmethod
    def _confidence_sets_alpha(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        confidence = data.get("confidence")
        if isinstance(confidence, bool) or not isinstance(confidence, int | float):
            return data  # absent, or the field's own validation names what is wrong
        if not 0.5 < confidence < 1:
            return data
        alpha = 1 - float(confidence)
        if "alpha" not in data:
            return {**data, "alpha": alpha}
        given = data["alpha"]
        if isinstance(given, int | float) and not math.isclose(given, alpha, abs_tol=1e-12):
            raise ValueError(f"alpha {given} contradicts confidence {confidence}: give one")
        return data  # a given alpha is validated as given, even when it agrees

    @model_validator(mode="after")
    def _knobs_compare_with_the_baseline(self) -> BreakerRule:
        if self.compare is Compare.ABSOLUTE and (
            self.effect is not None or not self.direction.is_default
        ):
            raise ValueError("direction and effect need compare: baseline")
        return self

    @field_validator("metrics")
    @classmethod
    def _unique_metrics(cls, value: list[MetricSpec]) -> list[MetricSpec]:
        return check_unique(value)

    @field_validator("percentile")
    @classmethod
    def _known_percentile(cls, value: float) -> float:
        if value not in PERCENTILES:
            raise ValueError(f"percentile must be one of {', '.join(map(str, PERCENTILES))}")
        return value

    @field_validator("failure_statuses")
    @classmethod
    def _statuses(cls, value: list[int] | str) -> list[int] | str:
        if isinstance(value, list):
            bad = [s for s in value if not 100 <= s <= 599]
            if bad:
                raise ValueError(f"not HTTP statuses: {bad}")
        return value

    @field_validator("grpc_failure_codes")
    @classmethod
    def _grpc_codes(cls, value: list[int] | str) -> list[int] | str:
        return check_grpc_codes(value)

    @model_serializer(mode="wrap")
    def _omit_defaults_of_new_fields(self, handler: Any) -> Any:
        # a rule judging the total reads as it did before the field existed, so
        # controllers and collectors of the previous release still accept it
        data = handler(self)
        if isinstance(data, dict) and self.latency is Latency.TOTAL:
            data.pop("latency", None)
        if isinstance(data, dict) and self.overload is OverloadPolicy.HOLD:
            data.pop("overload", None)  # likewise for rules written before the option
        if isinstance(data, dict) and not self.metrics:
            data.pop("metrics", None)  # and for rules without provider metrics
        return data

    def is_failure_status(self, status: int) -> bool:
        if self.failure_statuses == "5xx":
            return status >= 500
        return status in self.failure_statuses

    def to_json(self) -> str:
        return self.model_dump_json()


def pydantic_field_errors(exc: ValidationError) -> list[FieldError]:
    return [FieldError(tuple(err["loc"]), plain_message(err["msg"])) for err in exc.errors()]


def parse_rule(raw: bytes | str | dict[str, Any]) -> BreakerRule:
    """Parse a rule from etcd or a file; raises ValidationFailed naming the fields."""
    try:
        data = json.loads(raw) if isinstance(raw, bytes | str) else raw
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationFailed(f"rule is not JSON: {exc}") from exc
    try:
        return BreakerRule.model_validate(data)
    except ValidationError as exc:
        raise ValidationFailed("invalid breaker rule", pydantic_field_errors(exc)) from exc
