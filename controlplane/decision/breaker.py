"""One breaker evaluation: does this window show the canary breaking the rule?

A list of guardrails: latency and failures from the samples, then one per provider
metric of the rule (metric_guardrails.py), each first checked against its bound and
then, where a test exists, required to be significant after a Holm correction across
every tested guardrail together.
The bound alone is what the rule states (architecture §6); the test is the guard against calling a
breach on noise (a window of 100 samples from a healthy canary shows P95 above the
threshold now and then). "Too few samples" and "no data" are verdicts of their own,
never a pass. A provider metric with no data is never a breach: under `no_data: hold`
it holds the look (verdict `held`, the metric named) until its timeout.

Each guardrail carries the action its breach calls for (the rule's `action` for
latency and failures, the metric's own for a provider metric); a breached
evaluation names the most severe of its breached guardrails' actions and which
guardrail chose it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from controlplane.decision import directional
from controlplane.decision.metric_guardrails import MetricJudgment, Status, judge_metrics
from controlplane.decision.stats import (
    ClusterEstimate,
    TestResult,
    cluster_log_mean,
    cluster_ratio,
    clustered_bound_test,
    clustered_comparison_test,
    failure_bound_test,
    failure_comparison_test,
    holm,
    latency_shift_test,
    quantile_exceedance_test,
)
from controlplane.kernel.metric_specs import GuardrailAction
from controlplane.kernel.rules import BreakerRule, Compare
from controlplane.kernel.snapshots import FIRST_BYTE, PERCENTILE_FIELDS, TOTAL, WindowSnapshot
from controlplane.kernel.units import Concentration, UnitSummary, concentration
from controlplane.providers.evidence import MetricEvidence

# Units are judged as independent (the exact per-request tests) while at least this
# share of the samples with a unit come from distinct units: at most one in ten
# shares its unit with another sample (docs/decisions/0012-cluster-robust-judgment.md)
INDEPENDENT_UNITS_SHARE = 0.9
# the evidence names a unit that makes at least this share of a window
DOMINANT_UNIT_SHARE = 0.2
# what a look derives from a window's contents, kept in its memo (WindowSnapshot.memo)
_SUMMARY = "breaker.latency_summary"
_UNITS = "breaker.unit_evidence"
_CONCENTRATION = "breaker.concentration"
_VARIANT = "breaker.variant_evidence"
_CLUSTER_RATIO = "breaker.cluster_ratio"
_CLUSTER_LOG_MEAN = "breaker.cluster_log_mean"
# the dicts inside a variant's evidence
_NESTED = ("total", "first_byte", "units")
_T = TypeVar("_T")


class Verdict(StrEnum):
    PASS = "pass"
    BREACH = "breach"
    TOO_FEW_SAMPLES = "too_few_samples"
    NO_DATA = "no_data"
    # the baseline's sidecars shed requests and the rule holds (decision 0025)
    OVERLOADED = "overloaded"
    # a provider metric has no data and its policy holds (no_data: hold)
    HELD = "held"


@dataclass(frozen=True)
class Guardrail:
    """One guardrail's outcome: over its bound (`exceeded`), and a breach after the test."""

    name: str
    basis: str
    observed: float | None
    bound: float | None
    exceeded: bool
    breached: bool
    test: TestResult | None = None
    p_adjusted: float | None = None
    note: str | None = None
    action: GuardrailAction | None = None
    # a provider metric's: judged, too_few, held or skipped (metric_guardrails.Status)
    status: str = Status.JUDGED
    # a provider metric's queries as sent, readings and counts
    metric: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "basis": self.basis,
            "observed": self.observed,
            "bound": self.bound,
            "exceeded": self.exceeded,
            "breached": self.breached,
            "test": self.test.to_dict() if self.test else None,
            "p_adjusted": self.p_adjusted,
            "note": self.note,
            # `_value_`: the value without the enum descriptor's call, at every look
            "action": self.action._value_ if self.action is not None else None,
        }
        if self.metric is not None:
            out |= {"status": self.status, "metric": self.metric}
        return out


@dataclass(frozen=True)
class Evaluation:
    verdict: Verdict
    reason: str
    guardrails: tuple[Guardrail, ...] = ()
    variants: dict[str, Any] = field(default_factory=dict)
    # a breach: the most severe action among the breached guardrails, and whose
    action: GuardrailAction | None = None
    action_by: str | None = None

    @property
    def breached(self) -> bool:
        return self.verdict is Verdict.BREACH

    @property
    def no_data_held(self) -> tuple[str, ...]:
        """The provider metrics holding this look for want of data (no_data: hold)."""
        return tuple(g.name for g in self.guardrails if g.status == Status.HELD)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict._value_,
            "reason": self.reason,
            "variants": self.variants,
            "guardrails": {g.name: g.to_dict() for g in self.guardrails},
        }
        if self.action is not None:
            out |= {"action": self.action.value, "action_by": self.action_by}
        return out


def tail_per_mille(percentile: float) -> int:
    """1 - q in thousandths (50 for P95, 1 for P99.9), so the comparison is integer-exact."""
    return round((100 - percentile) * 10)


def clustered_units(snap: WindowSnapshot | None) -> UnitSummary | None:
    """The snapshot's unit sums when its samples cluster by unit, else None.

    None also when the producer kept no unit sums or every sample is without a unit:
    those are judged per request, exactly, as they always were.
    """
    if snap is None or snap.units is None:
        return None
    with_unit = snap.units.unit_samples
    if with_unit == 0 or snap.units.distinct_units() >= INDEPENDENT_UNITS_SHARE * with_unit:
        return None
    return snap.units


def unit_evidence(snap: WindowSnapshot, *, concentrated: bool = False) -> dict[str, Any] | None:
    """Units behind a window: how many, how many samples had none, and (with
    `concentrated`, for the events: it costs a pass over the reservoir) the top units'
    shares and the effective number of units."""
    kept = _unit_counts(snap)
    if kept is None:
        return None
    evidence = dict(kept)
    if concentrated:
        evidence.update(_concentration(snap, 5).to_dict())
    return evidence


def _kept(snap: WindowSnapshot, key: Hashable, derive: Callable[[], _T]) -> _T:
    """`derive()` once per window's contents, kept in its memo under `key`."""
    memo = snap.memo
    found: _T | None = memo.get(key)
    if found is None:
        found = memo[key] = derive()
    return found


def _unit_counts(snap: WindowSnapshot) -> dict[str, Any] | None:
    """`unit_evidence` without the concentration, as kept: never to be handed out."""
    units = snap.units
    if units is None:
        return None
    return _kept(snap, _UNITS, lambda: {
        "samples_with_unit": units.unit_samples,
        "samples_without_unit": units.no_unit_samples,
        "distinct_units": units.distinct_units(),
        "judged_on": "units" if clustered_units(snap) is not None else "requests",
    })  # fmt: skip


def _cluster_ratio(snap: WindowSnapshot, column: int) -> ClusterEstimate:
    """`cluster_ratio` of the window's unit sums, estimated once per window."""
    units = snap.units
    assert units is not None
    return _kept(snap, (_CLUSTER_RATIO, column), lambda: cluster_ratio(units, column))


def _cluster_log_mean(snap: WindowSnapshot) -> ClusterEstimate:
    """`cluster_log_mean` of the window's unit sums, estimated once per window."""
    units = snap.units
    assert units is not None
    return _kept(snap, _CLUSTER_LOG_MEAN, lambda: cluster_log_mean(units))


def _concentration(snap: WindowSnapshot, top: int) -> Concentration:
    """`concentration` of the window's reservoir, counted once per window."""
    return _kept(snap, (_CONCENTRATION, top),
                 lambda: concentration(snap.reservoir_units, snap.count, top=top))  # fmt: skip


def _dominance_note(snap: WindowSnapshot, arm: str) -> str | None:
    found = _concentration(snap, 1)
    if found.top and found.top[0][1] >= DOMINANT_UNIT_SHARE:
        unit, share = found.top[0]
        return f"{share:.0%} of the {arm}'s window is one unit ({unit:08x})"
    return None


def _units_note(canary: WindowSnapshot, baseline: WindowSnapshot | None) -> str:
    parts = ["judged on units (cluster-robust)"]
    for snap, arm in ((canary, "canary"), (baseline, "baseline")):
        note = _dominance_note(snap, arm) if snap is not None else None
        if note:
            parts.append(note)
    return "; ".join(parts)


def latency_summary(snap: WindowSnapshot | None) -> dict[str, Any] | None:
    """One latency of a window, for the evidence: how many samples, mean, percentiles."""
    kept = _summary(snap)
    return dict(kept) if kept is not None else None


def _summary(snap: WindowSnapshot | None) -> dict[str, Any] | None:
    """`latency_summary` as kept: never to be handed out."""
    if snap is None:
        return None
    return _kept(snap, _SUMMARY, lambda: {
        "count": snap.count,
        "mean_ms": snap.mean_ms,
        **{name: getattr(snap, name) for name in PERCENTILE_FIELDS.values()},
    })  # fmt: skip


def variant_evidence(snap: WindowSnapshot | None, rule: BreakerRule) -> dict[str, Any] | None:
    """A variant's window as judged (the rule's latency), with both latencies beside."""
    if snap is None:
        return None
    # `_value_`: the member's value without the `value` descriptor's call, per look
    latency: str = rule.latency._value_
    percentile = rule.percentile
    kept = _kept(snap, (_VARIANT, latency, percentile),
                 lambda: _variant_contents(snap, latency, percentile))  # fmt: skip
    evidence = dict(kept)
    for name in _NESTED:  # each look its own nested dicts, as they were built before
        inner = evidence.get(name)
        if inner is not None:
            evidence[name] = dict(inner)
    # the instant last, as before: a restamped window's moves, its contents do not
    judged = snap.for_latency(latency)
    evidence["window_start"] = judged.window_start
    evidence["window_end"] = judged.window_end
    evidence["ts"] = judged.ts
    return evidence


def _variant_contents(snap: WindowSnapshot, latency: str, percentile: float) -> dict[str, Any]:
    """`variant_evidence` but for the window's span and instant (window_start,
    window_end, ts): what depends on the window's contents only."""
    # the kept summaries themselves: `variant_evidence` copies every nested dict
    both: dict[str, Any] = {}
    if snap.latency == TOTAL:  # a collector's window: it holds both latencies
        both = {
            "total": _summary(snap),
            "first_byte": _summary(snap.first_byte),
            "samples_without_first_byte": snap.missing_first_byte,
        }
    snap = snap.for_latency(latency)
    return {
        "latency": snap.latency,
        **both,
        "units": _unit_counts(snap),
        "count": snap.count,
        "failures": snap.failures,
        "failure_ratio": snap.failure_ratio,
        "p50_ms": snap.p50_ms,
        "p90_ms": snap.p90_ms,
        "p95_ms": snap.p95_ms,
        "p99_ms": snap.p99_ms,
        "p999_ms": snap.p999_ms,
        "percentile_ms": snap.percentile_ms(percentile),
        "threshold_ms": snap.threshold_ms,
        "above_threshold": snap.above_threshold,
        "above_threshold_fraction": snap.above_threshold_fraction,
        "threshold_exact": snap.threshold_exact,
        "reservoir_size": len(snap.reservoir_ms),
        "shed": snap.shed,
        "shed_share": snap.shed_share,
    }


def _counts_are_exact(snap: WindowSnapshot, rule: BreakerRule) -> str | None:
    """None when the above-threshold count decides the rule exactly, else why not."""
    if not snap.threshold_exact:
        return "the snapshot's above-threshold count is not exact"
    if snap.threshold_ms is None or not math.isclose(
        snap.threshold_ms, rule.threshold_ms, rel_tol=1e-9
    ):
        return (
            f"the snapshot counted above {snap.threshold_ms} ms, the rule says {rule.threshold_ms}"
        )
    return None


def _absolute_latency(canary: WindowSnapshot, rule: BreakerRule, test: bool) -> Guardrail:
    q = rule.percentile
    why_not = _counts_are_exact(canary, rule)
    if why_not is None:
        tail = tail_per_mille(q)
        # P_q > T  <=>  above / count > 1 - q/100, compared in integers
        exceeded = canary.above_threshold * 1000 > canary.count * tail
        units = clustered_units(canary)
        result: TestResult | None = None
        if test and units is not None:
            result = clustered_bound_test("latency", _cluster_ratio(canary, 2), tail / 1000)
        elif test:
            result = quantile_exceedance_test(canary.above_threshold, canary.count, tail / 1000)
        return Guardrail(
            name="latency",
            basis="exact_above_threshold_count",
            observed=canary.above_threshold_fraction,
            bound=tail / 1000,
            exceeded=exceeded,
            breached=exceeded,
            test=result,
            note=_units_note(canary, None) if units is not None and test else None,
        )
    reported = canary.percentile_ms(q)
    exceeded = reported is not None and reported > rule.threshold_ms
    return Guardrail(
        name="latency",
        basis="reported_percentile",
        observed=reported,
        bound=rule.threshold_ms,
        exceeded=exceeded,
        breached=exceeded,
        note=f"fell back to the reported P{q:g}: {why_not}",
    )


def _from_gate(name: str, gate: directional.Gate) -> Guardrail:
    """The hook for the rule's judgment knobs (direction, effect): see directional.py."""
    return Guardrail(
        name=name,
        basis=gate.basis,
        observed=gate.observed,
        bound=gate.bound,
        exceeded=gate.exceeded,
        breached=gate.exceeded,
        test=gate.test,
        note=gate.note,
    )


def _baseline_latency(
    canary: WindowSnapshot, baseline: WindowSnapshot, rule: BreakerRule, test: bool
) -> Guardrail:
    if directional.latency_knobs_set(rule):
        gate = directional.baseline_latency_gate(canary, baseline, rule, test)
        return _from_gate("latency", gate)
    q = rule.percentile
    c, b = canary.percentile_ms(q), baseline.percentile_ms(q)
    exceeded = c is not None and b is not None and c > rule.baseline_margin * b
    ratio = c / b if c is not None and b else None
    clustered = clustered_units(canary) is not None or clustered_units(baseline) is not None
    if clustered and canary.units is not None and baseline.units is not None:
        return Guardrail(
            name="latency",
            basis="percentile_ratio_and_log_mean_test",
            observed=ratio,
            bound=rule.baseline_margin,
            exceeded=exceeded,
            breached=exceeded,
            test=(
                clustered_comparison_test(
                    "latency",
                    _cluster_log_mean(canary),
                    _cluster_log_mean(baseline),
                    binary=False,
                )
                if test
                else None
            ),
            note=_units_note(canary, baseline) if test else None,
        )
    if not (canary.reservoir_ms and baseline.reservoir_ms):
        # no reservoir, no rank test: the ratio alone decides rather than never tripping
        return Guardrail(
            name="latency",
            basis="percentile_ratio",
            observed=ratio,
            bound=rule.baseline_margin,
            exceeded=exceeded,
            breached=exceeded,
            note="no reservoir in a snapshot: the rank test was not run",
        )
    return Guardrail(
        name="latency",
        basis="percentile_ratio_and_rank_test",
        observed=ratio,
        bound=rule.baseline_margin,
        exceeded=exceeded,
        breached=exceeded,
        test=latency_shift_test(canary.reservoir_ms, baseline.reservoir_ms) if test else None,
    )


def _failures(
    canary: WindowSnapshot, baseline: WindowSnapshot | None, rule: BreakerRule, test: bool
) -> Guardrail:
    knobs = directional.failure_knobs_set(rule)
    if knobs and rule.compare is Compare.BASELINE and baseline is not None:
        gate = directional.baseline_failure_gate(canary, baseline, rule, test)
        return _from_gate("failures", gate)
    exceeded = canary.failure_ratio > rule.failure_ratio
    result: TestResult | None = None
    versus = baseline if rule.compare is Compare.BASELINE else None
    clustered = canary.units is not None and (
        clustered_units(canary) is not None or clustered_units(versus) is not None
    )
    if versus is not None and versus.units is None:
        clustered = False  # a comparison needs both arms on the same footing
    if test and clustered:
        assert canary.units is not None
        if versus is not None and versus.units is not None:
            result = clustered_comparison_test(
                "failures",
                _cluster_ratio(canary, 1),
                _cluster_ratio(versus, 1),
                binary=True,
            )
        else:
            est = _cluster_ratio(canary, 1)
            result = clustered_bound_test("failures", est, rule.failure_ratio)
    elif test:
        if rule.compare is Compare.BASELINE and baseline is not None:
            result = failure_comparison_test(
                canary.failures, canary.count, baseline.failures, baseline.count
            )
        else:
            result = failure_bound_test(canary.failures, canary.count, rule.failure_ratio)
    basis = (
        "ratio_and_fisher_vs_baseline"
        if rule.compare is Compare.BASELINE
        else "ratio_and_binomial_vs_bound"
    )
    return Guardrail(
        name="failures",
        basis=basis,
        observed=canary.failure_ratio,
        bound=rule.failure_ratio,
        exceeded=exceeded,
        breached=exceeded,
        test=result,
        note=_units_note(canary, versus) if clustered and test else None,
    )


def _apply_tests(guardrails: list[Guardrail], alpha: float) -> tuple[Guardrail, ...]:
    tested = {g.name: g.test.p_value for g in guardrails if g.test is not None}
    adjusted = holm(tested)
    out = []
    for g in guardrails:
        if g.test is None:
            out.append(g)
            continue
        p_adj = adjusted[g.name]
        out.append(
            Guardrail(
                name=g.name,
                basis=g.basis,
                observed=g.observed,
                bound=g.bound,
                exceeded=g.exceeded,
                breached=g.exceeded and p_adj < alpha,
                test=g.test,
                p_adjusted=p_adj,
                note=g.note,
                action=g.action,
                status=g.status,
                metric=g.metric,
            )
        )
    return tuple(out)


def describe(g: Guardrail) -> str:
    """One guardrail in words, with its test and (a provider metric's) action."""

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.4g}"

    if g.metric is not None:
        return _describe_metric(g)
    text = f"{g.name} {fmt(g.observed)} vs bound {fmt(g.bound)} ({g.basis})"
    if g.test is not None:
        text += f", {g.test.method} p={g.test.p_value:.3g}, Holm p={fmt(g.p_adjusted)}"
    return text


def overloaded(
    canary: WindowSnapshot | None, baseline: WindowSnapshot, rule: BreakerRule
) -> Evaluation:
    """A look held for overload: neither breach nor pass, no test run.

    The baseline's window has shed requests: its admitted requests queued behind the
    overload, so neither arm's latency says what the version does (decision 0025)."""
    variants = {
        "canary": variant_evidence(canary, rule),
        "baseline": variant_evidence(baseline, rule),
    }
    reason = (
        f"overloaded: the baseline's sidecars shed {baseline.shed} requests in the window "
        f"({baseline.shed_share:.1%} of its requests); held, not judged (overload: hold)"
    )
    return Evaluation(Verdict.OVERLOADED, reason, variants=variants)


def evaluate(
    canary: WindowSnapshot | None,
    baseline: WindowSnapshot | None,
    rule: BreakerRule,
    *,
    always_test: bool = False,
    alpha: float | None = None,
    metrics: Mapping[str, MetricEvidence] | None = None,
    metrics_expired: Collection[str] = (),
    provider: bool = True,
    with_metrics: bool = True,
) -> Evaluation:
    """Judge one pair of windows, and the rule's provider metrics, against the rule.

    `alpha` is the significance this look is held to (the rule's by default); the
    rollout passes a smaller, per-look share of the rule's alpha (see rollout.py).
    `metrics` is each provider metric's latest evidence by name; `metrics_expired`
    names those whose no-data hold has timed out; `provider` is False when no
    metrics provider is configured (every metric then has no data). `with_metrics`
    False judges latency and failures alone (the fast window: a provider metric is
    judged once per look).

    Tests run only when a guardrail is over its bound (or `always_test`, at step
    gates): a test cannot turn a window within bounds into a breach, and skipping it
    keeps the every-250-ms evaluation cheap. When one runs, all run, so the Holm
    family is always every guardrail that can be tested.
    """
    variants = {
        "canary": variant_evidence(canary, rule),
        "baseline": variant_evidence(baseline, rule),
    }
    early, build = _samples(canary, baseline, rule)
    specs = rule.metrics if with_metrics else []
    if early is not None and not specs:
        return Evaluation(early[0], early[1], variants=variants)
    found: Mapping[str, MetricEvidence] = metrics if metrics is not None else {}

    def build_all(test: bool) -> list[Guardrail]:
        samples = build(test) if build is not None else []
        judged = judge_metrics(specs, found, test=test, expired=metrics_expired, provider=provider)
        return [*samples, *(_from_metric(m) for m in judged)]

    guardrails = build_all(always_test)
    if not always_test and any(g.exceeded for g in guardrails):
        guardrails = build_all(True)
    judged = _apply_tests(guardrails, rule.alpha if alpha is None else alpha)
    breached = [g for g in judged if g.breached]
    if breached:
        chosen = _most_severe(breached)
        reason = "breach: " + "; ".join(describe(g) for g in breached)
        if chosen.action is not None:
            reason += f" -> {chosen.action.value} ({chosen.name})"
        return Evaluation(Verdict.BREACH, reason, judged, variants, chosen.action, chosen.name)
    metric_text = [describe(g) for g in judged if g.metric is not None]
    if early is not None:
        return Evaluation(early[0], "; ".join([early[1], *metric_text]), judged, variants)
    held = [g for g in judged if g.status == Status.HELD]
    if held:
        names = ", ".join(g.name for g in held)
        reason = f"held: no data for {names} (no_data: hold); " + "; ".join(
            describe(g) for g in judged
        )
        return Evaluation(Verdict.HELD, reason, judged, variants)
    return Evaluation(
        Verdict.PASS, "pass: " + "; ".join(describe(g) for g in judged), judged, variants
    )


def _samples(
    canary: WindowSnapshot | None, baseline: WindowSnapshot | None, rule: BreakerRule
) -> tuple[tuple[Verdict, str] | None, Callable[[bool], list[Guardrail]] | None]:
    """The samples' verdict when they cannot be judged, else how to build their two
    guardrails (latency, failures) with or without their tests."""
    # the rule's latency: a first_byte rule judges the samples that carry a first byte
    whole = canary
    latency: str = rule.latency._value_
    canary = canary.for_latency(latency) if canary is not None else None
    baseline = baseline.for_latency(latency) if baseline is not None else None
    if canary is None or canary.count == 0:
        reason = "no canary samples in the window"
        if whole is not None and whole.count and latency == FIRST_BYTE:
            reason = (
                f"no canary samples with a first byte in the window ({whole.count} without "
                "one, from sidecars sending sample batches older than version 2)"
            )
        return (Verdict.NO_DATA, reason), None
    if canary.count < rule.min_samples:
        return (
            Verdict.TOO_FEW_SAMPLES,
            f"{canary.count} canary samples, fewer than min_samples {rule.min_samples}",
        ), None
    baseline_mode = rule.compare is Compare.BASELINE
    if baseline_mode and (baseline is None or baseline.count < rule.min_samples):
        n = 0 if baseline is None else baseline.count
        return (
            Verdict.TOO_FEW_SAMPLES,
            f"{n} baseline samples, fewer than min_samples {rule.min_samples}",
        ), None
    judged_canary = canary

    def build(test: bool) -> list[Guardrail]:
        if baseline_mode:
            assert baseline is not None
            latency = _baseline_latency(judged_canary, baseline, rule, test)
        else:
            latency = _absolute_latency(judged_canary, rule, test)
        failures = _failures(judged_canary, baseline, rule, test)
        return [_with_action(latency, rule.action), _with_action(failures, rule.action)]

    return None, build


def _with_action(g: Guardrail, action: GuardrailAction) -> Guardrail:
    """`replace(g, action=action)` without its __init__ (a Guardrail has no checks of
    its own): twice per evaluation, at every look."""
    copy = object.__new__(Guardrail)
    copy.__dict__.update(g.__dict__)
    copy.__dict__["action"] = action
    return copy


def _from_metric(m: MetricJudgment) -> Guardrail:
    return Guardrail(
        name=m.spec.name,
        basis=m.basis,
        observed=m.observed,
        bound=m.bound,
        exceeded=m.exceeded,
        breached=m.exceeded,
        test=m.test,
        note=m.note,
        action=m.spec.action,
        status=m.status,
        metric=m.evidence,
    )


def _most_severe(breached: Sequence[Guardrail]) -> Guardrail:
    """The breached guardrail whose action is the most severe; the first on a tie."""
    best = breached[0]
    for g in breached[1:]:
        if g.action is not None and (
            best.action is None or g.action.severity > best.action.severity
        ):
            best = g
    return best


def _describe_metric(g: Guardrail) -> str:
    """A provider guardrail in words: "error_ratio 4.1% > baseline 0.9% + 1% (ratio,
    fisher_exact_greater p=2e-09): stop"."""
    assert g.metric is not None
    if g.status != Status.JUDGED:
        return f"{g.name}: {g.note}"
    kind, compare = g.metric["kind"], g.metric["compare"]
    ratio = kind == "ratio"

    def fmt(v: float | None) -> str:
        if v is None:
            return "n/a"
        return f"{v:.2%}" if ratio else f"{v:.4g}"

    below = g.bound is not None and g.observed is not None and g.observed < g.bound
    side = ("<" if below else ">") if g.exceeded else "within"
    if compare == "baseline":
        base = (g.metric.get("baseline") or {}).get("value")
        margin = g.metric.get("margin", 0.0)
        sign = "-" if below else "+"
        if ratio:
            what = f"baseline {fmt(base)} {sign} {fmt(margin)}"
        else:
            what = f"baseline {fmt(base)} {sign} {margin:.4g} share ({fmt(g.bound)})"
        text = f"{g.name} {fmt(g.observed)} {side} {what}"
    else:
        text = f"{g.name} {fmt(g.observed)} {side} bound {fmt(g.bound)}"
    if g.test is not None:
        detail = f"{g.test.method} p={g.test.p_value:.2g}"
        if g.p_adjusted is not None:
            detail += f", Holm p={g.p_adjusted:.2g}"
    else:
        detail = "no significance test"
    action = g.action.value if g.action is not None else "-"
    return f"{text} ({kind}, {detail}): {action}"
