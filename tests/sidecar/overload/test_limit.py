"""The gradient limit, driven by synthetic latency sequences on an injected clock."""

from __future__ import annotations

import pytest

from sidecar.overload.limit import (
    GradientLimit,
    LimitSettings,
    Phase,
    next_limit,
    percentile_of,
)
from tests.sidecar.overload.simulation import Run, Upstream

SETTINGS = LimitSettings(min_rtt_interval=30.0)


@pytest.mark.parametrize(
    ("limit", "sample", "min_rtt", "expected"),
    [
        (10.0, 0.010, 0.010, 10.3),  # no queue: grows by 0.3 of the buffer (smoothing 0.3)
        (10.0, 0.011, 0.010, 10.0),  # exactly the buffer above: stays
        (10.0, 0.022, 0.010, 8.5),  # twice the buffered no-load latency: 0.3 of the way to half
        (10.0, 1.000, 0.010, 8.5),  # an outlier interval cuts by 15% at most
        (10.0, 0.001, 0.010, 13.0),  # faster than ever: grows by 30% at most
        (1.0, 1.000, 0.010, 1.0),  # never below min_limit
        (1000.0, 0.001, 0.010, 1000.0),  # never above max_limit
    ],
)
def test_next_limit_follows_the_gradient_within_bounds(
    limit: float, sample: float, min_rtt: float, expected: float
) -> None:
    assert next_limit(limit, sample, min_rtt, LimitSettings()) == pytest.approx(expected)


def test_percentile_is_nearest_rank() -> None:
    assert percentile_of([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile_of([5.0, 1.0, 3.0, 2.0], 0.5) == 2.0
    assert percentile_of([7.0], 0.99) == 7.0
    assert percentile_of([1.0, 2.0, 3.0, 4.0], 1.0) == 4.0


@pytest.mark.parametrize("capacity", [4, 8, 32, 100])
@pytest.mark.parametrize("service", [0.002, 0.010, 0.050])
def test_converges_to_the_sustainable_concurrency(capacity: int, service: float) -> None:
    run = Run(SETTINGS, Upstream(capacity, service), demand=capacity * 10)
    run.until(25.0)
    assert run.limiter.state().min_rtt == pytest.approx(service)
    mean = run.mean_limit(since=15.0)
    assert capacity <= mean <= capacity * 1.2


@pytest.mark.parametrize("capacity", [8, 16, 64])
def test_adapts_within_five_seconds_after_capacity_halves(capacity: int) -> None:
    upstream = Upstream(capacity, 0.010)
    run = Run(SETTINGS, upstream, demand=capacity * 8)
    run.until(20.0)
    upstream.capacity = capacity // 2
    run.until(40.0)
    half = capacity // 2
    entered = run.first_within(20.0, 0.8 * half, 1.25 * half)
    assert entered is not None
    assert entered - 20.0 <= 5.0
    assert half <= run.mean_limit(since=30.0) <= half * 1.2


def test_grows_again_when_capacity_doubles() -> None:
    upstream = Upstream(8, 0.010)
    run = Run(SETTINGS, upstream, demand=200)
    run.until(20.0)
    upstream.capacity = 16
    run.until(40.0)
    assert 16 <= run.mean_limit(since=30.0) <= 16 * 1.2


@pytest.mark.parametrize("initial", [5, 20, 200])
def test_stays_put_at_low_load(initial: int) -> None:
    settings = LimitSettings(initial_limit=initial, min_rtt_interval=30.0)
    run = Run(settings, Upstream(64, 0.010), demand=2)
    run.until(120.0)
    assert {limit for _, limit in run.limits} == {initial}
    assert {limit for _, limit in run.pinned} == {3}


def test_measures_no_load_latency_with_the_limit_pinned_then_restores_the_estimate() -> None:
    run = Run(SETTINGS, Upstream(8, 0.010), demand=100)
    assert run.limiter.state().phase is Phase.MEASURING
    assert run.limiter.limit == 3
    run.until(29.0)
    state = run.limiter.state()
    assert state.phase is Phase.ADAPTING
    estimate = state.limit
    assert estimate >= 8
    run.until(30.5)  # the interval after min_rtt_interval re-measures
    assert [limit for at, limit in run.pinned if 29.0 < at <= 30.5]
    assert {limit for _, limit in run.pinned} == {3}
    assert run.limiter.state().phase is Phase.ADAPTING
    assert abs(run.limiter.limit - estimate) <= 2


def test_a_slower_upstream_raises_the_no_load_latency_at_the_next_measurement() -> None:
    upstream = Upstream(8, 0.010)
    run = Run(SETTINGS, upstream, demand=100)
    run.until(10.0)
    upstream.service = 0.030
    run.until(45.0)
    assert run.limiter.state().min_rtt == pytest.approx(0.030)
    assert 8 <= run.mean_limit(since=40.0) <= 8 * 1.2


def test_ignores_requests_admitted_before_the_measurement_began() -> None:
    limiter = GradientLimit(LimitSettings(min_rtt_samples=2), now=10.0)
    limiter.on_sample(now=10.5, rtt=1.0, in_flight=50)  # admitted at 9.5, queued behind others
    limiter.on_sample(now=10.6, rtt=0.02, in_flight=1)
    assert limiter.state().phase is Phase.MEASURING
    limiter.on_sample(now=10.7, rtt=0.01, in_flight=1)
    state = limiter.state()
    assert state.phase is Phase.ADAPTING
    assert state.min_rtt == pytest.approx(0.015)  # the mean of the two counted


def test_limit_respects_min_and_max() -> None:
    settings = LimitSettings(min_limit=6, max_limit=12, initial_limit=50, min_rtt_interval=30.0)
    run = Run(settings, Upstream(2, 0.010), demand=100)
    run.until(20.0)
    assert {limit for _, limit in run.limits + run.pinned} <= set(range(6, 13))
    run = Run(settings, Upstream(500, 0.010), demand=1000)
    run.until(20.0)
    assert run.limiter.limit == 12


def test_a_short_upstream_time_of_a_request_admitted_before_the_phase_is_ignored() -> None:
    # the upstream's own part (head sent → response head) can be short for a request
    # that waited in the sidecar: its admission time decides which phase it belongs to
    limiter = GradientLimit(LimitSettings(min_rtt_samples=2), now=10.0)
    limiter.on_sample(now=10.5, rtt=0.01, in_flight=1, admitted_at=9.9)
    limiter.on_sample(now=10.6, rtt=0.02, in_flight=1, admitted_at=10.55)
    assert limiter.state().phase is Phase.MEASURING
    limiter.on_sample(now=10.7, rtt=0.03, in_flight=1, admitted_at=10.6)
    state = limiter.state()
    assert state.phase is Phase.ADAPTING
    assert state.min_rtt == pytest.approx(0.025)  # 0.02 and 0.03, not the ignored 0.01
