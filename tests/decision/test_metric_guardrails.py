"""Provider metrics as guardrails: every kind, comparison, direction, no-data policy
and action, from MetricEvidence values built here (the decision core is pure)."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.decision.breaker import Verdict, evaluate
from controlplane.decision.metric_guardrails import NO_PROVIDER, Status, judge_metric
from controlplane.kernel.metric_specs import GuardrailAction, MetricSpec
from controlplane.providers.evidence import MetricEvidence, Reading
from tests.decision.factory import T0, healthy, rule, slow

Q = 'sum(rate(bad{variant="$variant"}[$window]))'
TQ = 'sum(rate(all{variant="$variant"}[$window]))'


def spec(**kw: Any) -> MetricSpec:
    base: dict[str, Any] = {"name": "m", "kind": "gauge", "query": Q, "bound": 100.0}
    if kw.get("kind") == "ratio":
        base |= {"total_query": TQ, "bound": 0.05}
    if kw.get("compare") == "baseline":
        base.pop("bound")
    return MetricSpec(**(base | kw))


def value(canary: float, baseline: float | None = None, name: str = "m") -> MetricEvidence:
    b = Reading(baseline) if baseline is not None else Reading.missing("not asked")
    return MetricEvidence(name, Reading(canary), b, T0, ("q(canary)", "q(baseline)"))


def counts(cb: int, ct: int, bb: int = 0, bt: int = 0, name: str = "m") -> MetricEvidence:
    def r(bad: int, total: int) -> Reading:
        return Reading(bad / total if total else 0.0, float(bad), float(total))

    return MetricEvidence(name, r(cb, ct), r(bb, bt), T0, ("bad(canary)", "all(canary)"))


# ---------------------------------------------------------------- gauge and histogram


@pytest.mark.parametrize("kind", ["gauge", "histogram"])
@pytest.mark.parametrize(
    ("direction", "canary", "exceeded"),
    [
        ("increase", 101.0, True),
        ("increase", 99.0, False),
        ("decrease", 99.0, True),
        ("decrease", 101.0, False),
        ("either", 101.0, True),
        ("either", 99.0, True),
        ("either", 100.0, False),
    ],
)
def test_a_value_against_its_bound_respects_the_direction(
    kind: str, direction: str, canary: float, exceeded: bool
) -> None:
    j = judge_metric(spec(kind=kind, direction=direction), value(canary), test=True)
    assert j.status == Status.JUDGED
    assert j.exceeded is exceeded
    assert j.test is None  # no sample size: no significance test
    assert j.note is not None and "no significance test" in j.note


@pytest.mark.parametrize(
    ("direction", "canary", "baseline", "exceeded"),
    [
        ("increase", 121.0, 100.0, True),  # above 100 * (1 + 0.2)
        ("increase", 119.0, 100.0, False),
        ("decrease", 79.0, 100.0, True),  # below 100 * (1 - 0.2)
        ("decrease", 81.0, 100.0, False),
        ("either", 79.0, 100.0, True),
        ("increase", -79.0, -100.0, True),  # a negative baseline widens by its size
        ("increase", -81.0, -100.0, False),
    ],
)
def test_a_value_against_the_baseline_is_a_share_margin(
    direction: str, canary: float, baseline: float, exceeded: bool
) -> None:
    s = spec(compare="baseline", margin=0.2, direction=direction)
    j = judge_metric(s, value(canary, baseline), test=True)
    assert j.exceeded is exceeded


# ---------------------------------------------------------------- ratio


def test_a_ratio_over_its_bound_is_tested_with_the_failures_binomial_test() -> None:
    j = judge_metric(spec(kind="ratio"), counts(80, 1000), test=True)
    assert j.exceeded and j.test is not None
    assert j.test.method == "binomial_bound" and j.test.p_value < 1e-4
    barely = judge_metric(spec(kind="ratio"), counts(52, 1000), test=True)
    assert barely.exceeded and barely.test is not None and barely.test.p_value > 0.3


def test_a_ratio_too_low_is_judged_when_decrease_is_bad() -> None:
    s = spec(kind="ratio", bound=0.9, direction="decrease")  # e.g. a success share
    j = judge_metric(s, counts(800, 1000), test=True)
    assert j.exceeded and j.test is not None and j.test.p_value < 1e-10
    fine = judge_metric(s, counts(950, 1000), test=True)
    assert not fine.exceeded


def test_a_ratio_against_the_baseline_takes_the_margin_into_the_fisher_test() -> None:
    s = spec(kind="ratio", compare="baseline", margin=0.01)
    # 4.1% against 0.9% + 1%: over, and significant
    j = judge_metric(s, counts(410, 10_000, 90, 10_000), test=True)
    assert j.exceeded and j.test is not None
    assert j.test.method == "fisher_exact_greater_margin" and j.test.p_value < 1e-9
    # 1.5% against 0.9% + 1%: worse than the baseline, but within the margin
    within = judge_metric(s, counts(150, 10_000, 90, 10_000), test=True)
    assert not within.exceeded
    assert within.test is not None and within.test.p_value > 0.5
    # margin 0: exactly the failures' test
    plain = judge_metric(
        spec(kind="ratio", compare="baseline"), counts(150, 10_000, 90, 10_000), test=True
    )
    assert plain.test is not None and plain.test.method == "fisher_exact_greater"


def test_a_ratio_with_too_few_events_is_not_judged() -> None:
    s = spec(kind="ratio", compare="baseline", min_count=500)
    j = judge_metric(s, counts(300, 400, 1, 10_000), test=True)
    assert j.status == Status.TOO_FEW and not j.exceeded and j.test is None
    assert j.note is not None and "canary 400 events" in j.note


def test_counts_from_an_extrapolating_provider_are_rounded_and_clamped() -> None:
    found = MetricEvidence("m", Reading(1.2, 12.4, 11.6), Reading(0.0, 0.0, 10.0), T0)
    j = judge_metric(spec(kind="ratio", min_count=5), found, test=True)
    assert j.evidence["counts"]["canary"] == [12, 12]


# ---------------------------------------------------------------- no data


@pytest.mark.parametrize("policy", ["hold", "ignore"])
def test_no_data_is_never_a_breach(policy: str) -> None:
    s = spec(no_data=policy)
    missing = MetricEvidence("m", Reading.missing("prometheus: timeout"), Reading(1.0), T0)
    j = judge_metric(s, missing, test=True)
    assert not j.exceeded
    assert j.status == (Status.HELD if policy == "hold" else Status.SKIPPED)
    assert j.note is not None and "prometheus: timeout" in j.note
    expired = judge_metric(s, missing, test=True, expired=True)
    assert expired.status == Status.SKIPPED


def test_without_a_provider_every_metric_has_no_data_and_says_why() -> None:
    j = judge_metric(spec(), value(500.0), test=True, provider=False)
    assert j.status == Status.HELD and j.note is not None and NO_PROVIDER in j.note


def test_a_baseline_without_data_is_no_data_only_when_compared_with() -> None:
    missing_base = MetricEvidence("m", Reading(500.0), Reading.missing("empty"), T0)
    assert judge_metric(spec(), missing_base, test=True).exceeded  # absolute: not needed
    j = judge_metric(spec(compare="baseline"), missing_base, test=True)
    assert j.status == Status.HELD


# ---------------------------------------------------------------- in the breaker


def test_a_metric_joins_the_holm_family_with_latency_and_failures() -> None:
    metric = spec(kind="ratio", name="error_ratio", compare="baseline", margin=0.0)
    r = rule(metrics=[metric])
    found = {"error_ratio": counts(130, 10_000, 90, 10_000, name="error_ratio")}
    e = evaluate(*_pair(slow(T0)), r, metrics=found, always_test=True)
    by = {g.name: g for g in e.guardrails}
    assert set(by) == {"latency", "failures", "error_ratio"}
    tested = [g for g in e.guardrails if g.test is not None]
    assert len(tested) == 3  # the family is all three
    m = by["error_ratio"]
    assert m.test is not None and m.p_adjusted is not None
    # Holm: the adjusted p is at least the raw one, and at most three times it
    assert m.test.p_value <= m.p_adjusted <= 3 * m.test.p_value + 1e-12


def test_a_healthy_window_with_a_breached_metric_names_the_metric_and_its_action() -> None:
    metric = spec(kind="ratio", name="error_ratio", compare="baseline", margin=0.01)
    r = rule(metrics=[metric])
    found = {"error_ratio": counts(410, 10_000, 90, 10_000, name="error_ratio")}
    e = evaluate(*_pair(healthy(T0)), r, metrics=found)
    assert e.verdict is Verdict.BREACH
    assert e.action is GuardrailAction.STOP and e.action_by == "error_ratio"
    assert "error_ratio 4.10% > baseline 0.90% + 1.00%" in e.reason
    assert "fisher_exact_greater_margin" in e.reason and ": stop" in e.reason
    assert e.to_dict()["action_by"] == "error_ratio"
    g = e.to_dict()["guardrails"]["error_ratio"]
    assert g["metric"]["queries"] == ["bad(canary)", "all(canary)"] and g["action"] == "stop"


def test_the_most_severe_action_among_breached_guardrails_wins() -> None:
    r = rule(
        action="step_back",
        metrics=[
            spec(name="memory", action="pause"),
            spec(name="conversion", action="rollback", direction="decrease", bound=0.5),
        ],
    )
    found = {"memory": value(900.0, name="memory"), "conversion": value(0.1, name="conversion")}
    e = evaluate(*_pair(slow(T0)), r, metrics=found)
    assert e.verdict is Verdict.BREACH
    assert e.action is GuardrailAction.ROLLBACK and e.action_by == "conversion"
    only_memory = {"memory": value(900.0, name="memory"), "conversion": value(0.9)}
    e = evaluate(*_pair(healthy(T0)), r, metrics=only_memory)
    assert e.action is GuardrailAction.PAUSE and e.action_by == "memory"


def test_a_held_metric_holds_the_look_but_never_hides_a_breach() -> None:
    r = rule(metrics=[spec(name="memory")])
    e = evaluate(*_pair(healthy(T0)), r, metrics={}, provider=False)
    assert e.verdict is Verdict.HELD and e.no_data_held == ("memory",)
    assert "no data for memory" in e.reason and NO_PROVIDER in e.reason
    e = evaluate(*_pair(slow(T0)), r, metrics={}, provider=False)
    assert e.verdict is Verdict.BREACH and e.action_by == "latency"
    # the hold timed out: judged without it
    e = evaluate(*_pair(healthy(T0)), r, metrics={}, metrics_expired={"memory"})
    assert e.verdict is Verdict.PASS


def test_a_rule_without_metrics_is_judged_as_before() -> None:
    r = rule()
    e = evaluate(*_pair(slow(T0)), r)
    assert e.verdict is Verdict.BREACH and [g.name for g in e.guardrails] == [
        "latency",
        "failures",
    ]
    assert e.action is GuardrailAction.STOP


def _pair(snaps: dict[str, Any]) -> tuple[Any, Any]:
    return snaps["canary"], snaps.get("baseline")
