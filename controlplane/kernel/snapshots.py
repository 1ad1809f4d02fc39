"""A window snapshot: what the collector publishes and the controller decides on.

The JSON form is the `canary:stats:{<experiment>}` hash field value (architecture §5).

A snapshot's latency fields are the total time of its samples. Nested in it,
`first_byte` is the same window over the time to the first response byte, of the
samples that carry one: its `count` falls short of the outer one by the samples from
sidecars older than batch version 2 (`missing_first_byte`), and it is None from a
collector older than the first byte. `for_latency` picks the one a rule judges.

`shed` counts the requests the sidecars' overload protection answered themselves in
the window (tallies, never samples: docs/decisions/0025-overload-and-judgment.md);
the nested window carries the same number. 0 from a collector older than it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable
from dataclasses import dataclass, field, fields
from typing import Any, TypeGuard

import orjson

from controlplane.kernel.units import UnitSummary

TOTAL = "total"
FIRST_BYTE = "first_byte"
LATENCIES = (TOTAL, FIRST_BYTE)  # kernel/rules.py Latency's values

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
    # requests shed by the sidecars in the window: not in `count`, never latencies
    shed: int = 0
    # a bounded uniform reservoir of RTs (ms) from the window, for rank tests
    reservoir_ms: tuple[float, ...] = field(default_factory=tuple)
    # the unit (hash, 0: none) of each reservoir sample, in the same order; may be empty
    reservoir_units: tuple[int, ...] = field(default_factory=tuple)
    # per unit block sums and distinct units (controlplane/kernel/units.py); None when
    # the producer kept none
    units: UnitSummary | None = None
    # the same window over the first byte of the samples that have one (no nesting)
    first_byte: WindowSnapshot | None = None
    # which latency the latency fields are: "total", or "first_byte" in a nested window
    latency: str = TOTAL

    @property
    def memo(self) -> dict[Hashable, Any]:
        """Values a look derives from this window's contents, kept for its next look.

        A window whose partial fields did not change is handed to the next look as a
        restamped copy (collector/sharding.py: `restamped`, which copies `__dict__`):
        the same contents at a later instant (ts, window_end, sample_lag_ms). The copy
        shares this dict, so a look at nothing new finds what the last one derived.
        Hence two rules for whoever keeps a value here: derive it from the contents
        only, never from ts, window_end or sample_lag_ms; and never hand out the kept
        object to be changed (copy it, or keep something immutable). A new window
        (`dataclasses.replace`, `from_dict`, `for_latency`'s empty one) starts empty."""
        # kept in the instance's __dict__ by hand: a cached_property takes a lock on
        # its first read, which was most of what a look at a new window paid for this
        memo: dict[Hashable, Any] | None = self.__dict__.get("_memo")
        if memo is None:
            memo = self.__dict__["_memo"] = {}
        return memo

    @property
    def missing_first_byte(self) -> int:
        """Samples in the window without a first byte (from older sidecars)."""
        return self.count - (self.first_byte.count if self.first_byte is not None else 0)

    def for_latency(self, latency: str) -> WindowSnapshot:
        """The window a rule with `latency` ("total" or "first_byte") judges.

        For "first_byte", the nested window. Without one (from an older collector, or
        a first-byte window asked for the total), an empty window of the same span, so
        the verdict is no data, never a guess. A window of `latency` is itself."""
        if latency not in LATENCIES:
            raise ValueError(f"latency: total or first_byte, not {latency!r}")
        if latency == self.latency:
            return self
        if latency == FIRST_BYTE and self.first_byte is not None:
            return self.first_byte
        return WindowSnapshot(
            latency=latency,
            experiment=self.experiment,
            variant=self.variant,
            count=0,
            failures=0,
            window_sec=self.window_sec,
            ts=self.ts,
            window_start=self.window_start,
            window_end=self.window_end,
            threshold_ms=self.threshold_ms,
            sample_lag_ms=self.sample_lag_ms,
            shed=self.shed,
        )

    @property
    def failure_ratio(self) -> float:
        return self.failures / self.count if self.count else 0.0

    @property
    def shed_share(self) -> float:
        """The share of the variant's requests in the window that were shed."""
        total = self.count + self.shed
        return self.shed / total if total else 0.0

    @property
    def above_threshold_fraction(self) -> float:
        return self.above_threshold / self.count if self.count else 0.0

    def percentile_ms(self, q: float) -> float | None:
        value: float | None = getattr(self, PERCENTILE_FIELDS[q])
        return value

    def to_dict(self) -> dict[str, Any]:
        # field by field, not dataclasses.asdict: that deep-copies the reservoirs and
        # the unit summary value by value only for them to be replaced below, and was
        # most of a collector's publish (docs/decisions/0031-round-cost-at-scale.md)
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["reservoir_ms"] = list(self.reservoir_ms)
        data["reservoir_units"] = list(self.reservoir_units)
        data["units"] = self.units.to_dict() if self.units is not None else None
        data["first_byte"] = self.first_byte.to_dict() if self.first_byte is not None else None
        data["failure_ratio"] = self.failure_ratio
        data["above_threshold_fraction"] = self.above_threshold_fraction
        data["shed_share"] = self.shed_share
        return data

    def to_json(self) -> str:
        # orjson: json.dumps of a window's floats (its unit sums, its reservoir) was a
        # tenth of a collector's CPU, in its merged view (decision 0074). The text
        # holds the same numbers; a numpy scalar is written as its number
        return orjson.dumps(self.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY).decode()

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, nested: bool = False) -> WindowSnapshot:
        """Parse strictly: a snapshot can come from Redis, which anyone with write
        access there can fill; a ValueError names the first field out of bounds."""
        if not isinstance(data, dict):
            raise ValueError("a snapshot is a JSON object")
        first_byte = data.get("first_byte")
        if first_byte is not None and nested:
            raise ValueError("first_byte: a first-byte window has none of its own")
        if first_byte is not None and not isinstance(first_byte, dict):
            raise ValueError("first_byte: null or a snapshot object")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        _check_fields(known)
        known["reservoir_ms"] = tuple(known.get("reservoir_ms") or ())
        known["reservoir_units"] = tuple(int(u) for u in known.get("reservoir_units") or ())
        if len(known["reservoir_units"]) not in (0, len(known["reservoir_ms"])):
            raise ValueError("reservoir_units must match reservoir_ms in length")
        units = known.get("units")
        known["units"] = UnitSummary.from_dict(units) if isinstance(units, dict) else None
        if first_byte is not None:
            inner = cls.from_dict({**first_byte, "latency": FIRST_BYTE}, nested=True)
            if inner.count > known["count"] or inner.failures > known["failures"]:
                raise ValueError("first_byte: counts more samples than its window")
            known["first_byte"] = inner
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
_COUNT_FIELDS = ("count", "failures", "above_threshold", "shed")
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
    if data.get("latency", TOTAL) not in LATENCIES:
        raise ValueError("latency: total or first_byte")
    if not isinstance(data.get("threshold_exact", True), bool):
        raise ValueError("threshold_exact: a boolean")
    reservoir = data.get("reservoir_ms") or []
    if not isinstance(reservoir, list | tuple) or len(reservoir) > MAX_RESERVOIR:
        raise ValueError(f"reservoir_ms: a list of at most {MAX_RESERVOIR} samples")
    if not all(_is_number(v) and 0 <= v <= MAX_MS for v in reservoir):
        raise ValueError("reservoir_ms: finite, non-negative milliseconds")
    units = data.get("reservoir_units") or []
    if not isinstance(units, list | tuple) or not all(_is_int(u) and 0 <= u < 2**32 for u in units):
        raise ValueError("reservoir_units: 32-bit unit hashes")
