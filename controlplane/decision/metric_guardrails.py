"""Provider metrics as guardrails: one `MetricSpec` and its latest evidence, judged.

Pure: the values come in as `MetricEvidence` (providers/evidence.py), read at the
edge; this module only compares and tests them (decision 0048).

- ratio: the failures' exact tests. Against a bound, the one-sided binomial test of
  H0 "bad share <= bound". Against the baseline, Fisher's exact test, one-sided,
  with the margin entering as a shift of the null: H0 "canary <= baseline + margin"
  is tested on the table whose baseline bad count is raised by ceil(margin x its
  total). Rounding up and Fisher's pooled variance (larger than the baseline's own
  below a share of one half) both err on the side of not breaching. With margin 0
  it is exactly the failures' test. Counts come as floats (Prometheus' increase()
  extrapolates): rounded to whole events, bad clamped to total. Fewer than
  `min_count` events in an arm judged: too few, not judged.
- gauge and histogram: the value against the bound, or against the baseline's value
  widened by the margin as a share (b + |b| x margin above, b - |b| x margin below).
  No sample size, so no test: the breach is the comparison, and it needs the rule's
  `consecutive_breaches` looks in a row, as latency's fallback does.
- no data (either arm): never a breach. `hold`: the guardrail is held, and holds the
  look (not pass, not breach) until `no_data_timeout_sec` has passed, after which
  the step is judged without it (as under `ignore`, from the start).

A tested guardrail joins the rule's Holm family with latency and failures
(breaker.py), so the family-wise error control covers the provider's metrics too.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.decision.stats import TestResult, failure_bound_test, failure_comparison_test
from controlplane.kernel.judgment import Direction
from controlplane.kernel.metric_specs import MetricCompare, MetricKind, MetricNoData, MetricSpec
from controlplane.providers.evidence import MetricEvidence, Reading

NO_PROVIDER = "no metric provider configured (CANARY_PROMETHEUS_URL)"
NOT_READ = "not read yet"


class Status:
    """How a provider guardrail was judged (the `status` of its evidence)."""

    JUDGED = "judged"
    TOO_FEW = "too_few"  # a ratio with fewer than min_count events in an arm
    HELD = "held"  # no data, no_data: hold, within its timeout: holds the look
    SKIPPED = "skipped"  # no data, judged without it (ignore, or the hold timed out)


@dataclass(frozen=True)
class MetricJudgment:
    """One metric's comparison, before the family's Holm correction."""

    spec: MetricSpec
    status: str
    observed: float | None
    bound: float | None
    exceeded: bool
    basis: str
    test: TestResult | None
    note: str | None
    evidence: dict[str, Any]


def judge_metric(
    spec: MetricSpec,
    found: MetricEvidence | None,
    *,
    test: bool,
    expired: bool = False,
    provider: bool = True,
) -> MetricJudgment:
    """Judge one metric from its latest evidence (None: nothing read).

    `expired`: its no-data hold has outlasted `no_data_timeout_sec` (the rollout
    keeps that clock). `provider`: False when no metrics provider is configured.
    """
    evidence: dict[str, Any] = {
        "kind": spec.kind.value,
        "compare": spec.compare.value,
        "direction": spec.direction.value,
        "margin": spec.margin,
        "bound": spec.bound,
        "action": spec.action.value,
        "queries": list(found.queries) if found is not None else [],
        "canary": found.canary.to_dict() if found is not None else None,
        "baseline": found.baseline.to_dict() if found is not None else None,
        "read_at": found.read_at if found is not None else None,
    }
    why = _no_data_reason(spec, found, provider)
    if why is not None:
        held = spec.no_data is MetricNoData.HOLD and not expired
        status = Status.HELD if held else Status.SKIPPED
        after = (
            "held (no_data: hold)"
            if held
            else (
                "judged without it (no_data: hold, timed out)"
                if spec.no_data is MetricNoData.HOLD
                else "judged without it (no_data: ignore)"
            )
        )
        note = f"no data: {why}; {after}"
        return MetricJudgment(
            spec, status, None, None, False, "no_data", None, note, {**evidence, "no_data": why}
        )
    assert found is not None
    if spec.kind is MetricKind.RATIO:
        return _ratio(spec, found, evidence, test)
    return _value(spec, found, evidence)


def _no_data_reason(spec: MetricSpec, found: MetricEvidence | None, provider: bool) -> str | None:
    if not provider:
        return NO_PROVIDER
    if found is None:
        return NOT_READ
    for arm, reading in (("canary", found.canary), ("baseline", found.baseline)):
        needed = spec.compare is MetricCompare.BASELINE or arm == "canary"
        if not needed:
            continue
        if reading.no_data or reading.value is None or not math.isfinite(reading.value):
            return f"{arm}: {reading.reason or 'no value'}"
        if spec.kind is MetricKind.RATIO and not _has_counts(reading):
            return f"{arm}: no counts for a ratio"
    return None


def _has_counts(r: Reading) -> bool:
    return (
        r.bad is not None
        and r.total is not None
        and math.isfinite(r.bad)
        and math.isfinite(r.total)
        and r.bad >= 0
        and r.total >= 0
    )


def _counts(r: Reading) -> tuple[int, int]:
    assert r.bad is not None and r.total is not None
    total = round(r.total)
    return min(round(r.bad), total), total


def _ratio(
    spec: MetricSpec, found: MetricEvidence, evidence: dict[str, Any], test: bool
) -> MetricJudgment:
    c_bad, c_total = _counts(found.canary)
    versus = spec.compare is MetricCompare.BASELINE
    b_bad, b_total = _counts(found.baseline) if versus else (0, 0)
    evidence = {
        **evidence,
        "counts": {
            "canary": [c_bad, c_total],
            **({"baseline": [b_bad, b_total]} if versus else {}),
        },
    }
    short = [
        f"{arm} {n} events"
        for arm, n in (("canary", c_total), ("baseline", b_total))
        if (arm == "canary" or versus) and n < spec.min_count
    ]
    if short:
        note = f"too few: {', '.join(short)}, fewer than min_count {spec.min_count}"
        return MetricJudgment(
            spec, Status.TOO_FEW, None, None, False, "too_few", None, note, evidence
        )
    observed = c_bad / c_total
    up = spec.direction is not Direction.DECREASE
    down = spec.direction is not Direction.INCREASE
    if versus:
        base = b_bad / b_total
        hi, lo = base + spec.margin, base - spec.margin
        basis = "ratio_and_fisher_vs_baseline"
    else:
        assert spec.bound is not None
        hi = lo = spec.bound
        basis = "ratio_and_binomial_vs_bound"
    over, under = up and observed > hi, down and observed < lo
    bound = lo if under or not up else hi
    result: TestResult | None = None
    if test:
        sides = []
        if up:
            sides.append(_ratio_test(spec, c_bad, c_total, b_bad, b_total, versus, upward=True))
        if down:
            sides.append(_ratio_test(spec, c_bad, c_total, b_bad, b_total, versus, upward=False))
        result = min(sides, key=lambda r: r.p_value)
        if len(sides) == 2:  # either way is bad: Bonferroni over the two sides
            result = TestResult(
                result.name,
                result.method + "_either",
                result.statistic,
                min(1.0, 2 * result.p_value),
            )
    return MetricJudgment(
        spec, Status.JUDGED, observed, bound, over or under, basis, result, None, evidence
    )


def _ratio_test(
    spec: MetricSpec,
    c_bad: int,
    c_total: int,
    b_bad: int,
    b_total: int,
    versus: bool,
    *,
    upward: bool,
) -> TestResult:
    if not versus:
        assert spec.bound is not None
        if upward:
            found = failure_bound_test(c_bad, c_total, spec.bound)
        else:  # a share too low is the good events' share too high
            found = failure_bound_test(c_total - c_bad, c_total, 1 - spec.bound)
        return TestResult(spec.name, found.method, found.statistic, found.p_value)
    shift = math.ceil(spec.margin * b_total - 1e-9)
    if upward:  # H0: canary <= baseline + margin
        found = failure_comparison_test(c_bad, c_total, min(b_bad + shift, b_total), b_total)
    else:  # H0: canary >= baseline - margin: the baseline's share above the canary's
        found = failure_comparison_test(max(b_bad - shift, 0), b_total, c_bad, c_total)
    method = found.method if shift == 0 else f"{found.method}_margin"
    return TestResult(spec.name, method, found.statistic, found.p_value)


def _value(spec: MetricSpec, found: MetricEvidence, evidence: dict[str, Any]) -> MetricJudgment:
    value = found.canary.value
    assert value is not None
    up = spec.direction is not Direction.DECREASE
    down = spec.direction is not Direction.INCREASE
    if spec.compare is MetricCompare.BASELINE:
        base = found.baseline.value
        assert base is not None
        hi, lo = base + abs(base) * spec.margin, base - abs(base) * spec.margin
        basis = f"{spec.kind.value}_vs_baseline"
    else:
        assert spec.bound is not None
        hi = lo = spec.bound
        basis = f"{spec.kind.value}_vs_bound"
    over, under = up and value > hi, down and value < lo
    bound = lo if under or not up else hi
    note = "no sample size: no significance test, a breach needs consecutive_breaches readings"
    return MetricJudgment(
        spec, Status.JUDGED, value, bound, over or under, basis, None, note, evidence
    )


def judge_metrics(
    specs: Collection[MetricSpec],
    metrics: Mapping[str, MetricEvidence],
    *,
    test: bool,
    expired: Collection[str] = (),
    provider: bool = True,
) -> list[MetricJudgment]:
    return [
        judge_metric(
            s, metrics.get(s.name), test=test, expired=s.name in expired, provider=provider
        )
        for s in specs
    ]


def no_data_names(
    specs: Collection[MetricSpec], metrics: Mapping[str, MetricEvidence], *, provider: bool = True
) -> dict[str, str]:
    """The metrics with no data now, and why: the rollout keeps their clocks."""
    out = {}
    for s in specs:
        why = _no_data_reason(s, metrics.get(s.name), provider)
        if why is not None:
            out[s.name] = why
    return out


__all__ = [
    "NO_PROVIDER",
    "MetricJudgment",
    "Status",
    "judge_metric",
    "judge_metrics",
    "no_data_names",
]
