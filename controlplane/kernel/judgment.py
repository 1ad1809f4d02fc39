"""Kayenta-compatible judgment knobs: which direction is worse, and an effect-size gate.

Shared by the breaker rule (`BreakerRule.direction`, `BreakerRule.effect`) and the
one-shot judge (`POST /v1/judge`, `canary judge`), so both read the same words the
same way. See docs/decisions/0013-kayenta-compatible-judgment.md.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

# the percentiles a window snapshot reports (and so the ones a rule may compare)
EFFECT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99, 99.9)
# a ratio gate beyond a million-fold is a typo, not a tolerance
MAX_RATIO = 1e6

FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]


class Direction(StrEnum):
    """Which change of a metric is bad: Kayenta's `direction` of a metric."""

    INCREASE = "increase"
    DECREASE = "decrease"
    EITHER = "either"

    @property
    def flags_high(self) -> bool:
        return self is not Direction.DECREASE

    @property
    def flags_low(self) -> bool:
        return self is not Direction.INCREASE


class EffectKind(StrEnum):
    """How the size of a change is measured, canary against baseline."""

    MEAN_RATIO = "mean_ratio"  # mean(canary) / mean(baseline), Kayenta's meanRatio
    PERCENTILE_RATIO = "percentile_ratio"  # P_q(canary) / P_q(baseline)
    CLES = "cles"  # P(canary > baseline) + P(tie) / 2, Kayenta's cles


class EffectGate(BaseModel):
    """A change counts only when its effect size is beyond the allowed one.

    `max` is the largest allowed effect upwards (Kayenta's `allowedIncrease`), `min`
    the smallest allowed downwards (`allowedDecrease`); `min` defaults to the mirror
    of `max` (1 / max for ratios, 1 - max for CLES). An effect equal to the bound is
    allowed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: EffectKind
    max: FiniteFloat = Field(description="largest allowed effect upwards")
    min: FiniteFloat | None = Field(
        default=None, description="smallest allowed effect downwards (default: the mirror)"
    )
    percentile: FiniteFloat | None = Field(
        default=None,
        description="for percentile_ratio: which percentile (default P95)",
        json_schema_extra={"enum": [*EFFECT_PERCENTILES, None]},
    )

    @model_validator(mode="after")
    def _bounded(self) -> EffectGate:
        if self.kind is EffectKind.CLES:
            if not 0.5 <= self.max <= 1.0:
                raise ValueError("effect.max for cles must be within [0.5, 1]")
            if self.min is not None and not 0.0 <= self.min <= 0.5:
                raise ValueError("effect.min for cles must be within [0, 0.5]")
        else:
            if not 1.0 <= self.max <= MAX_RATIO:
                raise ValueError(f"effect.max for a ratio must be within [1, {MAX_RATIO:g}]")
            if self.min is not None and not 1 / MAX_RATIO <= self.min <= 1.0:
                raise ValueError(f"effect.min for a ratio must be within [{1 / MAX_RATIO:g}, 1]")
        if self.percentile is not None:
            if self.kind is not EffectKind.PERCENTILE_RATIO:
                raise ValueError("effect.percentile is only for kind percentile_ratio")
            if self.percentile not in EFFECT_PERCENTILES:
                allowed = ", ".join(f"{q:g}" for q in EFFECT_PERCENTILES)
                raise ValueError(f"effect.percentile must be one of {allowed}")
        return self

    @property
    def upper(self) -> float:
        return self.max

    @property
    def lower(self) -> float:
        if self.min is not None:
            return self.min
        return 1.0 - self.max if self.kind is EffectKind.CLES else 1.0 / self.max


class GuardrailDirections(BaseModel):
    """Per guardrail, which change is bad; `increase` for both is the product's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency: Direction = Direction.INCREASE
    failures: Direction = Direction.INCREASE

    @property
    def is_default(self) -> bool:
        return self.latency is Direction.INCREASE and self.failures is Direction.INCREASE
