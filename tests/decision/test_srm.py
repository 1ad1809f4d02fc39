"""Sample ratio mismatch under continuous looks: always-valid test on disjoint windows."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.decision import Step, decide
from controlplane.decision.stats import always_valid_split_p, sample_ratio_mismatch
from controlplane.kernel.snapshots import WindowSnapshot
from tests.decision.factory import STEPS, T0, rule, snap, state

RULE = rule()


def _ever_below(p_threshold: float, fraction: float, *, seed: int, looks: int = 40) -> float:
    """Share of fair sequences whose always-valid p ever drops below the threshold."""
    rng = np.random.default_rng(seed)
    crossed = 0
    runs = 400
    for _ in range(runs):
        canary = rng.binomial(200, fraction, looks).cumsum()
        total = 200 * np.arange(1, looks + 1)
        ps = [
            always_valid_split_p(int(t - c), int(c), fraction)
            for t, c in zip(total, canary, strict=True)
        ]
        crossed += min(ps) < p_threshold
    return crossed / runs


@pytest.mark.parametrize("fraction", [0.01, 0.05, 0.5])
def test_always_valid_p_keeps_its_level_over_many_looks(fraction: float) -> None:
    # Ville: a fair split crosses p < 0.05 in at most 5% of sequences, at any look count
    assert _ever_below(0.05, fraction, seed=11) <= 0.05


def test_always_valid_p_is_one_at_the_configured_split() -> None:
    assert always_valid_split_p(9500, 500, 0.05) == 1.0


@pytest.mark.parametrize(
    ("baseline", "canary", "bp"),
    [(11_000, 9_000, 5000), (19_000, 1_300, 500), (99_000, 1_300, 100)],
)
def test_a_real_mismatch_is_flagged(baseline: int, canary: int, bp: int) -> None:
    result = sample_ratio_mismatch(baseline, canary, bp)
    assert result is not None and result.mismatch
    assert result.always_valid_p < 0.001
    assert result.to_dict()["method"] == "beta_binomial_mixture_sprt"


def _pair(t: float, canary: int, baseline: int) -> dict[str, WindowSnapshot]:
    return {
        "canary": snap("canary", t, count=canary),
        "baseline": snap("baseline", t, count=baseline),
    }


def test_only_disjoint_settled_windows_add_to_the_counts() -> None:
    s = state(step_index=1, canary_bp=500, weight_since=T0)
    # starts before the route settled (T0 + 1): not counted
    s = decide(s, _pair(T0 + 10.5, 50, 950), RULE, STEPS, T0 + 10.5).new_state
    assert s.srm_tally is not None and s.srm_tally.windows == 0
    s = decide(s, _pair(T0 + 11.5, 50, 950), RULE, STEPS, T0 + 11.5).new_state
    assert s.srm_tally is not None and s.srm_tally.windows == 1
    # overlapping looks re-judge the same requests: not counted again
    for k in range(1, 20):
        t = T0 + 11.5 + 0.25 * k
        s = decide(s, _pair(t, 50, 950), RULE, STEPS, t).new_state
    assert s.srm_tally is not None
    assert s.srm_tally.windows == 1 and s.srm_tally.canary == 50
    s = decide(s, _pair(T0 + 21.5, 60, 940), RULE, STEPS, T0 + 21.5).new_state
    assert s.srm_tally is not None
    assert (s.srm_tally.windows, s.srm_tally.canary, s.srm_tally.baseline) == (2, 110, 1890)


def test_a_weight_change_starts_new_counts() -> None:
    s = state(step_index=1, canary_bp=500, weight_since=T0)
    s = decide(s, _pair(T0 + 11.5, 50, 950), RULE, STEPS, T0 + 11.5).new_state
    moved = s.with_changes(canary_bp=2500, weight_since=T0 + 12)
    s = decide(moved, _pair(T0 + 23.5, 250, 750), RULE, STEPS, T0 + 23.5).new_state
    assert s.srm_tally is not None
    assert (s.srm_tally.since, s.srm_tally.windows, s.srm_tally.canary) == (T0 + 12, 1, 250)


def test_fair_traffic_looked_at_every_250_ms_raises_no_warning() -> None:
    # the sliding-window check this replaces warned in about a fifth of such runs
    rng = np.random.default_rng(5)
    steps = (Step(1, 60), Step(5, 3600))  # the step holds for the whole run
    warned = 0
    for _ in range(20):
        s = state(step_index=1, canary_bp=500, weight_since=T0)
        for k in range(4 * 120):
            t = T0 + 11 + 0.25 * k
            canary = int(rng.binomial(2000, 0.05))
            d = decide(s, _pair(t, canary, 2000 - canary), RULE, steps, t)
            s = d.new_state
            warned += any(e.kind.value == "srm_detected" for e in d.events)
    assert warned == 0
