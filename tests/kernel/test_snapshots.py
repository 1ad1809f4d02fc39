"""Snapshots read back from Redis are parsed strictly: whoever can write the stats hash
must not hand the controller a count of "lots" or a time of 1e308."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from controlplane.kernel.snapshots import WindowSnapshot


def snapshot(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "experiment": "7",
        "variant": "canary",
        "count": 200,
        "failures": 3,
        "window_sec": 10,
        "ts": 1_800_000_000.5,
        "window_start": 1_799_999_990.5,
        "window_end": 1_800_000_000.5,
        "p95_ms": 180.0,
        "above_threshold": 4,
        "threshold_ms": 300,
        "sample_lag_ms": 12.5,
        "reservoir_ms": [100.0, 150.5, 90],
        "reservoir_units": [1, 2, 0],
    }
    data.update(changes)
    return data


def test_a_well_formed_snapshot_round_trips() -> None:
    parsed = WindowSnapshot.from_json(json.dumps(snapshot()))
    assert parsed.count == 200 and parsed.reservoir_ms == (100.0, 150.5, 90)
    assert WindowSnapshot.from_json(parsed.to_json()) == parsed


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("count", "lots"),
        ("count", -1),
        ("count", True),
        ("count", 2**60),
        ("failures", -5),
        ("failures", 201),  # more than count: "cannot exceed count"
        ("above_threshold", 500),
        ("window_sec", 0),
        ("window_sec", 10.5),
        ("ts", 1e308),
        ("ts", math.inf),
        ("window_start", "yesterday"),
        ("p95_ms", -1.0),
        ("p95_ms", math.nan),
        ("threshold_ms", 1e12),
        ("sample_lag_ms", "slow"),
        ("threshold_exact", "yes"),
        ("reservoir_ms", [1.0, -3.0]),
        ("reservoir_ms", "100"),
        ("reservoir_ms", [0.0] * 100_001),
        ("reservoir_units", [2**40, 0, 0]),
        ("experiment", ""),
        ("variant", "x" * 65),
        ("variant", "canary\x1b[2J"),
    ],
)
def test_a_field_out_of_bounds_is_refused_by_name(field: str, value: Any) -> None:
    raw = json.dumps(snapshot(**{field: value}))
    with pytest.raises(ValueError) as refused:
        WindowSnapshot.from_json(raw)
    message = str(refused.value)
    assert field in message or "cannot exceed count" in message


def test_a_missing_field_or_a_non_object_is_refused() -> None:
    data = snapshot()
    del data["window_end"]
    with pytest.raises(ValueError, match="window_end"):
        WindowSnapshot.from_dict(data)
    with pytest.raises(ValueError):
        WindowSnapshot.from_json("[1, 2]")


def test_a_first_byte_window_round_trips_nested() -> None:
    inner = snapshot(count=150, failures=2, p95_ms=20.0, above_threshold=0)
    parsed = WindowSnapshot.from_json(json.dumps(snapshot(first_byte=inner)))
    assert parsed.first_byte is not None and parsed.first_byte.p95_ms == 20.0
    assert parsed.missing_first_byte == 50
    assert WindowSnapshot.from_json(parsed.to_json()) == parsed
    assert parsed.for_latency("first_byte") == parsed.first_byte
    assert parsed.for_latency("total") == parsed


def test_a_snapshot_without_a_first_byte_window_judges_first_byte_on_nothing() -> None:
    parsed = WindowSnapshot.from_json(json.dumps(snapshot()))
    assert parsed.first_byte is None and parsed.missing_first_byte == 200
    empty = parsed.for_latency("first_byte")
    assert empty.count == 0 and empty.p95_ms is None and empty.window_end == parsed.window_end
    with pytest.raises(ValueError, match="latency"):
        parsed.for_latency("ttfb")


@pytest.mark.parametrize(
    "first_byte",
    [
        snapshot(count=201),  # more samples than its window
        snapshot(count=100, failures=4),  # more failures than its window
        snapshot(count=100, failures=0, first_byte=snapshot(count=10, failures=0)),  # nested
        [1, 2],
        "fast",
        snapshot(count=-1),
    ],
)
def test_a_malformed_first_byte_window_is_refused(first_byte: Any) -> None:
    with pytest.raises(ValueError):
        WindowSnapshot.from_json(json.dumps(snapshot(first_byte=first_byte)))
