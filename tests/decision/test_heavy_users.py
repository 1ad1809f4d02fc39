"""Traffic a few heavy users dominate (docs/decisions/0050-heavy-users.md): the two-arm
comparison on units, and a step gate that cannot come clean."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from controlplane.benchmarks.decision import (
    ERROR_RATE,
    THRESHOLD_MS,
    ClusteredTraffic,
    Degradation,
)
from controlplane.decision import decide, stats
from controlplane.decision.breaker import Evaluation, Guardrail, Verdict
from controlplane.decision.gate_deadline import GATE_EXTENSION_HOLDS, WAIT_ALPHA_SHARE, resolve
from controlplane.decision.stats import (
    ClusterEstimate,
    cluster_log_mean,
    cluster_ratio,
    clustered_comparison_test,
)
from controlplane.decision.tally import Tally
from controlplane.kernel.metric_specs import GuardrailAction
from controlplane.kernel.routes import BASELINE, CANARY

from .factory import STEPS, T0, rule, snap, state
from .test_units import population, with_units

LOOK_ALPHA = 2e-5  # about what a look is held to (docs/decisions/0003)
HEAVY = {"exponent": 1.2, "users": 3000, "user_sigma": 0.45}  # the top user: 22%


def _arms(seed: int, factor: float = 1.0, **traffic: float) -> tuple[ClusterEstimate, ...]:
    """Both arms' mean log latency over a 10-s window at 50%, from the benchmark's
    clustered traffic (the canary's latency times `factor`)."""
    degrade = Degradation(0.0, factor, ERROR_RATE)
    sim = ClusteredTraffic(np.random.default_rng(seed), THRESHOLD_MS, degrade=degrade, **traffic)
    sim.generate(0.0, 10.0, 5000)
    out = []
    for arm in (CANARY, BASELINE):
        units = sim.variants[arm].snapshot(-1.0, 11.0, 10.0, 10, reservoir=False).units
        assert units is not None
        out.append(cluster_log_mean(units))
    return tuple(out)


def _failure_arms(
    seed: int, error_rate: float = ERROR_RATE, **traffic: float
) -> tuple[ClusterEstimate, ...]:
    """Both arms' failure rates over a 10-s window at 50% (the canary failing
    `error_rate` of its requests on top of its users' own failures)."""
    degrade = Degradation(0.0, 1.0, error_rate)
    sim = ClusteredTraffic(np.random.default_rng(seed), THRESHOLD_MS, degrade=degrade, **traffic)
    sim.generate(0.0, 10.0, 5000)
    out = []
    for arm in (CANARY, BASELINE):
        units = sim.variants[arm].snapshot(-1.0, 11.0, 10.0, 10, reservoir=False).units
        assert units is not None
        out.append(cluster_ratio(units, 1))
    return tuple(out)


def _sandwich(e: ClusterEstimate) -> ClusterEstimate:
    # the comparison as it was: CR1 over G - 1 degrees of freedom
    return replace(e, compare_variance=math.nan, compare_df=math.nan)


def test_which_heavy_users_landed_in_which_arm_is_not_a_variant_effect() -> None:
    # an A/A window (seed found among 600): the heaviest users' own latency levels
    # made the canary look slower; the sandwich called it at a look's alpha
    canary, baseline = _arms(200_468, **HEAVY)
    before = clustered_comparison_test(
        "latency", _sandwich(canary), _sandwich(baseline), binary=False
    )
    now = clustered_comparison_test("latency", canary, baseline, binary=False)
    assert before.p_value < LOOK_ALPHA
    assert now.p_value > 0.01
    assert canary.compare_variance > canary.variance  # the heavy block's share restored
    assert canary.compare_df < canary.df  # a handful of effective blocks, not 63


def test_the_comparison_keeps_its_size_on_heavy_user_traffic() -> None:
    # 200 A/A windows: at 5% it rejects about 5% (the sandwich: about 14%)
    p = np.array(
        [
            clustered_comparison_test("latency", *_arms(300_000 + s, **HEAVY), binary=False).p_value
            for s in range(200)
        ]
    )
    assert (p < 0.05).mean() <= 0.09
    assert (p < LOOK_ALPHA).sum() == 0


@pytest.mark.parametrize(("traffic", "at_least"), [({}, 0.85), (HEAVY, 0.45)])
def test_a_real_slowdown_on_the_same_traffic_is_still_found(
    traffic: dict[str, float], at_least: float
) -> None:
    # the canary twice as slow for every user: per 10-s window, found at a look's
    # alpha on the benchmark's clustered traffic (Zipf 1, 5,000 users) and at 0.001
    # where one user makes a fifth of all requests (there a look's alpha is met in
    # about a fifth of the windows: that user's level is most of the evidence)
    level = LOOK_ALPHA if not traffic else 1e-3
    found = [
        clustered_comparison_test("latency", *_arms(200_000 + s, 2.0, **traffic), binary=False)
        for s in range(40)
    ]
    assert np.mean([r.p_value < level for r in found]) >= at_least


def _guardrail(
    p: float, method: str = "cluster_robust_welch_t", exceeded: bool = True
) -> Guardrail:
    return Guardrail(
        name="latency",
        basis="percentile_ratio_and_log_mean_test",
        observed=1.35,
        bound=1.2,
        exceeded=exceeded,
        breached=exceeded and p < 0.01,
        test=stats.TestResult("latency", method, 3.0, p),
        p_adjusted=p,
    )


def _gate(g: Guardrail) -> Evaluation:
    verdict = Verdict.BREACH if g.breached else Verdict.PASS
    return Evaluation(verdict, "gate", (g,))


def test_a_gate_held_on_units_says_why_then_decides() -> None:
    g = _guardrail(0.02)
    waiting = resolve(_gate(g), (g,), 10.0, 60.0, 0.01)
    assert not waiting.advance and not waiting.trip
    assert "held on units (latency)" in waiting.note and "in 50s" in waiting.note
    late = GATE_EXTENSION_HOLDS * 60.0
    advanced = resolve(_gate(g), (g,), late, 60.0, 0.01)
    assert advanced.advance and not advanced.trip
    assert "judged on what it has" in advanced.note


# (Holm p, seconds past due) -> what the held gate does; the rule's alpha 0.01 is
# split between the wait (0.005) and the bound (0.005), not a look's share: a real
# slowdown a heavy user hides from the looks is neither promoted nor kept waiting
@pytest.mark.parametrize(
    ("p", "late", "outcome"),
    [
        (0.02, 0.0, "hold"),
        (0.02, 59.9, "hold"),
        (0.02, 60.0, "advance"),
        (0.006, 30.0, "hold"),
        (0.006, 60.0, "advance"),
        (0.0049, 0.0, "trip"),
        (0.004, 30.0, "trip"),
        (0.004, 60.0, "trip"),
        (1e-6, 0.0, "trip"),
    ],
)
def test_a_held_gate_spends_the_rules_alpha_on_its_wait_and_its_bound(
    p: float, late: float, outcome: str
) -> None:
    g = _guardrail(p)
    got = resolve(_gate(g), (g,), late, 60.0, 0.01)
    assert (got.trip, got.advance) == (outcome == "trip", outcome == "advance")
    if outcome == "trip":
        share = "the wait's" if late < 60.0 else "the bound's"
        assert f"breached at 0.005, {share} share of the rule's alpha" in got.note
    assert WAIT_ALPHA_SHARE == 0.5


def test_a_gate_held_per_request_keeps_waiting() -> None:
    # new requests resolve it: no deadline, as before
    g = _guardrail(0.3, method="mann_whitney_u_greater")
    assert resolve(_gate(g), (g,), 1e6, 60.0, LOOK_ALPHA) == resolve(
        _gate(g), (g,), 0.0, 60.0, LOOK_ALPHA
    )
    assert not resolve(_gate(g), (g,), 1e6, 60.0, LOOK_ALPHA).advance


def _held_tally(share_above: float = 0.068) -> Tally:
    """A step's evidence from 61 units, one of them 30% of it, 7% above the threshold
    against a 5% tail: significant at 5% (Holm p 0.015), not at the rule's alpha
    (0.01), so a gate on units holds it."""
    rng = np.random.default_rng(9)
    n = 2000
    unit = population(rng, n, 60, 0.3)
    above = rng.random(n) < share_above
    window = with_units(snap("canary", T0 + 50), unit, np.zeros(n, bool), above)
    return Tally.starting(T0).add(window, None)


@pytest.mark.parametrize(("late", "advances"), [(5.0, False), (61.0, True)])
def test_a_step_held_on_units_advances_after_a_bounded_wait(late: float, advances: bool) -> None:
    s = state(tally=_held_tally())
    now = T0 + STEPS[0].hold_sec + late
    # a look whose window overlaps the counted one: the gate judges the tally alone
    fine = snap("canary", now - 1, above=10, window_sec=120)
    looks = {"canary": fine, "baseline": snap("baseline", now - 1, window_sec=120)}
    d = decide(s, looks, rule(), STEPS, now)
    gate = d.evidence["step_gate"]
    latency = gate["guardrails"]["latency"]
    assert latency["exceeded"] and 0.01 < latency["p_adjusted"] < 0.05
    assert (d.new_state.step_index == 1) is advances
    if advances:
        assert "judged on what it has" in gate["reason"]
    else:
        assert "held on units (latency)" in d.reason


def _light_tally(units: bool) -> Tally:
    """A 1% step's evidence from light users: 40 samples of 8 users, all healthy."""
    rng = np.random.default_rng(5)
    unit = population(rng, 40, 8, 0.0)
    window = with_units(snap("canary", T0 + 50), unit, np.zeros(40, bool), np.zeros(40, bool))
    if not units:
        window = replace(window, units=None, reservoir_units=())
    return Tally.starting(T0).add(window, None)


@pytest.mark.parametrize(
    ("units", "late", "advances"), [(True, 5.0, False), (True, 61.0, True), (False, 61.0, False)]
)
def test_a_step_short_of_samples_from_light_users_is_judged_after_a_bounded_wait(
    units: bool, late: float, advances: bool
) -> None:
    s = state(tally=_light_tally(units))
    now = T0 + STEPS[0].hold_sec + late
    looks = {
        "canary": snap("canary", now - 1, count=4, window_sec=120),
        "baseline": snap("baseline", now - 1, window_sec=120),
    }
    d = decide(s, looks, rule(), STEPS, now)
    assert (d.new_state.step_index == 1) is advances
    if advances:
        assert "judged on the 40 canary samples it has" in d.evidence["step_gate"]["reason"]
    else:
        assert "it has seen 40 canary samples of min_samples 100" in d.reason
        assert ("judged on the samples it has in 55s" in d.reason) is units


def test_a_step_held_on_units_and_breached_at_the_waits_share_trips_without_waiting() -> None:
    # 8% above against 5%: Holm p 0.0004, below the wait's share of the rule's alpha
    # (0.005) and far above a look's share: before its due time it holds, once due it
    # trips at the first judgment rather than a hold later
    s = state(tally=_held_tally(0.08))
    for late, tripped in ((-5.0, False), (5.0, True)):
        now = T0 + STEPS[0].hold_sec + late
        looks = {
            "canary": snap("canary", now - 1, above=10, window_sec=120),
            "baseline": snap("baseline", now - 1, window_sec=120),
        }
        d = decide(s, looks, rule(), STEPS, now)
        assert (d.new_state.breaker.value == "open") is tripped
        assert d.new_state.step_index == 0
        if tripped:
            assert "the wait's share of the rule's alpha" in d.reason


def test_a_rule_whose_action_is_pause_keeps_holding_at_the_bound() -> None:
    # the same breach at the bound: a pausing rule holds the weight (its pause is for
    # that), it neither trips nor advances
    s = state(tally=_held_tally(0.08))
    now = T0 + STEPS[0].hold_sec + 61.0
    looks = {
        "canary": snap("canary", now - 1, above=10, window_sec=120),
        "baseline": snap("baseline", now - 1, window_sec=120),
    }
    pausing = rule(action="pause")
    assert pausing.action is GuardrailAction.PAUSE
    d = decide(s, looks, pausing, STEPS, now)
    assert d.new_state.breaker.value == "closed" and d.new_state.step_index == 0
    assert d.new_state.canary_bp == s.canary_bp
    assert "share of the rule's alpha" in d.reason


def test_a_failure_rate_every_canary_user_shares_is_found_beside_a_heavy_baseline_user() -> None:
    # 5% failures at every canary user, 0.5% at the baseline, where one user makes a
    # fifth of an arm: the blocks add little to the binomial spread, so the test is
    # not held to the t of the arms' dozen effective blocks (decision 0056)
    found = [
        clustered_comparison_test("failures", *_failure_arms(210_000 + s, 0.05), binary=True)
        for s in range(30)
    ]
    assert np.mean([r.p_value < LOOK_ALPHA for r in found]) >= 0.8
    # the arms' effective blocks alone (decision 0050) found fewer
    before = [_effective_blocks_alone(*_failure_arms(210_000 + s, 0.05)) for s in range(30)]
    assert np.mean([p < LOOK_ALPHA for p in before]) < np.mean(
        [r.p_value < LOOK_ALPHA for r in found]
    )


def _effective_blocks_alone(canary: ClusterEstimate, baseline: ClusterEstimate) -> float:
    """The failure comparison of decision 0050: the binomial floor on the variance,
    the effective blocks' degrees of freedom whatever the floor."""
    n = canary.count + baseline.count
    pooled = (canary.estimate * canary.count + baseline.estimate * baseline.count) / n
    floored = [
        replace(e, compare_variance=max(e.compare_variance, pooled * (1 - pooled) / e.count))
        for e in (canary, baseline)
    ]
    return clustered_comparison_test("failures", *floored, binary=False).p_value


def test_the_failure_comparison_keeps_its_size_on_heavy_user_traffic() -> None:
    # A/A windows of the heavy-user shape, broken users included: at 5% about 5%
    p = np.array(
        [
            clustered_comparison_test(
                "failures", *_failure_arms(310_000 + s, **HEAVY), binary=True
            ).p_value
            for s in range(300)
        ]
    )
    assert (p < 0.05).mean() <= 0.08
    assert (p < 1e-3).sum() <= 1


@pytest.mark.parametrize(
    ("variance", "df", "binomial", "binomial_df", "want_variance", "want_df"),
    [
        # the blocks add nothing over the binomial spread: it alone, on the pooled events
        (0.5e-4, 12.0, 1e-4, 80.0, 1e-4, 80.0),
        (1e-4, 12.0, 1e-4, 80.0, 1e-4, 80.0),
        # they add as much again: Welch-Satterthwaite over the two parts
        (2e-4, 12.0, 1e-4, 80.0, 2e-4, 4e-8 / (1e-8 / 80.0 + 1e-8 / 12.0)),
        # they carry nearly all of it: about the effective blocks' degrees of freedom
        (1e-2, 12.0, 1e-4, 80.0, 1e-2, 1e-4 / (1e-8 / 80.0 + (0.99e-2) ** 2 / 12.0)),
        # a single cluster stays infinite
        (math.inf, 1.0, 1e-4, 80.0, math.inf, 1.0),
        # fewer than one pooled event: one degree of freedom
        (0.5e-4, 12.0, 1e-4, 0.2, 1e-4, 1.0),
    ],
)
def test_a_binary_arms_variance_is_the_binomial_plus_what_its_blocks_add(
    variance: float,
    df: float,
    binomial: float,
    binomial_df: float,
    want_variance: float,
    want_df: float,
) -> None:
    got = stats._over_binomial(variance, df, binomial, binomial_df)
    assert got == pytest.approx((want_variance, want_df))
