"""The window engine against exact numpy computations on the same samples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.collector.windows import (
    MAX_WINDOW_SEC,
    ExperimentWindow,
    LogMapping,
    WindowConfig,
)
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import DecodedBatch
from controlplane.kernel.rules import PERCENTILES

ALPHA = 0.01
START = 1_800_000_000.0


def batch(
    rt_us: np.ndarray,
    ts: np.ndarray | float,
    *,
    variant: np.ndarray | None = None,
    outcome: np.ndarray | None = None,
    names: tuple[str, ...] = ("baseline", "canary"),
) -> DecodedBatch:
    n = len(rt_us)
    return DecodedBatch(
        variants=names,
        ts=np.broadcast_to(np.asarray(ts, dtype=np.float64), (n,)).copy(),
        variant=np.zeros(n, np.uint8) if variant is None else variant.astype(np.uint8),
        rt_us=np.asarray(rt_us).astype(np.uint32),
        outcome=np.full(n, 200, np.uint16) if outcome is None else outcome.astype(np.uint16),
        unit=np.zeros(n, np.uint32),
    )


def window(clock: FakeClock, **config: object) -> ExperimentWindow:
    return ExperimentWindow("exp-1", WindowConfig(**config), clock_now=clock.now(), seed=7)  # type: ignore[arg-type]


def distribution(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "lognormal":
        values = rng.lognormal(np.log(40_000), 0.9, n)
    elif kind == "bimodal":
        values = np.where(
            rng.random(n) < 0.8, rng.normal(20_000, 2_000, n), rng.normal(900_000, 50_000, n)
        )
    elif kind == "pareto":
        values = (rng.pareto(1.5, n) + 1) * 5_000
    else:
        values = np.full(n, 123_456.0)
    return np.clip(values, 0, 2**32 - 1).astype(np.uint32)


def assert_within_alpha(reported: float | None, rt_us: np.ndarray, q: float) -> None:
    exact = float(np.percentile(rt_us, q, method="inverted_cdf")) / 1000
    assert reported is not None
    if exact == 0:
        assert reported == 0
    else:
        assert abs(reported - exact) / exact <= ALPHA, (q, reported, exact)


@pytest.mark.parametrize("kind", ["lognormal", "bimodal", "pareto", "constant"])
def test_percentiles_within_alpha_of_inverted_cdf(kind: str) -> None:
    clock = FakeClock(START)
    w = window(clock, window_sec=60, threshold_ms=100.0)
    rt = distribution(kind, 200_000, seed=1)
    ts = clock.now() - np.linspace(50, 0, rt.shape[0])
    for lo in range(0, rt.shape[0], 512):
        w.record(batch(rt[lo : lo + 512], ts[lo : lo + 512]), clock.now())
    snap = w.snapshot(clock.now())["baseline"]
    assert snap.count == rt.shape[0]
    for q in PERCENTILES:
        assert_within_alpha(snap.percentile_ms(q), rt, q)
    assert snap.above_threshold == int(np.count_nonzero(rt > 100_000))
    assert snap.threshold_exact


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=1, max_size=300),
    threshold_ms=st.floats(min_value=0.001, max_value=4e6),
)
def test_every_percentile_within_alpha_and_above_count_exact(
    values: list[int], threshold_ms: float
) -> None:
    clock = FakeClock(START)
    w = window(clock, window_sec=10, threshold_ms=threshold_ms)
    rt = np.array(values, dtype=np.uint32)
    w.record(batch(rt, clock.now()), clock.now())
    snap = w.snapshot(clock.now())["baseline"]
    for q in PERCENTILES:
        assert_within_alpha(snap.percentile_ms(q), rt, q)
    assert snap.above_threshold == int(np.count_nonzero(rt > threshold_ms * 1000))


def test_mapping_bounds_cover_microsecond_to_uint32() -> None:
    mapping = LogMapping(ALPHA)
    values = np.array([0, 1, 2, 3, 999, 10**6, 3_600 * 10**6, 2**32 - 1], dtype=np.uint32)
    index = mapping.index(values)
    assert index.min() >= 0 and index.max() < mapping.bins
    rep = mapping.representative_us[index]
    assert rep[0] == 0
    assert np.all(np.abs(rep[1:] - values[1:]) / values[1:] <= ALPHA)
    assert mapping.bins < 1200


def test_failures_follow_outcome_semantics_and_rule_statuses() -> None:
    clock = FakeClock(START)
    outcome = np.array([200, 404, 500, 503, 0, 1, 2, 429])
    rt = np.full(outcome.shape[0], 1000)
    w = window(clock)
    w.record(batch(rt, clock.now(), outcome=outcome), clock.now())
    assert w.snapshot(clock.now())["baseline"].failures == 4  # 500, 503, connect, timeout
    custom = window(clock, failure_statuses=frozenset({429, 503}))
    custom.record(batch(rt, clock.now(), outcome=outcome), clock.now())
    assert custom.snapshot(clock.now())["baseline"].failures == 4  # 503, 429, connect, timeout


def test_grpc_outcomes_fail_by_the_rule_codes_whatever_the_http_statuses() -> None:
    clock = FakeClock(START)
    # OK, UNKNOWN, DEADLINE_EXCEEDED, NOT_FOUND, UNAVAILABLE, and a plain 503
    outcome = np.array([1000, 1002, 1004, 1005, 1014, 503])
    rt = np.full(outcome.shape[0], 1000)
    cases = [
        ({}, 5),  # every non-zero code, and the 503
        ({"failure_statuses": frozenset({429})}, 4),  # the table: codes as by default
        ({"grpc_failure_codes": frozenset({14})}, 2),  # UNAVAILABLE and the 503
        ({"grpc_failure_codes": frozenset({4, 14}), "failure_statuses": frozenset({429})}, 2),
    ]
    for config, failures in cases:
        w = window(clock, **config)
        w.record(batch(rt, clock.now(), outcome=outcome), clock.now())
        assert w.snapshot(clock.now())["baseline"].failures == failures, config


def test_window_slides_evicting_whole_seconds() -> None:
    clock = FakeClock(START)
    w = window(clock, window_sec=10)
    for _ in range(20):
        w.record(batch(np.full(100, 5_000), clock.now()), clock.now())
        clock.advance(1)
    snap = w.snapshot(clock.now())["baseline"]
    # seconds now-9 … now are in the window; now holds nothing yet
    assert snap.count == 900
    assert snap.window_start == float(int(clock.now()) - 9)
    clock.advance(30)
    snap = w.snapshot(clock.now())["baseline"]
    assert snap.count == 0 and snap.p95_ms is None


def test_late_samples_are_counted_and_dropped_future_ones_clamped() -> None:
    clock = FakeClock(START)
    w = window(clock, window_sec=10)
    ts = np.array([clock.now() - 100, clock.now() - 5, clock.now() + 1, clock.now() + 60])
    w.record(batch(np.full(4, 1_000), ts), clock.now())
    assert w.counters.late == 1
    assert w.counters.clamped == 1
    assert w.snapshot(clock.now())["baseline"].count == 3


def test_window_length_follows_the_rule_live() -> None:
    clock = FakeClock(START)
    w = window(clock, window_sec=30)
    for _ in range(30):
        w.record(batch(np.full(10, 5_000), clock.now()), clock.now())
        clock.advance(1)
    assert w.snapshot(clock.now())["baseline"].count == 290
    w.reconfigure(WindowConfig(window_sec=5), clock.now())
    assert w.snapshot(clock.now())["baseline"].count == 40
    w.reconfigure(WindowConfig(window_sec=20), clock.now())
    # grown back: the seconds still held in the ring return to the window
    assert w.snapshot(clock.now())["baseline"].count == 190
    w.reconfigure(WindowConfig(window_sec=120), clock.now())
    assert w.snapshot(clock.now())["baseline"].count == 300  # the first second is back too


def test_threshold_change_is_inexact_until_old_buckets_leave() -> None:
    clock = FakeClock(START)
    w = window(clock, window_sec=5, threshold_ms=10.0)
    rt = np.array([5_000, 15_000, 25_000] * 10)
    for _ in range(5):
        w.record(batch(rt, clock.now()), clock.now())
        clock.advance(1)
    snap = w.snapshot(clock.now())["baseline"]
    assert snap.threshold_exact and snap.above_threshold == 80
    w.reconfigure(WindowConfig(window_sec=5, threshold_ms=20.0), clock.now())
    snap = w.snapshot(clock.now())["baseline"]
    assert not snap.threshold_exact
    assert snap.above_threshold == 40  # the histogram's estimate: 25 ms only
    for _ in range(5):
        w.record(batch(rt, clock.now()), clock.now())
        clock.advance(1)
    w.record(batch(rt, clock.now()), clock.now())
    snap = w.snapshot(clock.now())["baseline"]
    assert snap.threshold_exact
    assert snap.above_threshold == snap.count // 3


def test_memory_is_bounded_by_the_longest_window() -> None:
    clock = FakeClock(START)
    w = window(clock, window_sec=60)
    rng = np.random.default_rng(3)
    w.record(batch(distribution("lognormal", 10_000, 2), clock.now()), clock.now())
    small = w.nbytes()
    for _ in range(200):
        w.record(batch(rng.integers(0, 2**32 - 1, 2_000), clock.now()), clock.now())
        clock.advance(1)
    assert w.nbytes() == small  # traffic does not grow it
    # two variants (the batch names both), two latencies each (total, first byte);
    # per second about 9 KB of histogram and 2 KB of unit-block sums (distinct-unit
    # sketches add at most 4 KB per second)
    assert small < 2 * 2 * 480 * 1024
    w.reconfigure(WindowConfig(window_sec=10_000), clock.now())
    assert w.config.window_sec == 10_000
    capped = ExperimentWindow("e", WindowConfig(window_sec=MAX_WINDOW_SEC), clock_now=START)
    capped.record(batch(np.full(10, 1), START), START)
    # an hour, two latencies: histograms and unit sums
    assert capped.nbytes() <= 2 * 2 * 26 * 1024 * 1024


def test_reservoir_is_bounded_uniform_sample_of_the_window() -> None:
    clock = FakeClock(START)
    w = window(clock, window_sec=60)
    for second in range(40):
        rt = np.full(5_000, 1_000 if second < 20 else 3_000)
        w.record(batch(rt, clock.now()), clock.now())
        clock.advance(1)
    res = np.array(w.snapshot(clock.now())["baseline"].reservoir_ms)
    assert res.shape[0] == 512
    share = float(np.mean(res == 1.0))
    assert 0.35 < share < 0.65


def test_variants_are_kept_apart() -> None:
    clock = FakeClock(START)
    w = window(clock)
    variant = np.array([0, 1] * 50)
    rt = np.where(variant == 0, 1_000, 9_000)
    w.record(batch(rt, clock.now(), variant=variant), clock.now())
    snaps = w.snapshot(clock.now())
    assert snaps["baseline"].p50_ms == pytest.approx(1.0, rel=ALPHA)
    assert snaps["canary"].p50_ms == pytest.approx(9.0, rel=ALPHA)
    assert snaps["canary"].count == 50
