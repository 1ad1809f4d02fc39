"""A window snapshot: what the collector publishes and the controller decides on.

The JSON form is the `canary:stats:{<experiment>}` hash field value (architecture §5).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, TypeGuard

from controlplane.kernel.units import UnitSummary

PERCENTILE_FIELDS: dict[float, str] = {
    50: "p50_ms",
    90: "p90_ms",
    95: "p95_ms",
    99: "p99_ms",
    99.9: "p999_ms",
}


@dataclass(frozen=True)
class WindowSnapshot:
    """One variant's sliding window at one instant. Percentiles are None when empty."""

    experiment: str
    variant: str
    count: int
    failures: int
    window_sec: int
    ts: float
    window_start: float
    window_end: float
    mean_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    threshold_ms: float | None = None
    above_threshold: int = 0
    threshold_exact: bool = True
    sample_lag_ms: float | None = None
    # a bounded uniform reservoir of RTs (ms) from the window, for rank tests
    reservoir_ms: tuple[float, ...] = field(default_factory=tuple)
    # the unit (hash, 0: none) of each reservoir sample, in the same order; may be empty
    reservoir_units: tuple[int, ...] = field(default_factory=tuple)
    # per unit block sums and distinct units (controlplane/kernel/units.py); None when
    # the producer kept none
    units: UnitSummary | None = None

    @property
    def failure_ratio(self) -> float:
        return self.failures / self.count if self.count else 0.0

    @property
    def above_threshold_fraction(self) -> float:
        return self.above_threshold / self.count if self.count else 0.0

    def percentile_ms(self, q: float) -> float | None:
        value: float | None = getattr(self, PERCENTILE_FIELDS[q])
        return value

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["reservoir_ms"] = list(self.reservoir_ms)
        data["reservoir_units"] = list(self.reservoir_units)
        data["units"] = self.units.to_dict() if self.units is not None else None
        data["failure_ratio"] = self.failure_ratio
        data["above_threshold_fraction"] = self.above_threshold_fraction
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WindowSnapshot:
        """Parse strictly: a snapshot can come from Redis, which anyone with write
        access there can fill; a ValueError names the first field out of bounds."""
        if not isinstance(data, dict):
            raise ValueError("a snapshot is a JSON object")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        _check_fields(known)
        known["reservoir_ms"] = tuple(known.get("reservoir_ms") or ())
        known["reservoir_units"] = tuple(int(u) for u in known.get("reservoir_units") or ())
        if len(known["reservoir_units"]) not in (0, len(known["reservoir_ms"])):
            raise ValueError("reservoir_units must match reservoir_ms in length")
        units = known.get("units")
        known["units"] = UnitSummary.from_dict(units) if isinstance(units, dict) else None
        return cls(**known)

    @classmethod
    def from_json(cls, raw: bytes | str) -> WindowSnapshot:
        if len(raw) > MAX_SNAPSHOT_BYTES:
            raise ValueError(f"a snapshot is larger than {MAX_SNAPSHOT_BYTES} bytes")
        return cls.from_dict(json.loads(raw))


# bounds of what a real window can hold: counts within exact float range, times before
# the year 5000, latencies under 11.5 days, a reservoir far larger than the collector's
MAX_COUNT = 2**53
MAX_EPOCH_SEC = 1e11
MAX_MS = 1e9
MAX_RESERVOIR = 100_000
MAX_SNAPSHOT_BYTES = 16 * 1024 * 1024
_NAME_FIELDS = ("experiment", "variant")
_COUNT_FIELDS = ("count", "failures", "above_threshold")
_TIME_FIELDS = ("ts", "window_start", "window_end")
_MS_FIELDS = ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "threshold_ms")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _check_fields(data: dict[str, Any]) -> None:
    for name in _NAME_FIELDS:
        value = data.get(name)
        if not isinstance(value, str) or not 0 < len(value) <= 64 or not value.isprintable():
            raise ValueError(f"{name}: a printable name of 1-64 characters")
    for name in _COUNT_FIELDS:
        value = data.get(name, 0)
        if not _is_int(value) or not 0 <= value <= MAX_COUNT:
            raise ValueError(f"{name}: an integer in 0..2^53")
    if data["failures"] > data["count"] or data.get("above_threshold", 0) > data["count"]:
        raise ValueError("failures and above_threshold cannot exceed count")
    window = data.get("window_sec")
    if not _is_int(window) or not 1 <= window <= 86_400:
        raise ValueError("window_sec: an integer in 1..86400")
    for name in _TIME_FIELDS:
        value = data.get(name)
        if not _is_number(value) or not 0 <= value <= MAX_EPOCH_SEC:
            raise ValueError(f"{name}: a finite time in seconds since the epoch")
    for name in (*_MS_FIELDS, "sample_lag_ms"):
        value = data.get(name)
        low = -MAX_MS if name == "sample_lag_ms" else 0
        if value is not None and (not _is_number(value) or not low <= value <= MAX_MS):
            raise ValueError(f"{name}: null or a finite number of milliseconds")
    if not isinstance(data.get("threshold_exact", True), bool):
        raise ValueError("threshold_exact: a boolean")
    reservoir = data.get("reservoir_ms") or []
    if not isinstance(reservoir, list | tuple) or len(reservoir) > MAX_RESERVOIR:
        raise ValueError(f"reservoir_ms: a list of at most {MAX_RESERVOIR} samples")
    if not all(_is_number(v) and 0 <= v <= MAX_MS for v in reservoir):
        raise ValueError("reservoir_ms: finite, non-negative milliseconds")
    units = data.get("reservoir_units") or []
    if not isinstance(units, list | tuple) or not all(
        _is_int(u) and 0 <= u < 2**32 for u in units
    ):
        raise ValueError("reservoir_units: 32-bit unit hashes")
