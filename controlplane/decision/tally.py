"""Evidence gathered over a step or a probe by adding up disjoint windows.

A sliding window may hold fewer than `min_samples` canary samples at a low weight
(1% of 200 req/s over 10 s is 20 samples), yet the step has to show `min_samples`
before it may advance. Counts, failures and above-threshold counts are exact and
add up, so windows that do not overlap are summed into one merged snapshot; only
windows that start at or after the previous one's end are added, so no sample is
counted twice. The sum is a lower bound of what the step really saw (the gaps
between counted windows are left out), which errs on the side of waiting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from operator import itemgetter
from typing import Any

import numpy as np

from controlplane.kernel.json_text import FrozenDict
from controlplane.kernel.routes import BASELINE, CANARY
from controlplane.kernel.snapshots import FIRST_BYTE, PERCENTILE_FIELDS, TOTAL, WindowSnapshot
from controlplane.kernel.units import DISTINCT_K, UnitSummary

# the merged reservoir stays bounded; a window's share of it follows its count
RESERVOIR_CAP = 2000
# integers below this are exact in float64
_EXACT = 2.0**53


def _picks(length: int, keep: int) -> list[int] | None:
    """The indices of `keep` evenly spaced elements of `length` (None: all of them).

    Deterministic, so decide() stays pure: element int(i * length / keep) for each i,
    the float product computed as Python computes it (numpy's float64 is the same).
    """
    if keep >= length:
        return None
    if keep <= 0:
        return []
    picks: list[int] = (np.arange(keep) * (length / keep)).astype(np.int64).tolist()
    return picks


def _take(values: tuple[Any, ...], picks: list[int] | None) -> tuple[Any, ...]:
    if picks is None:
        return values
    if len(picks) < 2:
        # itemgetter of one index returns the element, not a 1-tuple
        return tuple(values[i] for i in picks)
    taken: tuple[Any, ...] = itemgetter(*picks)(values)
    return taken


def _thin(values: tuple[float, ...], keep: int) -> tuple[float, ...]:
    """`keep` evenly spaced elements."""
    return _take(values, _picks(len(values), keep))


def _merge_picks(
    old_len: int, old_count: int, new_len: int, new_count: int
) -> tuple[list[int] | None, list[int] | None] | None:
    """Which elements of the old and the new reservoir the merged one keeps (None: all)."""
    if old_len + new_len <= RESERVOIR_CAP:
        return None
    total = old_count + new_count
    keep_old = round(RESERVOIR_CAP * old_count / total) if total else 0
    keep_new = RESERVOIR_CAP - keep_old
    return _picks(old_len, keep_old), _picks(new_len, keep_new)


def _merged(
    old: tuple[Any, ...],
    new: tuple[Any, ...],
    picks: tuple[list[int] | None, list[int] | None] | None,
) -> tuple[Any, ...]:
    if picks is None:
        return old + new
    return _take(old, picks[0]) + _take(new, picks[1])


def _merge_reservoirs(
    old: tuple[float, ...], old_count: int, new: tuple[float, ...], new_count: int
) -> tuple[float, ...]:
    return _merged(old, new, _merge_picks(len(old), old_count, len(new), new_count))


def _merge_reservoir_units(
    old: tuple[int, ...],
    old_values: tuple[float, ...],
    old_count: int,
    new: tuple[int, ...],
    new_values: tuple[float, ...],
    new_count: int,
) -> tuple[int, ...]:
    """The units of `_merge_reservoirs`' result, thinned the same way (empty if either
    side has none: a reservoir is all with units or all without)."""
    if len(old) != len(old_values) or len(new) != len(new_values) or not new:
        return ()
    if old_count and not old:
        return ()
    picks = _merge_picks(len(old_values), old_count, len(new_values), new_count)
    return tuple(map(int, _merged(old, new, picks)))


def _sorted(values: tuple[float, ...]) -> tuple[float, ...]:
    """sorted(values), the same elements in the same order, by numpy where it is exact.

    A stable sort keeps equal elements (0.0 and -0.0, 1 and 1.0) in their order, as
    sorted() does; numbers below 2**53 compare in float64 as Python compares them.
    NaN, infinities, larger integers or non-numbers are left to sorted().
    """
    if len(values) < 2:
        return tuple(values)
    array = np.asarray(values)
    if array.dtype != np.float64 or not float(np.abs(array).max()) < _EXACT:
        return tuple(sorted(values))
    order: tuple[float, ...] = itemgetter(*np.argsort(array, kind="stable").tolist())(values)
    return order


def _add_units(old: UnitSummary | None, first: bool, new: UnitSummary | None) -> UnitSummary | None:
    if new is None:
        return None
    if first:
        return new
    return old.add(new) if old is not None else None


def _same_threshold(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9)


@dataclass(frozen=True)
class VariantTally:
    count: int = 0
    failures: int = 0
    above_threshold: int = 0
    threshold_ms: float | None = None
    threshold_exact: bool = True
    reservoir_ms: tuple[float, ...] = ()
    # the last added window's reported percentiles, used when there is no reservoir
    percentiles_ms: tuple[tuple[float, float | None], ...] = ()
    reservoir_units: tuple[int, ...] = ()
    # the windows' unit sums added up (units stay in their block), None once a window
    # came without them
    units: UnitSummary | None = None

    def add(self, snap: WindowSnapshot) -> VariantTally:
        first = not self.percentiles_ms  # nothing added yet
        exact = snap.threshold_exact and (
            first
            or (self.threshold_exact and _same_threshold(self.threshold_ms, snap.threshold_ms))
        )
        # the units are thinned with the same picks as the values they belong to
        picks = _merge_picks(len(self.reservoir_ms), self.count, len(snap.reservoir_ms), snap.count)
        return VariantTally(
            count=self.count + snap.count,
            failures=self.failures + snap.failures,
            above_threshold=self.above_threshold + snap.above_threshold,
            threshold_ms=snap.threshold_ms if first else self.threshold_ms,
            threshold_exact=exact,
            reservoir_ms=_merged(self.reservoir_ms, snap.reservoir_ms, picks),
            percentiles_ms=tuple((q, snap.percentile_ms(q)) for q in PERCENTILE_FIELDS),
            reservoir_units=self._merged_units(snap, picks),
            units=_add_units(self.units, first, snap.units),
        )

    def _merged_units(
        self, snap: WindowSnapshot, picks: tuple[list[int] | None, list[int] | None] | None
    ) -> tuple[int, ...]:
        """`_merge_reservoir_units` with the values' picks already made."""
        old, new = self.reservoir_units, snap.reservoir_units
        if len(old) != len(self.reservoir_ms) or len(new) != len(snap.reservoir_ms) or not new:
            return ()
        if self.count and not old:
            return ()
        return tuple(map(int, _merged(old, new, picks)))

    def percentile_ms(self, q: float) -> float | None:
        if self.reservoir_ms:
            # P_q as the smallest x with F(x) >= q, the definition the exact counts use
            ordered = self._ordered
            rank = max(math.ceil(q / 100 * len(ordered)), 1)
            return ordered[rank - 1]
        return dict(self.percentiles_ms).get(q)

    @cached_property
    def _ordered(self) -> tuple[float, ...]:
        # sorted once per value: a snapshot reads five percentiles of the same tally
        return _sorted(self.reservoir_ms)

    def to_snapshot(
        self,
        experiment: str,
        variant: str,
        window_start: float,
        window_end: float,
        latency: str = TOTAL,
    ) -> WindowSnapshot:
        pcts = {PERCENTILE_FIELDS[q]: self.percentile_ms(q) for q in PERCENTILE_FIELDS}
        return WindowSnapshot(
            latency=latency,
            experiment=experiment,
            variant=variant,
            count=self.count,
            failures=self.failures,
            window_sec=max(round(window_end - window_start), 0),
            ts=window_end,
            window_start=window_start,
            window_end=window_end,
            threshold_ms=self.threshold_ms,
            above_threshold=self.above_threshold,
            threshold_exact=self.threshold_exact,
            reservoir_ms=self.reservoir_ms,
            reservoir_units=self.reservoir_units,
            units=self.units,
            p50_ms=pcts["p50_ms"],
            p90_ms=pcts["p90_ms"],
            p95_ms=pcts["p95_ms"],
            p99_ms=pcts["p99_ms"],
            p999_ms=pcts["p999_ms"],
        )

    def to_dict(self) -> dict[str, Any]:
        return self._dict

    @cached_property
    def _dict(self) -> FrozenDict:
        # built once per value: a step's tally stays the same object between windows
        return FrozenDict({
            "count": self.count,
            "failures": self.failures,
            "above_threshold": self.above_threshold,
            "threshold_ms": self.threshold_ms,
            "threshold_exact": self.threshold_exact,
            "reservoir_ms": list(self.reservoir_ms),
            "percentiles_ms": [[q, v] for q, v in self.percentiles_ms],
            "reservoir_units": list(self.reservoir_units),
            "units": self.units.to_dict() if self.units is not None else None,
        })

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VariantTally:
        return cls(
            count=int(data["count"]),
            failures=int(data["failures"]),
            above_threshold=int(data["above_threshold"]),
            threshold_ms=data.get("threshold_ms"),
            threshold_exact=bool(data.get("threshold_exact", True)),
            reservoir_ms=tuple(float(v) for v in data.get("reservoir_ms", ())),
            percentiles_ms=tuple((float(q), v) for q, v in data.get("percentiles_ms", ())),
            reservoir_units=tuple(int(u) for u in data.get("reservoir_units") or ()),
            units=UnitSummary.from_dict(data["units"]) if data.get("units") else None,
        )


@dataclass(frozen=True)
class Tally:
    """Disjoint canary windows (with their baseline twins) added up since `since`."""

    since: float = 0.0
    counted_until: float = 0.0
    first_window_start: float | None = None
    windows: int = 0
    canary: VariantTally = field(default_factory=VariantTally)
    baseline: VariantTally = field(default_factory=VariantTally)
    # the latency of the windows added (the rule's); windows of another one start over
    latency: str = TOTAL

    @classmethod
    def starting(cls, since: float) -> Tally:
        return cls(since=since, counted_until=since)

    def accepts(self, canary: WindowSnapshot) -> bool:
        # a tiny tolerance: two windows cut at the same bucket edge do not overlap
        return canary.window_start >= self.counted_until - 1e-6

    def add(self, canary: WindowSnapshot, baseline: WindowSnapshot | None) -> Tally:
        if canary.latency != self.latency:
            # the rule changed what it judges: the step's evidence so far is of the other
            fresh = Tally(since=self.since, counted_until=self.since, latency=canary.latency)
            return fresh.add(canary, baseline)
        if not self.accepts(canary):
            return self
        return replace(
            self,
            counted_until=canary.window_end,
            first_window_start=(
                canary.window_start if self.first_window_start is None else self.first_window_start
            ),
            windows=self.windows + 1,
            canary=self.canary.add(canary),
            baseline=self.baseline.add(baseline) if baseline is not None else self.baseline,
        )

    def snapshots(self, experiment: str) -> dict[str, WindowSnapshot]:
        start = self.first_window_start if self.first_window_start is not None else self.since
        end = self.counted_until
        latency = self.latency
        merged = {CANARY: self.canary.to_snapshot(experiment, CANARY, start, end, latency)}
        if self.baseline.count:
            merged[BASELINE] = self.baseline.to_snapshot(experiment, BASELINE, start, end, latency)
        return merged

    def to_dict(self) -> dict[str, Any]:
        return self._dict

    @cached_property
    def _dict(self) -> FrozenDict:
        return FrozenDict({
            "since": self.since,
            "counted_until": self.counted_until,
            "first_window_start": self.first_window_start,
            "windows": self.windows,
            "canary": self.canary.to_dict(),
            "baseline": self.baseline.to_dict(),
            **({} if self.latency == TOTAL else {"latency": self.latency}),
        })

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tally:
        return cls(
            since=float(data["since"]),
            counted_until=float(data["counted_until"]),
            first_window_start=data.get("first_window_start"),
            windows=int(data.get("windows", 0)),
            canary=VariantTally.from_dict(data["canary"]),
            baseline=VariantTally.from_dict(data["baseline"]),
            latency=FIRST_BYTE if data.get("latency") == FIRST_BYTE else TOTAL,
        )


@dataclass(frozen=True)
class SrmTally:
    """Assignment counts of disjoint, settled windows at one weight (the one since `since`).

    The sample-ratio check judges these accumulated counts rather than each sliding
    window: overlapping windows re-count the same requests, and a check repeated on
    every look over them false-alarms far more often than its p-value says.
    """

    since: float
    counted_until: float
    baseline: int = 0
    canary: int = 0
    windows: int = 0
    # distinct units per arm (bottom-k hash sketches, controlplane/kernel/units.py),
    # the union over the counted windows; None once a window came without them
    baseline_units: tuple[int, ...] | None = ()
    canary_units: tuple[int, ...] | None = ()

    @classmethod
    def starting(cls, since: float, settled_at: float) -> SrmTally:
        return cls(since=since, counted_until=settled_at)

    def accepts(self, window_start: float) -> bool:
        return window_start >= self.counted_until - 1e-6

    def add(
        self,
        baseline: int,
        canary: int,
        window_end: float,
        units: tuple[UnitSummary | None, UnitSummary | None] = (None, None),
    ) -> SrmTally:
        return replace(
            self,
            counted_until=window_end,
            baseline=self.baseline + baseline,
            canary=self.canary + canary,
            windows=self.windows + 1,
            baseline_units=_union(self.baseline_units, units[0]),
            canary_units=_union(self.canary_units, units[1]),
        )

    @property
    def has_units(self) -> bool:
        """Both arms' windows carried their units, and some were seen.

        An arm that saw none is a count of zero units, not a reason to judge the
        request counts: at a 1% step of sticky traffic the canary's few users may make
        no request for minutes while a heavy baseline user makes hundreds, and the
        request counts then call a mismatch that the assignment of units does not
        have (decision 0056).
        """
        if self.baseline_units is None or self.canary_units is None:
            return False
        return bool(self.baseline_units) or bool(self.canary_units)

    def to_dict(self) -> dict[str, Any]:
        return self._dict

    @cached_property
    def _dict(self) -> FrozenDict:
        return FrozenDict({
            "since": self.since,
            "counted_until": self.counted_until,
            "baseline": self.baseline,
            "canary": self.canary,
            "windows": self.windows,
            "baseline_units": _hex(self.baseline_units),
            "canary_units": _hex(self.canary_units),
        })

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SrmTally:
        return cls(
            since=float(data["since"]),
            counted_until=float(data["counted_until"]),
            baseline=int(data.get("baseline", 0)),
            canary=int(data.get("canary", 0)),
            windows=int(data.get("windows", 0)),
            baseline_units=_unhex(data.get("baseline_units", "")),
            canary_units=_unhex(data.get("canary_units", "")),
        )


def _union(held: tuple[int, ...] | None, new: UnitSummary | None) -> tuple[int, ...] | None:
    if held is None or new is None:
        return None
    fresh = new.distinct.astype(np.int64)
    if not held:
        return tuple(fresh.tolist())
    # sorted and distinct, as sorted(set(held) | set(fresh)); the hashes fit in int64
    both = np.concatenate([np.array(held, dtype=np.int64), fresh])
    both.sort()
    first = np.empty(both.shape[0], dtype=bool)
    first[0] = True
    np.not_equal(both[1:], both[:-1], out=first[1:])
    merged: list[int] = both[first][:DISTINCT_K].tolist()
    return tuple(merged)


_U32 = 2**32


def _hex(sketch: tuple[int, ...] | None) -> str | None:
    # 8 hex digits per 32-bit hash: a sketch of 1,024 units is 8 KB in the state
    if sketch is None:
        return None
    held = np.array(sketch, dtype=np.int64)
    if held.size and not (int(held.min()) >= 0 and int(held.max()) < _U32):
        return "".join(f"{h:08x}" for h in sketch)  # not 32-bit: as wide as it takes
    return held.astype(">u4").tobytes().hex()


def _unhex(text: Any) -> tuple[int, ...] | None:
    if text is None:
        return None
    if not isinstance(text, str) or len(text) % 8 or len(text) > 8 * DISTINCT_K:
        raise ValueError("a unit sketch is up to 1,024 hashes of 8 hex digits")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if 2 * len(raw) == len(text):
        return tuple(np.frombuffer(raw, dtype=">u4").astype(np.int64).tolist())
    # what fromhex refuses or reads otherwise (signs, spaces, underscores): read it
    # hash by hash as always, so such a state is read or refused as before
    return tuple(int(text[i : i + 8], 16) for i in range(0, len(text), 8))
