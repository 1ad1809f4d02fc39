"""Provider metrics in the history, pure parts: the bound plotted, one point per
reading, and how points merge."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.history.metric_points import (
    MetricPoint,
    downsample_metric,
    merge_metric,
    metric_bound,
    metric_point_of,
    new_readings,
)
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.providers.evidence import MetricEvidence, Reading

Q = 'sum(x{variant="$variant"})'


def spec(**fields: object) -> MetricSpec:
    base: dict[str, object] = {"name": "memory", "kind": "gauge", "query": Q, "bound": 100.0}
    base.update(fields)
    return MetricSpec.model_validate(base)


def evidence(name: str, canary: float | None, baseline: float | None, read_at: float
             ) -> MetricEvidence:  # fmt: skip
    def reading(v: float | None) -> Reading:
        return Reading(v) if v is not None else Reading.missing("empty answer")

    return MetricEvidence(name, reading(canary), reading(baseline), read_at)


@pytest.mark.parametrize(
    ("fields", "baseline", "expected"),
    [
        ({}, 50.0, 100.0),
        ({}, None, 100.0),
        ({"compare": "baseline", "bound": None, "margin": 0.1}, 200.0, 220.0),
        ({"compare": "baseline", "bound": None, "margin": 0.1, "direction": "decrease"},
         200.0, 180.0),
        ({"compare": "baseline", "bound": None, "margin": 0.1}, -200.0, -180.0),
        ({"compare": "baseline", "bound": None, "margin": 0.1}, None, None),
        ({"kind": "ratio", "total_query": Q, "compare": "baseline", "bound": None,
          "margin": 0.01}, 0.02, 0.03),
        ({"kind": "ratio", "total_query": Q, "bound": 0.05}, 0.02, 0.05),
    ],
    ids=["absolute", "absolute-no-data", "share-above", "share-below", "share-of-negative",
         "baseline-no-data", "ratio-added", "ratio-absolute"],
)
def test_the_bound_is_what_the_canary_was_compared_with(
    fields: dict[str, object], baseline: float | None, expected: float | None
) -> None:
    found = metric_bound(spec(**fields), baseline)
    assert found == (pytest.approx(expected) if expected is not None else None)


def test_a_reading_becomes_one_point_and_is_not_taken_twice() -> None:
    specs = [spec(), spec(name="latency_p99", kind="histogram", bound=0.5)]
    read = {"memory": evidence("memory", 120.0, None, 1000.7)}

    first = new_readings(7, specs, read, {})
    again = new_readings(7, specs, read, {"memory": 1000.7})

    assert first == [MetricPoint(7, "memory", 1000, 1, "gauge", "absolute", None, 120.0, 100.0)]
    assert again == [], "the same reading is not recorded again; latency_p99 was never read"
    newer = {"memory": evidence("memory", 90.0, 80.0, 1015.2)}
    assert [p.at for p in new_readings(7, specs, newer, {"memory": 1000.7})] == [1015]


@pytest.mark.parametrize("read_at", [float("nan"), float("inf"), -1.0])
def test_a_reading_without_a_usable_clock_is_skipped(read_at: float) -> None:
    read = {"memory": evidence("memory", 1.0, 1.0, read_at)}
    assert new_readings(7, [spec()], read, {}) == []


def test_a_non_finite_value_is_no_data() -> None:
    read = {"memory": evidence("memory", float("nan"), 3.0, 10.0)}
    (point,) = new_readings(7, [spec()], read, {})
    assert (point.canary, point.baseline) == (None, 3.0)


def points(values: list[tuple[int, float | None, float | None, float | None]]
           ) -> list[MetricPoint]:  # fmt: skip
    return [MetricPoint(7, "memory", at, 1, "gauge", "baseline", b, c, bound)
            for at, b, c, bound in values]  # fmt: skip


def test_a_bucket_keeps_each_values_peak_and_the_strictest_bound() -> None:
    merged = merge_metric(
        points([(10, 1.0, 5.0, 3.0), (25, None, 9.0, 2.0), (40, 4.0, None, None)]), 10, 60
    )
    assert (merged.at, merged.span_sec) == (10, 60)
    assert (merged.baseline, merged.canary, merged.bound) == (4.0, 9.0, 2.0)
    empty = merge_metric(points([(10, None, None, None), (20, None, None, None)]), 10, 60)
    assert (empty.baseline, empty.canary, empty.bound) == (None, None, None), "a gap stays a gap"


def test_a_bucket_of_a_metric_guarding_a_fall_keeps_troughs_and_the_highest_bound() -> None:
    falling = [replace(p, direction="decrease") for p in
               points([(10, 1.0, 5.0, 3.0), (25, None, 0.5, 2.0), (40, 4.0, None, None)])]
    merged = merge_metric(falling, 10, 60)
    assert (merged.baseline, merged.canary, merged.bound) == (1.0, 0.5, 3.0)
    assert merged.direction == "decrease"


def test_a_reading_carries_its_metrics_direction() -> None:
    falling = spec(compare="baseline", bound=None, margin=0.1, direction="decrease")
    point = metric_point_of(7, falling, evidence("memory", 150.0, 200.0, 1000.0))
    assert (point.direction, point.canary, point.bound) == ("decrease", 150.0, 180.0)
    assert metric_point_of(7, spec(), evidence("memory", 1.0, 1.0, 1000.0)).direction == (
        "increase"
    )


def test_downsampling_buckets_from_the_origin_and_leaves_lone_points_as_they_are() -> None:
    found = downsample_metric(
        points([(0, 1.0, 1.0, 1.0), (15, 2.0, 2.0, 2.0), (30, 3.0, 3.0, 3.0)]), 0, 30
    )
    assert [(p.at, p.span_sec, p.canary) for p in found] == [(0, 30, 2.0), (30, 1, 3.0)]
    with pytest.raises(ValueError):
        downsample_metric([], 0, 0)
