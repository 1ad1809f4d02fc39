"""The clustered traffic of `canary bench decision` (scenario d): sticky, monotonic,
and the same distributions in both arms."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from controlplane.benchmarks.decision import (
    CLUSTER_BROKEN_ERROR_RATE,
    CLUSTER_BROKEN_SHARE,
    CLUSTER_REQUEST_SIGMA,
    CLUSTER_USER_ERROR_RATE,
    CLUSTER_USER_SIGMA,
    CLUSTER_USERS,
    ERROR_RATE,
    SIGMA,
    THRESHOLD_MS,
    ClusteredTraffic,
    zipf_shares,
)
from controlplane.kernel.routes import BASELINE, CANARY


def _traffic(seed: int = 7) -> ClusteredTraffic:
    return ClusteredTraffic(np.random.default_rng(seed), THRESHOLD_MS)


def test_assignment_is_monotonic_as_the_weight_ramps() -> None:
    traffic = _traffic()
    previous = traffic.canary_users(0)
    assert not previous.any()
    for bp in (100, 500, 2500, 5000, 9999, 10_000):
        current = traffic.canary_users(bp)
        assert not (previous & ~current).any()  # nobody leaves the canary on a ramp up
        previous = current
    assert previous.all()
    # about the weight's share of the users
    assert abs(traffic.canary_users(2500).mean() - 0.25) < 0.03


def test_a_users_requests_all_go_to_one_arm() -> None:
    # two populations from one seed: one draws the requests, the other generates them
    drawn, generated = _traffic(), _traffic()
    ts, user, rt, failed = drawn.draw(0.0, 30.0)
    assert ts.size == user.size == rt.size == failed.size > 0
    assert np.all(np.diff(ts) >= 0)
    generated.generate(0.0, 30.0, 2500)
    canary = drawn.canary_users(2500)[user]  # each request goes where its user is
    for name, side in ((CANARY, canary), (BASELINE, ~canary)):
        got = generated.variants[name].counts(-1.0, 31.0)
        want = (int(side.sum()), int(failed[side].sum()), int((rt[side] > THRESHOLD_MS).sum()))
        assert got == want
    # at a fixed weight a user is never on both sides
    assert not set(user[canary].tolist()) & set(user[~canary].tolist())
    # heavy users: the top user's share of the requests is its Zipf share
    top = float(np.mean(user == 0))
    assert abs(top - float(zipf_shares()[0])) < 0.03


def test_both_arms_draw_user_effects_from_the_same_distribution() -> None:
    # the effects are drawn independently of the bucket: pooled over populations, the
    # canary half and the baseline half hold the same mix of factors and broken users
    factors: dict[bool, list[float]] = {True: [], False: []}
    broken = {True: 0, False: 0}
    users = {True: 0, False: 0}
    for seed in range(20):
        traffic = _traffic(seed)
        in_canary = traffic.canary_users(5000)
        for side in (True, False):
            mask = in_canary == side
            factors[side].extend(np.log(traffic.latency_factor[mask]).tolist())
            broken[side] += int((traffic.error_rate[mask] == CLUSTER_BROKEN_ERROR_RATE).sum())
            users[side] += int(mask.sum())
    for side in (True, False):
        assert abs(float(np.mean(factors[side]))) < 0.01
        assert abs(float(np.std(factors[side])) - CLUSTER_USER_SIGMA) < 0.01
        assert abs(broken[side] / users[side] - CLUSTER_BROKEN_SHARE) < 0.001
    mean_gap = abs(float(np.mean(factors[True])) - float(np.mean(factors[False])))
    assert mean_gap < 0.01


def test_the_population_marginal_is_the_independent_traffics() -> None:
    # only the clustering differs from the independent A/A runs
    assert math.isclose(CLUSTER_USER_SIGMA**2 + CLUSTER_REQUEST_SIGMA**2, SIGMA**2)
    population_rate = (
        CLUSTER_BROKEN_SHARE * CLUSTER_BROKEN_ERROR_RATE
        + (1 - CLUSTER_BROKEN_SHARE) * CLUSTER_USER_ERROR_RATE
    )
    assert math.isclose(population_rate, ERROR_RATE)
    shares = zipf_shares()
    assert shares.size == CLUSTER_USERS
    assert math.isclose(float(shares.sum()), 1.0)
    assert np.all(np.diff(shares) <= 0)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the whole quick benchmark: two minutes of one core, idle
def test_quick_run_reports_clustered_aa_beside_the_independent_one(
    quick_decision_report: dict[str, Any],
) -> None:
    result = quick_decision_report
    assert set(result["aa"]) == {"absolute", "baseline"}
    clustered = result["aa_clustered"]
    for mode in ("absolute", "baseline"):
        summary = clustered[mode]
        assert set(result["aa"][mode]) <= set(summary)
        assert summary["runs"] > 0
        assert 0.0 <= summary["false_trip_rate"]["rate"] <= 1.0
        lo, hi = summary["false_trip_rate"]["ci95"]
        assert 0.0 <= lo <= hi <= 1.0
        assert sum(summary["first_trip_by_canary_pct"].values()) == summary["false_trips"]
    both = clustered["both_modes"]
    assert both["runs"] == clustered["absolute"]["runs"] + clustered["baseline"]["runs"]
    assert clustered["traffic"]["users"] == CLUSTER_USERS
    # the independent figures keep counting the independent runs only
    assert result["aa_runs"] == sum(m["runs"] for m in result["aa"].values())
    # judged on units: Zipf 0.8 beside 1.0, the split on clustered traffic (false
    # warnings and a real mismatch) and detection on clustered traffic
    assert result["aa_clustered_zipf_0.8"]["traffic"]["request_share"].startswith(
        "zipf(exponent 0.8"
    )
    srm = result["srm_clustered"]
    assert srm["aa_runs"] == 2 * both["runs"]
    assert 0.0 <= srm["false_warning_rate"]["rate"] <= 1.0
    for exponent in ("1", "0.8"):
        real = srm[f"real_srm_zipf_{exponent}"]
        assert real["lost_user_share"] == 0.1 and real["runs"] > 0
        for mode in ("absolute", "baseline"):
            for name in ("latency_x2", "failures_5pct"):
                times = result["detection_clustered"][f"zipf_{exponent}"][mode][name]
                assert times["runs"] > 0 and times["detected"] <= times["runs"]
