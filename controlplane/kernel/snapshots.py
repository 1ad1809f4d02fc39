"""A window snapshot: what the collector publishes and the controller decides on.

The JSON form is the `canary:stats:{<experiment>}` hash field value (architecture §5).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

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
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["reservoir_ms"] = tuple(known.get("reservoir_ms") or ())
        known["reservoir_units"] = tuple(int(u) for u in known.get("reservoir_units") or ())
        if len(known["reservoir_units"]) not in (0, len(known["reservoir_ms"])):
            raise ValueError("reservoir_units must match reservoir_ms in length")
        units = known.get("units")
        known["units"] = UnitSummary.from_dict(units) if isinstance(units, dict) else None
        return cls(**known)

    @classmethod
    def from_json(cls, raw: bytes | str) -> WindowSnapshot:
        return cls.from_dict(json.loads(raw))
