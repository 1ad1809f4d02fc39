"""A rule's provider metrics (architecture §6): what to measure beside latency and failures.

A `BreakerRule` may carry `metrics:`, each a guardrail judged from a metric provider
(decision 0048) — today Prometheus — beside the two the samples give:

```yaml
metrics:
  - name: error_ratio
    kind: ratio                 # bad / total counts: judged with the failures' tests
    query: sum(increase(http_requests_total{app="shop",variant="$variant",code=~"5.."}[1m]))
    total_query: sum(increase(http_requests_total{app="shop",variant="$variant"}[1m]))
    compare: baseline           # or absolute, with `bound`
    margin: 0.01                # ratio: bad above the baseline's + 0.01 (gauge and
                                # histogram: a share, baseline * (1 + margin))
    action: stop                # pause | step_back | stop | rollback
  - name: memory
    kind: gauge
    query: max(process_resident_memory_bytes{app="shop",variant="$variant"})
    bound: 512000000            # absolute: canary bad above it
    action: pause
    no_data: hold
```

`$variant` is the one placeholder: it must stand inside a double-quoted label value
(`"$variant"`), and the variant's name is substituted there escaped as a PromQL
string (`providers/prometheus.py`); the rest of the query is the rule author's text
and is never templated. `$window` may stand where a range duration goes (`[$window]`)
and becomes the rule's `window_sec` as `<n>s`.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controlplane.kernel.judgment import Direction
from controlplane.kernel.values import MAX_COUNT, MAX_DURATION_SEC

MAX_METRICS = 16
MAX_QUERY = 4096
VARIANT_PLACEHOLDER = "$variant"
WINDOW_PLACEHOLDER = "$window"
# names the samples' own guardrails use: a provider metric may not shadow them
RESERVED_NAMES = frozenset({"latency", "failures"})
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# a `$` followed by a word is a placeholder: only ours are allowed
_PLACEHOLDER = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")

FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]


class MetricKind(StrEnum):
    RATIO = "ratio"  # `query` counts the bad events, `total_query` all of them
    GAUGE = "gauge"  # one value per variant (memory, saturation, a business rate)
    HISTOGRAM = "histogram"  # a quantile the query computes (histogram_quantile)


class MetricCompare(StrEnum):
    ABSOLUTE = "absolute"  # the canary's value against `bound`
    BASELINE = "baseline"  # the canary's value against the baseline's, with `margin`


class GuardrailAction(StrEnum):
    """What a breach of the guardrail does (decision 0049), mildest first."""

    PAUSE = "pause"  # hold the weight, stop advancing; resume when clean (or by hand)
    STEP_BACK = "step_back"  # the previous step's weight, then on as usual
    STOP = "stop"  # cut the canary to 0, cooldown, half-open probe (the breaker)
    ROLLBACK = "rollback"  # rolled back at once, no probe

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {
    GuardrailAction.PAUSE: 0,
    GuardrailAction.STEP_BACK: 1,
    GuardrailAction.STOP: 2,
    GuardrailAction.ROLLBACK: 3,
}


class MetricNoData(StrEnum):
    """A metric with no data (Prometheus down, slow, or an empty answer): never a breach."""

    HOLD = "hold"  # the step waits (no advance), the look is neither pass nor breach
    IGNORE = "ignore"  # judged without it: the other guardrails decide


def query_problem(query: str, *, needs_variant: bool = True) -> str | None:
    """Why a query is refused, or None. Only our placeholders, `$variant` only inside
    a double-quoted label value, and nothing a PromQL lexer would not take as text."""
    if not query.strip():
        return "empty query"
    if len(query) > MAX_QUERY:
        return f"longer than {MAX_QUERY} characters"
    if any(ord(c) < 32 and c not in "\t" for c in query):
        return "control characters"
    for match in _PLACEHOLDER.finditer(query):
        word = match.group(0)
        if word not in (VARIANT_PLACEHOLDER, WINDOW_PLACEHOLDER):
            return f"unknown placeholder {word} (only $variant and $window)"
        if word == VARIANT_PLACEHOLDER:
            start, end = match.span()
            if query[start - 1 : start] != '"' or query[end : end + 1] != '"':
                return 'write $variant as a whole label value: variant="$variant"'
        else:
            start, end = match.span()
            if query[start - 1 : start] != "[" or query[end : end + 1] not in ("]", ":"):
                return "write $window as a range: [$window]"
    if needs_variant and VARIANT_PLACEHOLDER not in query:
        return "the query must select the variant with a label value \"$variant\""
    return None


class MetricSpec(BaseModel):
    """One provider metric of a rule, judged as a guardrail."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the guardrail's name: ^[a-z][a-z0-9_]{0,62}$, not "
                      "latency or failures")
    provider: str = Field(default="prometheus", description="where the metric is read")
    kind: MetricKind
    query: str = Field(description="PromQL; for ratio the bad events' count")
    total_query: str | None = Field(default=None, description="ratio: every event's count")
    compare: MetricCompare = MetricCompare.ABSOLUTE
    bound: FiniteFloat | None = Field(default=None, description="absolute: the bad side "
                                      "starts beyond it")
    margin: FiniteFloat = Field(default=0.0, ge=0, le=1e6, description="baseline: how far "
                                "past the baseline's value is still fine (ratio: added, "
                                "canary > baseline + margin; gauge and histogram: a share, "
                                "canary > baseline * (1 + margin))")
    direction: Direction = Field(default=Direction.INCREASE, description="which change is "
                                 "bad: increase, decrease or either")
    interval_sec: float = Field(default=15.0, ge=1, le=3600, strict=True, allow_inf_nan=False,
                                description="how often the provider is asked")
    min_count: int = Field(default=100, ge=1, le=MAX_COUNT, strict=True,
                           description="ratio: no verdict on fewer events")
    no_data: MetricNoData = MetricNoData.HOLD
    no_data_timeout_sec: float = Field(default=300, gt=0, le=MAX_DURATION_SEC, strict=True,
                                       allow_inf_nan=False, description="hold: how long "
                                       "before the step is judged without it")
    action: GuardrailAction = GuardrailAction.STOP

    @model_validator(mode="after")
    def _consistent(self) -> MetricSpec:
        if not _NAME.match(self.name) or self.name in RESERVED_NAMES:
            raise ValueError(f"metric name {self.name!r}: ^[a-z][a-z0-9_]{{0,62}}$, not "
                             "latency or failures")
        if self.provider != "prometheus":
            raise ValueError(f"unknown provider {self.provider!r} (prometheus)")
        problem = query_problem(self.query)
        if problem:
            raise ValueError(f"query: {problem}")
        if self.kind is MetricKind.RATIO:
            if self.total_query is None:
                raise ValueError("a ratio needs total_query (every event's count)")
            problem = query_problem(self.total_query)
            if problem:
                raise ValueError(f"total_query: {problem}")
        elif self.total_query is not None:
            raise ValueError("total_query is for kind: ratio only")
        if self.compare is MetricCompare.ABSOLUTE and self.bound is None:
            raise ValueError("compare: absolute needs a bound")
        if self.compare is MetricCompare.BASELINE and self.bound is not None:
            raise ValueError("bound is for compare: absolute (baseline uses margin)")
        if self.kind is MetricKind.RATIO and self.bound is not None and not 0 <= self.bound <= 1:
            raise ValueError("a ratio's bound is between 0 and 1")
        return self


def check_unique(metrics: list[MetricSpec]) -> list[MetricSpec]:
    if len(metrics) > MAX_METRICS:
        raise ValueError(f"at most {MAX_METRICS} metrics")
    names = [m.name for m in metrics]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"metric names repeat: {', '.join(dupes)}")
    return metrics


__all__ = [
    "MAX_METRICS",
    "RESERVED_NAMES",
    "VARIANT_PLACEHOLDER",
    "WINDOW_PLACEHOLDER",
    "GuardrailAction",
    "MetricCompare",
    "MetricKind",
    "MetricNoData",
    "MetricSpec",
    "check_unique",
    "query_problem",
]
