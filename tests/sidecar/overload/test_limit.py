"""The gradient limit, driven by synthetic latency sequences on an injected clock."""

from __future__ import annotations

import pytest

from controlplane.kernel.overload import OverloadConfig
from sidecar.overload.limit import (
    NO_LOAD_ERRORS,
    GradientLimit,
    LimitSettings,
    Phase,
    interval_latency,
    next_limit,
    no_load_latency,
    percentile_of,
)
from tests.sidecar.overload.gate_simulation import FifoUpstream, GateRun, quantile
from tests.sidecar.overload.simulation import Run, Upstream

SETTINGS = LimitSettings(min_rtt_interval=30.0)


@pytest.mark.parametrize(
    ("limit", "sample", "min_rtt", "expected"),
    [
        (10.0, 0.010, 0.010, 10.3),  # no queue: grows by 0.3 of the 10% buffer
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
    settings = LimitSettings(rtt_buffer=0.1)
    assert next_limit(limit, sample, min_rtt, settings) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("clear", "sample", "expected"),
    [
        (0, 0.010, 10.3),  # no queue: 0.3 of the 10% buffer
        (10, 0.010, 10.6),  # after 10 queue-free intervals growth is twice as fast
        (30, 0.010, 11.2),
        (1000, 0.010, 13.0),  # never past the largest gradient, 2 (smoothed: 30%)
        (30, 0.022, 8.5),  # a queue: falls as ever, whatever came before
    ],
)
def test_growth_speeds_up_with_queue_free_intervals_in_a_row(
    clear: int, sample: float, expected: float
) -> None:
    settings = LimitSettings(rtt_buffer=0.1)
    assert next_limit(10.0, sample, 0.010, settings, clear) == pytest.approx(expected)


MEDIAN = LimitSettings(statistic="percentile", percentile=0.5)


@pytest.mark.parametrize(
    ("latencies", "settings", "expected"),
    [
        ([0.010] * 9 + [0.020], LimitSettings(), 0.011),  # one in ten waited: the mean sees it
        ([0.010] * 9 + [0.020], MEDIAN, 0.010),  # the median does not
        ([0.010] * 9 + [1.000], LimitSettings(), 0.0111),  # a stall counts up to 2.1 x no-load
        ([0.010] * 9 + [1.000], MEDIAN, 0.010),
        ([0.030] * 10, LimitSettings(), 0.021),  # all queued: capped where the gradient is 0.5
    ],
)
def test_an_interval_is_summarised_by_its_statistic(
    latencies: list[float], settings: LimitSettings, expected: float
) -> None:
    assert interval_latency(latencies, 0.010, settings) == pytest.approx(expected)


def test_a_steady_no_load_latency_is_its_mean() -> None:
    assert no_load_latency([0.010] * 25, LimitSettings()) == pytest.approx(0.010)
    assert no_load_latency([0.012], LimitSettings()) == pytest.approx(0.012)


def test_a_noisy_no_load_latency_is_taken_at_the_upper_end_of_its_estimate() -> None:
    values = [0.008, 0.012] * 10  # mean 10 ms, standard deviation 2.05 ms
    error = (sum((v - 0.010) ** 2 for v in values) / 19 / 20) ** 0.5
    assert no_load_latency(values, LimitSettings()) == pytest.approx(
        0.010 + NO_LOAD_ERRORS * error
    )
    assert no_load_latency(values, MEDIAN) == pytest.approx(0.008)  # nearest rank


def test_a_stall_during_the_measurement_counts_up_to_twice_the_median() -> None:
    values = [0.010] * 24 + [0.500]
    capped = [0.010] * 24 + [0.020]
    mean = sum(capped) / 25
    error = (sum((v - mean) ** 2 for v in capped) / 24 / 25) ** 0.5
    assert no_load_latency(values, LimitSettings()) == pytest.approx(mean + 2 * error)


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
    run.until(55.0)
    assert run.limiter.state().min_rtt == pytest.approx(0.030)
    # the limit fell while the no-load latency was the old one; from the measurement
    # at 30 s it grows back by 1.5% an interval (rtt_buffer 0.05, smoothing 0.3)
    assert 8 <= run.mean_limit(since=50.0) <= 8 * 1.2


def test_ignores_requests_admitted_before_the_measurement_began() -> None:
    limiter = GradientLimit(LimitSettings(min_rtt_samples=2), now=10.0)
    limiter.on_sample(now=10.5, rtt=1.0, in_flight=50)  # admitted at 9.5, queued behind others
    limiter.on_sample(now=10.6, rtt=0.02, in_flight=1)
    assert limiter.state().phase is Phase.MEASURING
    limiter.on_sample(now=10.7, rtt=0.01, in_flight=1)
    state = limiter.state()
    assert state.phase is Phase.ADAPTING
    assert state.min_rtt == pytest.approx(no_load_latency([0.02, 0.01], LimitSettings()))


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
    counted = no_load_latency([0.02, 0.03], LimitSettings())  # not the ignored 0.01
    assert state.min_rtt == pytest.approx(counted)


# --- an open-loop FIFO upstream (tests.sidecar.overload.gate_simulation) -----------
# What the closed loop above cannot show: with a few more in flight than places, a
# FIFO upstream keeps most requests at the no-load latency and makes a few wait.

BEFORE = {"statistic": "percentile", "percentile": 0.5, "rtt_buffer": 0.1}


def _overloaded(config: OverloadConfig, jitter: float, load: float, seed: int = 1) -> GateRun:
    run = GateRun(config, FifoUpstream(8, 0.010, jitter=jitter), rate=800 * load, seed=seed)
    run.until(8.0)
    return run


@pytest.mark.parametrize("load", [2.0, 4.0])
def test_the_mean_settles_at_the_capacity_of_a_fifo_upstream(load: float) -> None:
    run = _overloaded(OverloadConfig(), jitter=0.0, load=load)
    assert 8 <= run.mean_limit(since=3.0) <= 8 * 1.1
    assert run.goodput(3.0, 8.0) >= 0.95 * 800
    latencies = run.latencies(3.0)
    assert quantile(latencies, 0.5) <= 0.0115  # 10 ms of service, 0.4 in the sidecar
    assert quantile(latencies, 0.99) <= 0.0230  # at most one service time of waiting


@pytest.mark.parametrize("load", [2.0, 4.0])
def test_the_median_settled_above_it(load: float) -> None:
    # why the statistic changed: most requests do not wait, so the median does not move
    run = _overloaded(OverloadConfig.model_validate(BEFORE), jitter=0.0, load=load)
    assert run.mean_limit(since=3.0) >= 8 * 1.25


@pytest.mark.parametrize("seed", range(1, 9))
@pytest.mark.parametrize("jitter", [0.3, 0.6])
def test_a_noisy_service_does_not_collapse_the_limit(jitter: float, seed: int) -> None:
    # service times uniform within ±60% (coefficient of variation 0.35): a no-load
    # latency measured low by chance must not shrink the limit below the capacity
    run = _overloaded(OverloadConfig(), jitter=jitter, load=2.0, seed=seed)
    assert 8 <= run.mean_limit(since=3.0) <= 8 * 1.4
    assert min(limit for at, limit in run.limits if at >= 3.0) >= 7
    assert run.goodput(3.0, 8.0) >= 0.95 * 800


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("jitter", [0.0, 0.05])
def test_after_the_capacity_halves_the_limit_settles_within_a_fifth_of_it(
    jitter: float, seed: int
) -> None:
    upstream = FifoUpstream(8, 0.010, jitter=jitter)
    run = GateRun(OverloadConfig(), upstream, rate=800, seed=seed)
    run.until(10.0)
    upstream.capacity = 4
    run.until(20.0)
    # the limit's mean over each second from the 2nd to the 5th after the step, and after
    means = [run.mean_limit(since=t, until=t + 1.0) for t in range(11, 20)]
    assert all(0.8 * 4 <= mean <= 1.2 * 4 for mean in means), means
    assert run.goodput(12.0, 20.0) >= 0.95 * 400


def _limiter_after_measuring(lag: float) -> GradientLimit:
    """A limiter whose no-load measurement saw 12 ms with the loop `lag` late."""
    settings = LimitSettings(min_rtt_samples=4, initial_limit=10, min_rtt_interval=30.0)
    limiter = GradientLimit(settings, now=0.0)
    for i in range(4):
        limiter.on_loop_lag(lag)
        limiter.on_sample(now=0.1 + i * 0.01, rtt=0.012, in_flight=3)
    return limiter


@pytest.mark.parametrize(
    ("lag", "expected_min_rtt"),
    # never below the fastest request the measurement saw: a lateness read in one
    # busy instant would otherwise pin the limit low until the next measurement
    [(0.0, 0.012), (0.002, 0.012), (0.050, 0.012)],
)
def test_the_loops_lateness_is_left_out_of_the_no_load_latency(
    lag: float, expected_min_rtt: float
) -> None:
    limiter = _limiter_after_measuring(lag)
    assert limiter.state().min_rtt == pytest.approx(expected_min_rtt)


@pytest.mark.parametrize(
    ("lag", "grows"),
    [
        (0.0, False),  # 13 ms against 10: a queue, the limit falls
        (0.003, True),  # the loop was 3 ms late: no queue in the upstream, it grows
    ],
)
def test_the_loops_lateness_is_left_out_of_an_interval(lag: float, grows: bool) -> None:
    limiter = _limiter_after_measuring(0.002)  # no-load latency 10 ms
    start = limiter.state()
    assert start.phase is Phase.ADAPTING and start.limit == 10
    for i in range(20):
        limiter.on_loop_lag(lag)
        limiter.on_sample(now=0.2 + i * 0.01, rtt=0.013, in_flight=10)
    state = limiter.state()
    assert state.sample_rtt == pytest.approx(0.013 - lag)
    assert (state.estimate > start.estimate) is grows


def test_a_limit_fallen_under_a_slow_spell_comes_back_within_seconds() -> None:
    # an upstream three times slower for 2 s looks like a queue to a limit whose
    # no-load latency was measured before: it falls to min_limit. Then it must not
    # take the 1.5% an interval of a probe at the capacity to come back
    upstream = FifoUpstream(8, 0.010, jitter=0.05)
    run = GateRun(OverloadConfig(), upstream, rate=800)
    run.until(10.0)
    upstream.service = 0.030
    run.until(12.0)
    assert run.mean_limit(since=11.0) <= 2
    upstream.service = 0.010
    run.until(20.0)
    assert 8 <= run.mean_limit(since=16.0) <= 8 * 1.15
    assert run.goodput(16.0, 20.0) >= 0.95 * 800


def test_a_late_loop_does_not_make_an_overloaded_upstream_look_idle() -> None:
    s = LimitSettings(min_limit=1, max_limit=1000, initial_limit=50)
    limit = GradientLimit(s, 0.0)
    t = 0.0
    for _ in range(s.min_rtt_samples):  # no-load latency 1 ms, a quiet loop
        t += 0.001
        limit.on_sample(t, 0.001, 1)
    start = limit.limit
    # the upstream now answers in 20 ms (20x) while the loop runs 2 ms late: the
    # lateness leaves each latency before the cap, not after
    for _ in range(30):
        for _ in range(5):
            limit.on_loop_lag(0.002)
        for _ in range(20):
            t += 0.005
            limit.on_sample(t, 0.022, limit.limit)
    assert limit.limit < start / 2


def test_a_late_loop_during_the_measurement_does_not_pin_the_limit_low() -> None:
    s = LimitSettings(min_limit=1, max_limit=1000, initial_limit=50)
    limit = GradientLimit(s, 0.0)
    t = 0.0
    limit.on_loop_lag(0.002)  # one hiccup of the loop, four times the upstream's latency
    for _ in range(s.min_rtt_samples):
        t += 0.0005
        limit.on_sample(t, 0.0005, 1)
    min_rtt = limit.state().min_rtt
    assert min_rtt is not None and min_rtt >= 0.0005, "not below the fastest request seen"
    for _ in range(30):  # the upstream stays at its no-load latency, the loop quiet
        limit.on_loop_lag(0.0)
        for _ in range(20):
            t += 0.005
            limit.on_sample(t, 0.0005, limit.limit)
    assert limit.limit >= 40


def test_a_no_load_measurement_starts_the_run_of_queue_free_intervals_afresh() -> None:
    s = LimitSettings(min_rtt_samples=4, initial_limit=10, min_rtt_interval=1.0)
    limiter = GradientLimit(s, now=0.0)
    now = 0.0

    def interval(rtt: float) -> None:
        nonlocal now
        for _ in range(5):
            now += 0.021
            limiter.on_sample(now=now, rtt=rtt, in_flight=50)

    interval(0.010)  # the first measurement: 10 ms without load
    assert limiter.state().phase is Phase.ADAPTING
    while limiter.state().phase is Phase.ADAPTING:  # queue-free intervals, a run of them
        interval(0.010)
    interval(0.010)  # the measurement due after min_rtt_interval
    before = limiter.state()
    assert before.phase is Phase.ADAPTING
    interval(0.010)
    after = limiter.state()
    # the first interval after it grows as the first of a run does, not the tenth
    assert after.estimate == pytest.approx(
        next_limit(before.estimate, after.sample_rtt or 0.0, before.min_rtt or 0.0, s, 0)
    )
