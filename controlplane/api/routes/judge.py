"""/v1/judge: a one-shot judgment of two sample sets, to check the judge by hand.

Stateless: it reads no backend, so it answers whatever etcd or the database do.
Every access rule for it belongs on `router` (one place).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from controlplane.api.problems import problem_responses
from controlplane.api.security import require
from controlplane.auth.roles import Role
from controlplane.decision.judge import DEFAULT_CONFIDENCE, FailureCounts, judge
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.judgment import Direction, EffectGate

# stateless, but CPU-bound on large sample sets: callers need a token
router = APIRouter(prefix="/v1", tags=["judge"], dependencies=[require(Role.VIEWER)])

MAX_SAMPLES = 100_000
# two full sample sets written as JSON numbers of up to ~24 characters each
MAX_BODY_BYTES = 2 * MAX_SAMPLES * 25 + 64 * 1024
# a latency of more than ~11.5 days in milliseconds is not a measurement
MAX_LATENCY_MS = 1e9
MAX_REQUESTS = 10**12

Latency = Annotated[float, Field(ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False, strict=True)]
Count = Annotated[int, Field(ge=0, le=MAX_REQUESTS, strict=True)]


def _pair_or_object(schema: dict[str, Any]) -> None:
    """The schema says what `_pair` accepts: the named form or a [failures, count] pair."""
    named = dict(schema)
    schema.clear()
    schema["anyOf"] = [
        named,
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": MAX_REQUESTS},
            "minItems": 2,
            "maxItems": 2,
        },
    ]


class FailureSide(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_pair_or_object)

    failures: Count
    count: Count

    @model_validator(mode="before")
    @classmethod
    def _pair(cls, data: Any) -> Any:
        # [failures, count] as the issue writes it, or the named form
        if isinstance(data, list):
            if len(data) != 2:
                raise ValueError("must be [failures, count]")
            return {"failures": data[0], "count": data[1]}
        return data

    @model_validator(mode="after")
    def _within(self) -> FailureSide:
        if self.failures > self.count:
            raise ValueError("failures must not exceed count")
        return self


class FailureInput(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    baseline: FailureSide
    canary: FailureSide
    direction: Direction = Direction.INCREASE


class JudgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    baseline: list[Latency] = Field(max_length=MAX_SAMPLES, description="baseline latencies, ms")
    canary: list[Latency] = Field(max_length=MAX_SAMPLES, description="canary latencies, ms")
    failures: FailureInput | None = Field(
        default=None, description="[failures, count] per side, judged by Fisher's exact test"
    )
    direction: Direction = Field(
        default=Direction.INCREASE, description="which latency change is bad"
    )
    effect: EffectGate | None = Field(
        default=None, description="effect-size gate (default: mean_ratio, max 1, as Kayenta)"
    )
    confidence: float = Field(
        default=DEFAULT_CONFIDENCE, gt=0.5, lt=1, allow_inf_nan=False, strict=True
    )
    min_samples: int = Field(default=1, ge=1, le=MAX_SAMPLES, strict=True)


@router.post(
    "/judge",
    responses=problem_responses(
        body=True, notes={422: "invalid samples or knobs (the fields are named)"}
    ),
)
def judge_samples(body: JudgeRequest) -> dict[str, Any]:
    """Classify the canary against the baseline: pass, high, low or nodata, with the
    interval, effect size and p-values behind it (Kayenta's Mann-Whitney semantics)."""
    failures = (
        (
            FailureCounts(body.failures.baseline.failures, body.failures.baseline.count),
            FailureCounts(body.failures.canary.failures, body.failures.canary.count),
        )
        if body.failures is not None
        else None
    )
    try:
        verdict = judge(
            body.baseline,
            body.canary,
            direction=body.direction,
            effect=body.effect,
            confidence=body.confidence,
            min_samples=body.min_samples,
            failures=failures,
            failures_direction=body.failures.direction if body.failures else Direction.INCREASE,
        )
    except ValueError as exc:  # the model above should leave nothing for this
        raise ValidationFailed(f"cannot judge: {exc}") from exc
    return verdict.to_dict()
