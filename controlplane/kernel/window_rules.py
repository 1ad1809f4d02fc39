"""The window rule of one experiment (architecture §4): what the collectors need of the
rule in force for it, under `<prefix>/windows/<experiment>`.

An experiment may carry its own breaker rule (kept in SQL only), overriding its
service's rule in etcd. The collectors size windows, count failures and make the exact
above-threshold counts from the rule in force, so the leader's reconciler publishes
the three fields they use from it, per running experiment with its own rule; a
collector prefers it to the service's rule for that experiment. A new key beside
`rules/` and `routes/`: components that do not know it never read it.

Untrusted like every etcd value: strict types, the breaker rule's own bounds, no
other fields.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.rules import (
    BreakerRule,
    GrpcFailureCodes,
    check_grpc_codes,
    pydantic_field_errors,
)
from controlplane.kernel.values import MAX_THRESHOLD_MS

MAX_VALUE_BYTES = 16_384  # 500 statuses fit many times over


class WindowRule(BaseModel):
    """window_sec, threshold_ms, failure_statuses and grpc_failure_codes of the rule in
    force. `grpc_failure_codes` is written only when it is not the default, so a
    collector that predates the field still reads the rules that do not use it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_sec: int = Field(ge=1, le=3600, strict=True)
    threshold_ms: float = Field(gt=0, le=MAX_THRESHOLD_MS, strict=True, allow_inf_nan=False)
    failure_statuses: list[Annotated[int, Field(strict=True)]] | Literal["5xx"] = Field(
        max_length=500
    )
    grpc_failure_codes: GrpcFailureCodes = "nonzero"

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

    @classmethod
    def of(cls, rule: BreakerRule) -> WindowRule:
        statuses = rule.failure_statuses
        codes = rule.grpc_failure_codes
        return cls(
            window_sec=rule.window_sec,
            threshold_ms=rule.threshold_ms,
            failure_statuses=statuses if statuses == "5xx" else sorted(set(statuses)),
            grpc_failure_codes=codes if codes == "nonzero" else sorted(set(codes)),
        )

    def to_json(self) -> str:
        if self.grpc_failure_codes == "nonzero":
            return self.model_dump_json(exclude={"grpc_failure_codes"})
        return self.model_dump_json()


def parse_window_rule(raw: bytes | str | dict[str, Any]) -> WindowRule:
    """Parse a window rule read from etcd; raises ValidationFailed naming the fields."""
    if isinstance(raw, bytes | str) and len(raw) > MAX_VALUE_BYTES:
        raise ValidationFailed(f"window rule of {len(raw)} bytes is over {MAX_VALUE_BYTES}")
    try:
        data = json.loads(raw) if isinstance(raw, bytes | str) else raw
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationFailed(f"window rule is not JSON: {exc}") from exc
    try:
        return WindowRule.model_validate(data)
    except ValidationError as exc:
        raise ValidationFailed("invalid window rule", pydantic_field_errors(exc)) from exc
