"""Laws of decide(), checked on windows built from seeded numpy samples."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.decision import BreakerState, ExperimentState, SetCanaryWeight, decide
from controlplane.kernel.routes import TOTAL_WEIGHT
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot
from tests.decision.factory import STEPS, T0, WINDOW_SEC, rule, sampled, state

MEDIAN_MS, SIGMA = 100.0, 0.5
Z = {90: 1.2816, 95: 1.6449, 99: 2.3263}
BASE_ERROR = 0.01

# deterministic examples: a property of a statistical guard must not flake
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


def threshold_for(percentile: int) -> float:
    """1.25 x the population percentile, as a recommended threshold would be."""
    return 1.25 * MEDIAN_MS * math.exp(Z[percentile] * SIGMA)


def windows(
    rng: np.random.Generator,
    n_canary: int,
    n_baseline: int,
    threshold_ms: float,
    ts: float,
    *,
    slowdown: float = 1.0,
) -> dict[str, WindowSnapshot]:
    def one(variant: str, n: int, factor: float) -> WindowSnapshot:
        rt = rng.lognormal(math.log(MEDIAN_MS * factor), SIGMA, n)
        failed = rng.random(n) < BASE_ERROR
        return sampled(variant, rt, failed, ts, threshold_ms=threshold_ms)

    return {
        "canary": one("canary", n_canary, slowdown),
        "baseline": one("baseline", n_baseline, 1.0),
    }


def make_rule(compare: str, percentile: int, min_samples: int) -> BreakerRule:
    return rule(
        compare=compare,
        percentile=percentile,
        threshold_ms=threshold_for(percentile),
        failure_ratio=0.05,
        min_samples=min_samples,
    )


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(100, 2000),
    compare=st.sampled_from(["absolute", "baseline"]),
    percentile=st.sampled_from([90, 95, 99]),
)
def test_no_trip_in_aa_with_identical_distributions(
    seed: int, n: int, compare: str, percentile: int
) -> None:
    rng = np.random.default_rng(seed)
    r = make_rule(compare, percentile, min_samples=100)
    s = state(canary_bp=5000)
    # independent (disjoint) windows, each judged a few times as the controller would
    for k in range(8):
        snaps = windows(rng, n, n, r.threshold_ms, T0 + WINDOW_SEC * (k + 1))
        s = decide(s, snaps, r, STEPS, T0 + WINDOW_SEC * (k + 1)).new_state
        assert s.breaker is BreakerState.CLOSED, f"false trip on window {k}"


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(100, 2000),
    compare=st.sampled_from(["absolute", "baseline"]),
    slowdown=st.sampled_from([5.0, 10.0]),
)
def test_clear_breach_trips_once_min_samples_is_reached(
    seed: int, n: int, compare: str, slowdown: float
) -> None:
    rng = np.random.default_rng(seed)
    r = make_rule(compare, 95, min_samples=100)
    s = state(canary_bp=5000)
    for k in range(r.consecutive_breaches):
        assert s.breaker is BreakerState.CLOSED
        t = T0 + 20 + 0.25 * k
        s = decide(
            s, windows(rng, n, n, r.threshold_ms, t, slowdown=slowdown), r, STEPS, t
        ).new_state
    assert s.breaker is BreakerState.OPEN


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 99))
def test_clear_breach_below_min_samples_does_not_trip(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    r = make_rule("absolute", 95, min_samples=100)
    s = state(canary_bp=5000)
    for k in range(5):
        t = T0 + 20 + 0.25 * k
        s = decide(s, windows(rng, n, n, r.threshold_ms, t, slowdown=10.0), r, STEPS, t).new_state
    assert s.breaker is BreakerState.CLOSED


EVENTS = st.lists(
    st.tuples(
        st.floats(0.0, 120.0),
        st.sampled_from(["healthy", "slow", "none", "few"]),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    events=EVENTS,
    action=st.sampled_from(["stop", "step_back"]),
    no_data=st.sampled_from(["hold", "fail"]),
)
def test_weights_always_stay_within_basis_points(
    seed: int, events: list[tuple[float, str]], action: str, no_data: str
) -> None:
    rng = np.random.default_rng(seed)
    r = rule(
        action=action,
        no_data=no_data,
        no_data_timeout_sec=30,
        cooldown_sec=20,
        threshold_ms=threshold_for(95),
        min_samples=50,
    )
    s = state()
    now = T0
    for dt, kind in events:
        now += dt
        if kind == "none":
            snaps: dict[str, WindowSnapshot] = {}
        else:
            n = 20 if kind == "few" else 400
            slowdown = 8.0 if kind == "slow" else 1.0
            snaps = windows(rng, n, n, r.threshold_ms, now, slowdown=slowdown)
        d = decide(s, snaps, r, STEPS, now)
        s = d.new_state
        assert 0 <= s.canary_bp <= TOTAL_WEIGHT
        for a in d.effects:
            if isinstance(a, SetCanaryWeight):
                assert 0 <= a.canary_bp <= TOTAL_WEIGHT
                assert a.canary_bp == s.canary_bp
        assert d.next_check_at is None or d.next_check_at >= now
        if s.status is ExperimentState.ROLLED_BACK:
            assert s.canary_bp == 0
        if s.status is ExperimentState.PROMOTED:
            assert s.canary_bp == TOTAL_WEIGHT
        assert s.trips <= r.max_trips
