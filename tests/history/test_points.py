"""The history's pure parts: when a point is due, what it holds, how points merge."""

from __future__ import annotations

import pytest

from controlplane.history.points import (
    EMPTY,
    HistoryPoint,
    VariantPoint,
    bucket_width,
    downsample,
    merge,
    point_due,
    point_of,
)
from controlplane.history.store import ended_width
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot

RULE = BreakerRule(service="shop", threshold_ms=250, window_sec=30, failure_ratio=0.2)


def snapshot(
    variant: str, count: int, p95: float | None, *, held: float = 30.0, shed: int = 0
) -> WindowSnapshot:
    return WindowSnapshot(
        experiment="7",
        variant=variant,
        count=count,
        shed=shed,
        failures=count // 10,
        window_sec=30,
        ts=1000.0,
        window_start=1000.0 - held,
        window_end=1000.0,
        p50_ms=p95 and p95 / 2,
        p95_ms=p95,
        p99_ms=p95 and p95 * 2,
    )


def point(
    at: int,
    p95: float,
    *,
    weight: int = 500,
    rps: float = 10.0,
    threshold: float = 250.0,
    failures: float = 0.0,
    shed_rps: float = 0.0,
) -> HistoryPoint:
    variant = VariantPoint(
        count=int(rps * 30),
        rps=rps,
        failure_ratio=failures,
        p50_ms=p95 / 2,
        p95_ms=p95,
        p99_ms=p95 * 2,
        shed=int(shed_rps * 30),
        shed_rps=shed_rps,
    )
    return HistoryPoint(
        experiment_id=7,
        at=at,
        span_sec=1,
        window_sec=30,
        canary_weight_bp=weight,
        threshold_ms=threshold,
        failure_bound=0.2,
        baseline=variant,
        canary=variant,
    )


@pytest.mark.parametrize(
    ("last", "now", "due"),
    [
        (None, 1000.2, True),
        (1000, 1000.9, False),
        (1000, 1001.0, True),
        (1000, 999.5, False),
    ],
)
def test_one_point_per_experiment_and_second(last: int | None, now: float, due: bool) -> None:
    assert point_due(last, now) is due


def test_a_point_holds_the_judged_windows_the_bounds_and_the_weight() -> None:
    made = point_of(
        7,
        {
            "baseline": snapshot("baseline", 600, 80.0),
            "canary": snapshot("canary", 60, 300.0, held=12.0, shed=36),
        },
        RULE,
        500,
        1000.7,
    )

    assert (made.at, made.span_sec, made.window_sec) == (1000, 1, 30)
    assert (made.threshold_ms, made.failure_bound, made.canary_weight_bp) == (250, 0.2, 500)
    assert made.baseline.rps == pytest.approx(20.0)
    assert made.canary.rps == pytest.approx(5.0), "the rate is over the span the window held"
    assert (made.canary.p95_ms, made.canary.failure_ratio) == (300.0, pytest.approx(0.1))
    assert (made.canary.shed, made.canary.shed_rps) == (36, pytest.approx(3.0))
    assert made.baseline.shed == 0, "what was shed is kept apart per variant"


def test_a_variant_without_a_window_is_an_empty_point() -> None:
    made = point_of(7, {"baseline": snapshot("baseline", 600, 80.0)}, RULE, 0, 1000.0)
    assert made.canary == EMPTY and made.canary.p95_ms is None


def test_a_bucket_keeps_peaks_means_and_the_strictest_bounds() -> None:
    merged = merge(
        [
            point(10, 100.0, weight=500, rps=10.0, threshold=250.0, failures=0.05, shed_rps=4.0),
            point(11, 400.0, weight=0, rps=30.0, threshold=200.0, failures=0.01),
        ],
        10,
        2,
    )
    assert merged.canary.p95_ms == 400.0, "a breach stays visible"
    assert merged.canary.failure_ratio == 0.05
    assert merged.canary.rps == 20.0 and merged.canary.count == 600
    assert merged.canary.shed_rps == 2.0 and merged.canary.shed == 60, "shed: the mean"
    assert merged.threshold_ms == 200.0 and merged.canary_weight_bp == 0
    assert (merged.at, merged.span_sec) == (10, 2)


def test_downsampling_merges_by_bucket_from_the_origin_and_leaves_single_points() -> None:
    points = [point(t, float(t)) for t in (100, 101, 102, 105, 109)]
    merged = downsample(points, origin=100, width=3)

    assert [p.at for p in merged] == [100, 105, 109]
    assert [p.canary.p95_ms for p in merged] == [102.0, 105.0, 109.0]
    assert merged[1] is points[3], "a bucket of one point is that point"


@pytest.mark.parametrize(
    ("start", "end", "points", "width"),
    [
        (0, 599, 600, 1),
        (0, 600, 600, 2),
        (0, 86_399, 1000, 87),
        (5, 5, 10, 1),
    ],
)
def test_the_bucket_width_fits_the_range_into_the_points(
    start: int, end: int, points: int, width: int
) -> None:
    assert bucket_width(start, end, points) == width
    assert (end - start) // width + 1 <= points


def test_an_ended_experiment_is_merged_only_when_it_holds_too_many_points() -> None:
    assert ended_width(1000, 0, 999, 1000) is None
    assert ended_width(86_400, 0, 86_399, 1000) == 87
    assert ended_width(1500, 0, 1499, 1000) == 2
