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
from controlplane.decision.gate_deadline import GATE_EXTENSION_HOLDS, resolve
from controlplane.decision.stats import (
    ClusterEstimate,
    cluster_log_mean,
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
    # the rule's alpha, not a look's share: a real slowdown a heavy user hides from
    # the looks is not promoted at the bound
    worse = _guardrail(0.004)
    tripped = resolve(_gate(worse), (worse,), late, 60.0, 0.01)
    assert tripped.trip and not tripped.advance


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


def test_a_step_held_on_units_and_breached_at_the_rules_alpha_trips_at_the_bound() -> None:
    # 7.75% above against 5%: Holm p 0.003, below the rule's 0.01 but far above a
    # look's share - before the bound it holds, at the bound it trips
    s = state(tally=_held_tally(0.075))
    for late, tripped in ((5.0, False), (61.0, True)):
        now = T0 + STEPS[0].hold_sec + late
        looks = {
            "canary": snap("canary", now - 1, above=10, window_sec=120),
            "baseline": snap("baseline", now - 1, window_sec=120),
        }
        d = decide(s, looks, rule(), STEPS, now)
        assert (d.new_state.breaker.value == "open") is tripped
        assert d.new_state.step_index == 0
        if tripped:
            assert "breached at the rule's alpha" in d.reason


def test_a_rule_whose_action_is_pause_keeps_holding_at_the_bound() -> None:
    # the same breach at the bound: a pausing rule holds the weight (its pause is for
    # that), it neither trips nor advances
    s = state(tally=_held_tally(0.075))
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
    assert "breached at the rule's alpha" in d.reason
