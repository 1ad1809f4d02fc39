"""Sliding windows of latency samples per (experiment, variant): the collector's engine.

Each variant keeps a ring of 1-second buckets. A bucket holds the count, failures,
the sum of response times, the exact count above the rule's threshold, a log-bucket
histogram (the DDSketch mapping, relative accuracy alpha) and a small bottom-k reservoir.
A running sum over the buckets inside the window is kept with subtract-on-evict, so
a snapshot costs O(bins), not O(window).

Percentiles use the inverted-CDF definition (architecture §8): P_q is the smallest x with
F(x) ≥ q, read from the histogram as the representative value of the bin holding the
ceil(q·n)-th smallest sample, so every reported value is within alpha of the exact one.

"P_q > threshold" holds exactly when more than (1 - q)·n samples are above the
threshold, which is why each bucket also counts those samples exactly.

No I/O and no clock reads outside the injected clock: the service feeds batches in
and publishes what `snapshot()` returns. `WindowTotals` is the mergeable form used
both for the local snapshot and for merging several collectors' partial windows
(see controlplane/collector/sharding.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.kernel.codec import ABORTED, DecodedBatch, RawBatch
from controlplane.kernel.rules import PERCENTILES, BreakerRule
from controlplane.kernel.snapshots import PERCENTILE_FIELDS, WindowSnapshot
from controlplane.kernel.units import (
    DISTINCT_K,
    UNIT_BLOCKS,
    UnitSummary,
    block_of,
    bottom_distinct,
)

MAX_WINDOW_SEC = 3600
DEFAULT_ALPHA = 0.01
DEFAULT_SKEW_SEC = 2.0
RESERVOIR_SIZE = 512
# Per-second sub-reservoirs are merged by their random keys (bottom-k), so the window
# reservoir is a uniform sample whenever no second holds more than this share of it.
SECOND_RESERVOIR_SIZE = 64
_U32_LIMIT = 2**32
# Groups (second x variant) up to which per-group RT sums are masked reductions: a
# weighted bincount costs several ns per sample whatever the number of groups.
_MASKED_SUM_GROUPS = 4
_REMAP_CACHE = 1024
# A filling bucket gives a key to each of its samples up to this many in one ingest;
# above, only to those whose key falls under a bound (see _reservoir_candidates).
_SAMPLED_FILL = 8192

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
U32 = npt.NDArray[np.uint32]
# rows of the unit sums: 0 for samples without a unit, then one per unit block
UNIT_ROWS = UNIT_BLOCKS + 1


class LogMapping:
    """The DDSketch logarithmic mapping over integer microseconds, 0 … 2**32 - 1.

    Value bin i covers (gamma^(i-1), gamma^i] with gamma = (1+alpha')/(1-alpha'), and its
    representative value 2 gamma^i/(gamma+1) is within alpha' of anything in it. The index
    is computed in float32 (three times faster than float64 here); its rounding can move
    a value sitting on a bin edge into the neighbour bin by a few parts per million, so
    the bins are built for alpha' = alpha·(1 - 1e-3), which keeps every reported value
    within alpha.

    Zero is its own bin (array index 0): log(max(x, 0.5)) puts it below every bin a
    positive integer can reach, and the few array slots in between stay empty.
    """

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        if not 0 < alpha < 0.5:
            raise ValueError("relative accuracy must be in (0, 0.5)")
        self.alpha = alpha
        inner = alpha * (1 - 1e-3)
        self.gamma = (1 + inner) / (1 - inner)
        self._scale = np.float32(1.0 / math.log(self.gamma))
        self._floor = np.float32(0.5)
        self.offset = -int(np.ceil(np.log(self._floor) * self._scale))
        top = math.ceil(math.log(_U32_LIMIT) / math.log(self.gamma)) + 1
        self.bins = self.offset + top + 1
        exponents = np.arange(self.bins, dtype=np.float64) - self.offset
        self.representative_us: F64 = 2 * self.gamma**exponents / (self.gamma + 1)
        self.representative_us[: self.offset] = 0.0
        self.representative_ms: F64 = self.representative_us / 1000.0

    def log_ms_sums(self, n: F64, s1: F64, s2: F64) -> tuple[F64, F64]:
        """Σ ln(ms) and Σ ln(ms)² of samples from their bin indices' count, sum and
        sum of squares: each sample stands for its bin's representative value."""
        a = math.log(self.gamma)
        c = -self.offset * a + math.log(2 / (self.gamma + 1)) - math.log(1000.0)
        return a * s1 + c * n, a * a * s2 + 2 * a * c * s1 + c * c * n

    def index(self, rt_us: npt.NDArray[np.integer]) -> I64:
        x = rt_us.astype(np.float32)
        np.maximum(x, self._floor, out=x)
        np.log(x, out=x)
        x *= self._scale
        np.ceil(x, out=x)
        x += np.float32(self.offset)  # small integers: exact in float32
        return x.astype(np.int64)

    def above_mask(self, threshold_ms: float | None) -> npt.NDArray[np.bool_]:
        """Bins the histogram estimate counts as above threshold_ms."""
        if threshold_ms is None:
            return np.zeros(self.bins, dtype=bool)
        return self.representative_ms > threshold_ms


@dataclass(frozen=True)
class WindowConfig:
    """What the windows take from a service's breaker rule."""

    window_sec: int = 60
    threshold_ms: float | None = None
    failure_statuses: frozenset[int] | None = None  # None: 5xx

    @classmethod
    def from_rule(cls, rule: BreakerRule) -> WindowConfig:
        statuses = None if rule.failure_statuses == "5xx" else frozenset(rule.failure_statuses)
        return cls(min(rule.window_sec, MAX_WINDOW_SEC), rule.threshold_ms, statuses)


def failure_table(statuses: frozenset[int] | None) -> npt.NDArray[np.bool_]:
    """`is_failure_outcome` for every u16 outcome, so a batch is classified by one gather."""
    table = np.zeros(65536, dtype=bool)
    table[:100] = True
    table[ABORTED] = False
    if statuses is None:
        table[500:] = True
    else:
        table[sorted(s for s in statuses if 100 <= s < 65536)] = True
    return table


def inverted_cdf_rank(percentile: float, n: int) -> int:
    """1-based rank of P_q over n samples: ceil(q·n), in integers to dodge float error."""
    tenths = round(percentile * 10)
    return max(1, -(-tenths * n // 1000))


@dataclass
class WindowTotals:
    """A window's mergeable sums: add two and you have the window over both inputs."""

    bins: int
    count: int = 0
    failures: int = 0
    sum_us: float = 0.0
    above_exact: int = 0
    # histogram of buckets whose above-count was taken under another threshold
    stale_hist: I64 | None = None
    hist: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    newest_ts: float | None = None
    res_keys: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    res_us: npt.NDArray[np.uint32] = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))
    res_units: U32 = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))
    # per unit row: count, failures, above (exact) and Σ bin index, Σ bin index²
    unit_counts: I64 = field(default_factory=lambda: np.zeros((UNIT_ROWS, 3), dtype=np.int64))
    unit_sums: F64 = field(default_factory=lambda: np.zeros((UNIT_ROWS, 2), dtype=np.float64))
    distinct: U32 = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))

    def __post_init__(self) -> None:
        if self.hist.shape[0] == 0:
            self.hist = np.zeros(self.bins, dtype=np.int64)
        if self.res_units.shape[0] != self.res_us.shape[0]:
            self.res_units = np.zeros(self.res_us.shape[0], dtype=np.uint32)

    def add(self, other: WindowTotals) -> None:
        self.count += other.count
        self.failures += other.failures
        self.sum_us += other.sum_us
        self.above_exact += other.above_exact
        self.hist += other.hist
        if other.stale_hist is not None:
            if self.stale_hist is None:
                self.stale_hist = other.stale_hist.copy()
            else:
                self.stale_hist += other.stale_hist
        if other.newest_ts is not None:
            self.newest_ts = (
                other.newest_ts if self.newest_ts is None else max(self.newest_ts, other.newest_ts)
            )
        self.unit_counts += other.unit_counts
        self.unit_sums += other.unit_sums
        self.distinct = bottom_distinct([self.distinct, other.distinct])
        keys = np.concatenate([self.res_keys, other.res_keys])
        values = np.concatenate([self.res_us, other.res_us])
        units = np.concatenate([self.res_units, other.res_units])
        keep = bottom_k_index(keys, RESERVOIR_SIZE)
        self.res_keys, self.res_us, self.res_units = keys[keep], values[keep], units[keep]

    def unit_summary(self, mapping: LogMapping) -> UnitSummary:
        n = self.unit_counts[:, 0].astype(np.float64)
        log_sum, log_sq = mapping.log_ms_sums(n, self.unit_sums[:, 0], self.unit_sums[:, 1])
        rows = np.column_stack([self.unit_counts.astype(np.float64), log_sum, log_sq])
        return UnitSummary.from_arrays(rows, self.distinct)

    def snapshot(
        self,
        mapping: LogMapping,
        *,
        experiment: str,
        variant: str,
        window_sec: int,
        now: float,
        window_start: float,
        threshold_ms: float | None,
    ) -> WindowSnapshot:
        percentiles: dict[str, float | None] = dict.fromkeys(PERCENTILE_FIELDS.values())
        mean_ms: float | None = None
        if self.count:
            cumulative = np.cumsum(self.hist)
            ranks = [inverted_cdf_rank(q, self.count) for q in PERCENTILES]
            where = np.searchsorted(cumulative, ranks, side="left")
            where = np.minimum(where, mapping.bins - 1)
            for q, index in zip(PERCENTILES, where, strict=True):
                percentiles[PERCENTILE_FIELDS[q]] = float(mapping.representative_ms[index])
            mean_ms = self.sum_us / self.count / 1000.0
        above = self.above_exact
        exact = self.stale_hist is None or not self.stale_hist.any()
        if not exact and self.stale_hist is not None:
            above += int(self.stale_hist[mapping.above_mask(threshold_ms)].sum())
        lag = None if self.newest_ts is None else max(0.0, (now - self.newest_ts) * 1000.0)
        return WindowSnapshot(
            experiment=experiment,
            variant=variant,
            count=self.count,
            failures=self.failures,
            window_sec=window_sec,
            ts=now,
            window_start=window_start,
            window_end=now,
            mean_ms=mean_ms,
            threshold_ms=threshold_ms,
            above_threshold=above,
            threshold_exact=exact,
            sample_lag_ms=lag,
            reservoir_ms=tuple(float(v) / 1000.0 for v in self.res_us),
            reservoir_units=tuple(int(u) for u in self.res_units),
            units=self.unit_summary(mapping),
            **percentiles,
        )


def bottom_k_index(keys: npt.NDArray[np.float32], k: int) -> I64:
    """Positions of the k smallest keys (all of them when there are no more than k)."""
    if keys.shape[0] <= k:
        return np.arange(keys.shape[0], dtype=np.int64)
    return np.argpartition(keys, k - 1)[:k].astype(np.int64)


def bottom_k(
    keys: npt.NDArray[np.float32], values: npt.NDArray[np.uint32], k: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint32]]:
    """The k items with the smallest random keys: a uniform sample of the union."""
    if keys.shape[0] <= k:
        return keys, values
    keep = np.argpartition(keys, k - 1)[:k]
    return keys[keep], values[keep]


def _concat(parts: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _timestamps(batch: DecodedBatch | RawBatch) -> F64:
    if isinstance(batch, RawBatch):
        return batch.t0 + batch.dt_us.astype(np.float64) / 1e6
    return batch.ts


class _VariantRing:
    """One variant's 1-second buckets and the running sum over those in the window."""

    # per slot (one second each), allocated together by _allocate
    second: I64
    count: I64
    failures: I64
    sum_us: F64
    above: I64
    stale: npt.NDArray[np.bool_]
    dirty: npt.NDArray[np.bool_]
    hist: npt.NDArray[np.int32]
    res_keys: npt.NDArray[np.float32]
    res_us: npt.NDArray[np.uint32]
    res_fill: I64
    res_tau: npt.NDArray[np.float32]
    res_unit: U32
    unit_counts: npt.NDArray[np.int32]
    unit_sums: F64

    def __init__(self, bins: int, capacity: int) -> None:
        self.bins = bins
        self.capacity = 0
        self.distinct: list[U32] = []
        self._allocate(capacity)
        self.win_hist = np.zeros(bins, dtype=np.int64)
        self.win_unit_counts = np.zeros((UNIT_ROWS, 3), dtype=np.int64)
        self.win_unit_sums = np.zeros((UNIT_ROWS, 2), dtype=np.float64)
        self.win_count = 0
        self.win_failures = 0
        self.win_sum_us = 0.0
        self.win_above = 0  # over in-window buckets whose threshold is the current one
        self.newest_ts: float | None = None

    def _allocate(self, capacity: int) -> None:
        old = self.__dict__.get("second")
        fresh: dict[str, npt.NDArray[Any]] = {
            "second": np.full(capacity, -1, dtype=np.int64),
            "count": np.zeros(capacity, dtype=np.int64),
            "failures": np.zeros(capacity, dtype=np.int64),
            "sum_us": np.zeros(capacity, dtype=np.float64),
            "above": np.zeros(capacity, dtype=np.int64),
            "stale": np.zeros(capacity, dtype=bool),
            "dirty": np.ones(capacity, dtype=bool),
            # int32 per second halves the ring; the running sum is int64
            "hist": np.zeros((capacity, self.bins), dtype=np.int32),
            "res_keys": np.zeros((capacity, SECOND_RESERVOIR_SIZE), dtype=np.float32),
            "res_us": np.zeros((capacity, SECOND_RESERVOIR_SIZE), dtype=np.uint32),
            "res_fill": np.zeros(capacity, dtype=np.int64),
            "res_tau": np.full(capacity, 2.0, dtype=np.float32),
            "res_unit": np.zeros((capacity, SECOND_RESERVOIR_SIZE), dtype=np.uint32),
            "unit_counts": np.zeros((capacity, UNIT_ROWS, 3), dtype=np.int32),
            "unit_sums": np.zeros((capacity, UNIT_ROWS, 2), dtype=np.float64),
        }
        distinct = [np.zeros(0, dtype=np.uint32)] * capacity
        if old is not None:
            for slot in np.flatnonzero(old >= 0):
                new_slot = int(old[slot]) % capacity
                for name, array in fresh.items():
                    array[new_slot] = getattr(self, name)[slot]
                distinct[new_slot] = self.distinct[slot]
        self.distinct = distinct
        for name, array in fresh.items():
            setattr(self, name, array)
        self.capacity = capacity
        self.encoded: dict[int, str] = {}
        self.encoded_units: dict[int, str] = {}

    def grow(self, capacity: int) -> None:
        if capacity > self.capacity:
            self._allocate(capacity)

    def slot_for(self, second: int) -> int:
        slot = second % self.capacity
        if self.second[slot] != second:
            # the slot's previous second left the window (capacity > window + skew)
            self.second[slot] = second
            self.count[slot] = self.failures[slot] = self.above[slot] = 0
            self.sum_us[slot] = 0.0
            self.stale[slot] = False
            self.hist[slot] = 0
            self.res_fill[slot] = 0
            self.res_tau[slot] = 2.0
            self.unit_counts[slot] = 0
            self.unit_sums[slot] = 0.0
            self.distinct[slot] = np.zeros(0, dtype=np.uint32)
        self.dirty[slot] = True
        return slot

    def add_to_window(self, slot: int, sign: int) -> None:
        self.win_count += sign * int(self.count[slot])
        self.win_failures += sign * int(self.failures[slot])
        self.win_sum_us += sign * float(self.sum_us[slot])
        if not self.stale[slot]:
            self.win_above += sign * int(self.above[slot])
        if sign > 0:
            self.win_hist += self.hist[slot]
            self.win_unit_counts += self.unit_counts[slot]
            self.win_unit_sums += self.unit_sums[slot]
        else:
            self.win_hist -= self.hist[slot]
            self.win_unit_counts -= self.unit_counts[slot]
            self.win_unit_sums -= self.unit_sums[slot]

    def slots_between(self, first: int, last: int) -> list[int]:
        """Slots holding seconds in [first, last]."""
        if last < first:
            return []
        if last - first + 1 >= self.capacity:
            held = self.second
            return [int(s) for s in np.flatnonzero((held >= first) & (held <= last))]
        slots = []
        for second in range(first, last + 1):
            slot = second % self.capacity
            if self.second[slot] == second:
                slots.append(slot)
        return slots

    def offer(
        self,
        slot: int,
        keys: npt.NDArray[np.float32],
        values: npt.NDArray[np.uint32],
        units: U32,
    ) -> None:
        fill = int(self.res_fill[slot])
        all_keys = np.concatenate([self.res_keys[slot, :fill], keys])
        all_values = np.concatenate([self.res_us[slot, :fill], values])
        all_units = np.concatenate([self.res_unit[slot, :fill], units])
        keep = bottom_k_index(all_keys, SECOND_RESERVOIR_SIZE)
        kept_keys = all_keys[keep]
        fill = kept_keys.shape[0]
        self.res_keys[slot, :fill] = kept_keys
        self.res_us[slot, :fill] = all_values[keep]
        self.res_unit[slot, :fill] = all_units[keep]
        self.res_fill[slot] = fill
        self.res_tau[slot] = kept_keys.max() if fill >= SECOND_RESERVOIR_SIZE else 2.0

    def offer_units(self, slot: int, units: U32) -> None:
        """Add a second's unit hashes to its distinct sketch (bottom DISTINCT_K)."""
        held = self.distinct[slot]
        if held.shape[0] >= DISTINCT_K:
            units = units[units < held[-1]]
            if not units.shape[0]:
                return
        self.distinct[slot] = bottom_distinct([held, units])

    def window_distinct(self, live: I64) -> U32:
        return bottom_distinct([self.distinct[int(s)] for s in live])

    def nbytes(self) -> int:
        arrays = [
            self.second, self.count, self.failures, self.sum_us, self.above, self.stale,
            self.dirty, self.hist, self.res_keys, self.res_us, self.res_fill, self.res_tau,
            self.win_hist, self.res_unit, self.unit_counts, self.unit_sums,
        ]  # fmt: skip
        return sum(a.nbytes for a in arrays) + sum(d.nbytes for d in self.distinct)


@dataclass
class IngestCounters:
    ingested: int = 0
    late: int = 0
    clamped: int = 0


class ExperimentWindow:
    """All variants of one experiment: `record(batch)` in, `snapshot()` out."""

    def __init__(
        self,
        experiment: str,
        config: WindowConfig,
        *,
        clock_now: float,
        mapping: LogMapping | None = None,
        skew_sec: float = DEFAULT_SKEW_SEC,
        seed: int | None = None,
    ) -> None:
        self.experiment = experiment
        self.mapping = mapping or LogMapping()
        self.skew_sec = skew_sec
        self.config = config
        self.counters = IngestCounters()
        self._rng = np.random.default_rng(seed)
        self._variants: dict[str, int] = {}
        self._remaps: dict[tuple[str, ...], I64] = {}
        self._rings: list[_VariantRing] = []
        self._failure_table = failure_table(config.failure_statuses)
        self._threshold_us = self._threshold_in_us(config.threshold_ms)
        self._longest = config.window_sec
        self._bin_index = np.arange(self.mapping.bins, dtype=np.float64)
        self._tail = math.floor(clock_now) - config.window_sec + 1
        self.changed = False  # set by anything that changes a snapshot; the publisher clears it

    # --- configuration ------------------------------------------------------

    @staticmethod
    def _threshold_in_us(threshold_ms: float | None) -> float:
        return math.inf if threshold_ms is None else threshold_ms * 1000.0

    def _capacity(self) -> int:
        return self._longest + math.ceil(self.skew_sec) + 2

    @property
    def retained_sec(self) -> int:
        """Seconds a ring holds: the longest window configured so far, plus the skew.

        Bounds every window this experiment was configured with here, and so every
        partial this collector publishes for it (see sharding.expired_partials).
        """
        return self._capacity()

    def reconfigure(self, config: WindowConfig, now: float) -> None:
        """Apply a rule change live: window length, threshold, failure statuses."""
        if config == self.config:
            return
        self.advance(now)
        old = self.config
        self.config = config
        self.changed = True
        if config.failure_statuses != old.failure_statuses:
            # recorded failures cannot be re-classified; new samples use the new set
            self._failure_table = failure_table(config.failure_statuses)
        if config.threshold_ms != old.threshold_ms:
            self._threshold_us = self._threshold_in_us(config.threshold_ms)
            for ring in self._rings:
                # every bucket so far counted "above" under the old threshold: exclude
                # them from the exact sum; the histogram stands in until they leave
                ring.stale[ring.second >= 0] = True
                ring.win_above = 0
        if config.window_sec != old.window_sec:
            self._longest = max(self._longest, config.window_sec)
            now_sec = math.floor(now)
            new_tail = now_sec - config.window_sec + 1
            for ring in self._rings:
                ring.grow(self._capacity())
                if new_tail > self._tail:
                    for slot in ring.slots_between(self._tail, new_tail - 1):
                        ring.add_to_window(slot, -1)
                else:
                    for slot in ring.slots_between(new_tail, self._tail - 1):
                        ring.add_to_window(slot, +1)
            self._tail = new_tail

    def advance(self, now: float) -> None:
        """Evict the seconds that left the window (subtract-on-evict)."""
        new_tail = math.floor(now) - self.config.window_sec + 1
        if new_tail <= self._tail:
            return
        for ring in self._rings:
            evicted = ring.slots_between(self._tail, new_tail - 1)
            for slot in evicted:
                ring.add_to_window(slot, -1)
            if evicted:
                self.changed = True
        self._tail = new_tail

    @property
    def window_start(self) -> int:
        return self._tail

    def _variant_index(self, name: str) -> int:
        index = self._variants.get(name)
        if index is None:
            index = self._variants[name] = len(self._rings)
            self._rings.append(_VariantRing(self.mapping.bins, self._capacity()))
        return index

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self._variants)

    # --- ingestion ----------------------------------------------------------

    def record(self, batch: DecodedBatch | RawBatch, now: float) -> None:
        self.record_many([batch], now)

    def _remap(self, names: tuple[str, ...]) -> I64:
        """A batch's variant indices → ring indices, cached per variant table."""
        remap = self._remaps.get(names)
        if remap is None:
            if len(self._remaps) >= _REMAP_CACHE:
                self._remaps.clear()
            remap = np.array([self._variant_index(v) for v in names], dtype=np.int64)
            self._remaps[names] = remap
        return remap

    def record_many(self, batches: Sequence[DecodedBatch | RawBatch], now: float) -> None:
        """Ingest several batches at once, vectorised over all their samples.

        Batches are decoded ones or raw views (`RawBatch`, as the collector reads them);
        their columns are concatenated once and ingested in one pass.
        """
        batches = [b for b in batches if b.rt_us.shape[0]]
        if not batches:
            self.advance(now)
            return
        names = batches[0].variants
        variant: npt.NDArray[np.integer[Any]]
        if all(b.variants == names for b in batches):
            variant = _concat([b.variant for b in batches])
            if names != self.variants[: len(names)]:  # else the indices are ring indices
                variant = self._remap(names)[variant]
        else:
            variant = _concat([self._remap(b.variants)[b.variant] for b in batches])
        if all(isinstance(b, RawBatch) for b in batches):
            raw = [b for b in batches if isinstance(b, RawBatch)]
            t0 = np.array([b.t0 for b in raw], dtype=np.float64)
            dt = _concat([b.dt_us for b in raw]).astype(np.float64)
            dt /= 1e6
            if len(raw) == 1:
                dt += t0[0]
            else:
                dt += np.repeat(t0, [b.rt_us.shape[0] for b in raw])
            ts = dt
        else:
            ts = _concat([_timestamps(b) for b in batches])
        rt_us = _concat([b.rt_us for b in batches])
        outcome = _concat([b.outcome for b in batches])
        unit = _concat([b.unit for b in batches])
        self.ingest(variant, ts, rt_us, outcome, now, unit)

    def ingest(
        self,
        variant: npt.NDArray[np.integer[Any]],
        ts: F64,
        rt_us: npt.NDArray[np.uint32],
        outcome: npt.NDArray[np.uint16],
        now: float,
        unit: U32 | None = None,
    ) -> None:
        """The vectorised core: columns of equal length, variant as ring indices.

        `unit`: each sample's unit hash (0 or None: no unit).
        """
        self.advance(now)
        n = int(ts.shape[0])
        if n == 0:
            return
        if unit is None:
            unit = np.zeros(n, dtype=np.uint32)
        lo, hi = float(ts.min()), float(ts.max())
        limit = now + self.skew_sec
        if hi > limit:
            ahead = ts > limit
            self.counters.clamped += int(np.count_nonzero(ahead))
            ts = np.where(ahead, now, ts)
            lo, hi = float(ts.min()), float(ts.max())
        if math.floor(lo) < self._tail:
            keep = np.floor(ts) >= self._tail
            m = int(np.count_nonzero(keep))
            self.counters.late += n - m
            if m == 0:
                return
            variant, ts, rt_us, outcome = variant[keep], ts[keep], rt_us[keep], outcome[keep]
            unit = unit[keep]
            lo, hi = float(ts.min()), float(ts.max())
        else:
            m = n
        self.counters.ingested += m
        self.changed = True
        n_variants = len(self._rings)
        first = math.floor(lo)
        span = math.floor(hi) - first + 1
        groups = span * n_variants
        bins = self.mapping.bins
        index = self.mapping.index(rt_us)
        group: I64 | None = None  # None: every sample is in group 0
        if span > 1:
            if span == 2:  # a read across one second boundary: one comparison
                group = (ts >= first + 1).astype(np.int64)
            elif first >= 0:  # ts - first is exact (a multiple of ts's ulp), >= 0
                group = (ts - first).astype(np.int64)
            else:
                group = np.floor(ts).astype(np.int64)
                group -= first
            if n_variants > 1:
                group *= n_variants
                group += variant
        elif n_variants > 1:
            group = variant.astype(np.int64, copy=False)
        flat = index if group is None else index + group * bins
        hist = np.bincount(flat, minlength=groups * bins).reshape(groups, bins)
        counts = hist.sum(axis=1)
        if self.config.failure_statuses is None:
            # the default (5xx, connect errors, timeouts) in three cheap comparisons
            failed = (outcome >= 500) | ((outcome < 100) & (outcome != ABORTED))
        else:
            failed = self._failure_table[outcome]
        active = [int(g) for g in np.flatnonzero(counts)]
        failures = self._per_group(group, failed, groups)
        above_mask = self._above(rt_us)
        aboves = self._per_group(group, above_mask, groups)
        sums = self._sums(group, rt_us, groups, active)
        if unit.any():
            unit_counts, unit_sums = self._unit_rows(group, unit, index, failed, above_mask, groups)
        else:
            unit_counts, unit_sums = self._unitless_rows(hist, counts, failures, aboves)

        slots: dict[int, int] = {}
        taus = np.full(groups, 2.0, dtype=np.float32)
        k = SECOND_RESERVOIR_SIZE
        for g in active:
            ring = self._rings[g % n_variants]
            slot = ring.slot_for(first + g // n_variants)
            slots[g] = slot
            fill = int(ring.res_fill[slot])
            if fill >= k:
                taus[g] = ring.res_tau[slot]
            elif int(counts[g]) > _SAMPLED_FILL:
                # filling, with many samples: about 4k of their keys fall below this
                taus[g] = 4 * k / int(counts[g])
        cand_pos, cand_keys = self._reservoir_candidates(group, taus, active, m)
        cand_group = group[cand_pos] if group is not None else np.zeros_like(cand_pos)

        for g in active:
            ring = self._rings[g % n_variants]
            slot = slots[g]
            ring.count[slot] += counts[g]
            ring.failures[slot] += failures[g]
            ring.sum_us[slot] += sums[g]
            ring.above[slot] += aboves[g]
            ring.hist[slot] += hist[g].astype(np.int32)
            ring.win_count += int(counts[g])
            ring.win_failures += int(failures[g])
            ring.win_sum_us += float(sums[g])
            if not ring.stale[slot]:
                ring.win_above += int(aboves[g])
            ring.win_hist += hist[g]
            ring.unit_counts[slot] += unit_counts[g]
            ring.unit_sums[slot] += unit_sums[g]
            ring.win_unit_counts += unit_counts[g]
            ring.win_unit_sums += unit_sums[g]
            mine = cand_group == g
            keys, pos = cand_keys[mine], cand_pos[mine]
            fill = int(ring.res_fill[slot])
            if fill < k and taus[g] < 1.0:
                # a filling bucket offered only keys below taus[g]: that is its bottom-k
                # only if at least k of its keys (old and new) are below taus[g]
                below = int(np.count_nonzero(ring.res_keys[slot, :fill] < taus[g]))
                if below + keys.shape[0] < k:
                    pos = np.arange(m) if group is None else np.flatnonzero(group == g)
                    keys = self._rng.random(pos.shape[0], dtype=np.float32)
            if keys.shape[0]:
                ring.offer(slot, keys, rt_us[pos].astype(np.uint32), unit[pos])
        self._offer_distinct(group, unit, active, slots)
        # the batch's newest sample stands for every variant in it: lag is a health
        # figure, and a per-variant max would cost a pass over the batch per variant
        for g in active:
            ring = self._rings[g % n_variants]
            if ring.newest_ts is None or hi > ring.newest_ts:
                ring.newest_ts = hi

    def _unit_rows(
        self,
        group: I64 | None,
        unit: U32,
        index: I64,
        failed: npt.NDArray[np.bool_],
        above: npt.NDArray[np.bool_] | None,
        groups: int,
    ) -> tuple[I64, F64]:
        """Per group and unit row: count, failures, above; Σ bin index, Σ bin index²."""
        key = block_of(unit)
        if group is not None:
            key += group * UNIT_ROWS
        size = groups * UNIT_ROWS
        counts = np.zeros((size, 3), dtype=np.int64)
        counts[:, 0] = np.bincount(key, minlength=size)
        counts[:, 1] = np.bincount(key[failed], minlength=size)
        if above is not None:
            counts[:, 2] = np.bincount(key[above], minlength=size)
        weights = index.astype(np.float64)
        sums = np.empty((size, 2), dtype=np.float64)
        sums[:, 0] = np.bincount(key, weights=weights, minlength=size)
        weights *= weights
        sums[:, 1] = np.bincount(key, weights=weights, minlength=size)
        return counts.reshape(groups, UNIT_ROWS, 3), sums.reshape(groups, UNIT_ROWS, 2)

    def _unitless_rows(self, hist: I64, counts: I64, failures: I64, aboves: I64) -> tuple[I64, F64]:
        """`_unit_rows` when no sample has a unit: all in row 0, the index sums read
        off the histogram (O(groups x bins), no pass over the samples)."""
        groups = hist.shape[0]
        unit_counts = np.zeros((groups, UNIT_ROWS, 3), dtype=np.int64)
        unit_counts[:, 0, 0] = counts
        unit_counts[:, 0, 1] = failures
        unit_counts[:, 0, 2] = aboves
        unit_sums = np.zeros((groups, UNIT_ROWS, 2), dtype=np.float64)
        weights = self._bin_index
        unit_sums[:, 0, 0] = hist @ weights
        unit_sums[:, 0, 1] = hist @ (weights * weights)
        return unit_counts, unit_sums

    def _offer_distinct(
        self, group: I64 | None, unit: U32, active: list[int], slots: dict[int, int]
    ) -> None:
        """Each active second's new unit hashes into its distinct sketch.

        Once a second's sketch is full only hashes below its largest can enter, so a
        comparison pass filters a batch first. What is left is sorted once, keyed by
        (group, hash), and each group takes its smallest distinct hashes from its run.
        """
        n_variants = len(self._rings)
        limits = np.zeros(max(active) + 1, dtype=np.int64)
        for g in active:
            held = self._rings[g % n_variants].distinct[slots[g]]
            limits[g] = int(held[-1]) if held.shape[0] >= DISTINCT_K else _U32_LIMIT
        if group is None:
            chosen = np.flatnonzero((unit != 0) & (unit < limits[0]))
            keys = unit[chosen].astype(np.uint64)
        else:
            chosen = np.flatnonzero((unit != 0) & (unit < limits[group]))
            keys = group[chosen].astype(np.uint64) << np.uint64(32)
            keys |= unit[chosen]
        if not chosen.shape[0]:
            return
        keys.sort()
        fresh = np.empty(keys.shape[0], dtype=bool)
        fresh[0] = True
        np.not_equal(keys[1:], keys[:-1], out=fresh[1:])
        keys = keys[fresh]
        edges = np.searchsorted(
            keys, np.arange(limits.shape[0] + 1, dtype=np.uint64) << np.uint64(32)
        )
        for g in active:
            lo, hi = int(edges[g]), int(edges[g + 1])
            if hi > lo:
                mine = (keys[lo : min(hi, lo + DISTINCT_K)] & np.uint64(_U32_LIMIT - 1)).astype(
                    np.uint32
                )
                self._rings[g % n_variants].offer_units(slots[g], mine)

    def _above(self, rt_us: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_] | None:
        """Samples above the threshold (None: none can be), in integer comparisons."""
        threshold = self._threshold_us
        if threshold >= _U32_LIMIT - 1:
            return None
        if threshold < 0:
            return np.ones(rt_us.shape[0], dtype=bool)
        # integer rt > t  ⟺  rt > floor(t)
        return rt_us > np.uint32(math.floor(threshold))

    @staticmethod
    def _per_group(group: I64 | None, mask: npt.NDArray[np.bool_] | None, groups: int) -> I64:
        """How many samples of each group the mask selects."""
        if mask is None:
            return np.zeros(groups, dtype=np.int64)
        if group is None:
            out = np.zeros(groups, dtype=np.int64)
            out[0] = np.count_nonzero(mask)
            return out
        return np.bincount(group[mask], minlength=groups)

    @staticmethod
    def _sums(
        group: I64 | None, rt_us: npt.NDArray[np.uint32], groups: int, active: list[int]
    ) -> npt.NDArray[np.float64]:
        """Exact RT sum per group (integers summed in u64, then as float64)."""
        out = np.zeros(groups, dtype=np.float64)
        if group is None:
            out[0] = float(rt_us.sum(dtype=np.uint64))
        elif len(active) <= _MASKED_SUM_GROUPS:
            total = int(rt_us.sum(dtype=np.uint64))
            for g in active[1:]:
                part = int((rt_us * (group == g)).sum(dtype=np.uint64))
                out[g] = float(part)
                total -= part
            out[active[0]] = float(total)
        else:
            out[:] = np.bincount(group, weights=rt_us, minlength=groups)
        return out

    def _reservoir_candidates(
        self, group: I64 | None, taus: npt.NDArray[np.float32], active: list[int], m: int
    ) -> tuple[I64, npt.NDArray[np.float32]]:
        """Positions whose random key falls under their group's tau, and the keys.

        Bottom-k sampling gives every sample a uniform key and keeps the k smallest.
        Only keys below a group's tau matter: its reservoir's k-th key once full, or
        (filling, with many samples) a bound the k-th smallest key is almost surely
        under (the caller checks, and draws every key when it is not). tau ≥ 1 means
        every sample gets a key. Instead of drawing a key per sample, draw how many
        fall below the largest tau (binomial), where (uniform positions) and their
        keys (uniform below it), then keep those under their own group's tau: the
        same distribution for a fraction of the cost. Positions drawn twice are kept
        once. `group` None: every sample is in group 0.
        """
        parts_pos: list[I64] = []
        parts_keys: list[npt.NDArray[np.float32]] = []
        sampled = [float(taus[g]) for g in active if taus[g] < 1.0]
        if len(sampled) < len(active):  # some groups give every sample a key: one pass
            if group is None:
                pos = np.arange(m, dtype=np.int64)
            else:
                pos = np.flatnonzero(taus[group] >= 1.0)
            parts_pos.append(pos)
            parts_keys.append(self._rng.random(pos.shape[0], dtype=np.float32))
        if sampled:
            tau = max(sampled)
            hits = int(self._rng.binomial(m, tau))
            if hits:
                drawn = np.zeros(m, dtype=bool)
                drawn[self._rng.integers(0, m, hits)] = True
                pos = np.flatnonzero(drawn)
                limit = taus[np.zeros_like(pos) if group is None else group[pos]]
                keys = self._rng.random(pos.shape[0], dtype=np.float32) * np.float32(tau)
                keep = (keys < limit) & (limit < 1.0)
                parts_pos.append(pos[keep])
                parts_keys.append(keys[keep])
        if not parts_pos:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        if len(parts_pos) == 1:
            return parts_pos[0], parts_keys[0]
        return np.concatenate(parts_pos), np.concatenate(parts_keys)

    # --- output -------------------------------------------------------------

    def totals(self, variant: str, now: float) -> WindowTotals:
        """The window's sums for one variant, O(bins) (+ stale buckets in a transition)."""
        self.advance(now)
        ring = self._rings[self._variants[variant]]
        in_window = ring.second >= self._tail
        totals = WindowTotals(
            bins=self.mapping.bins,
            count=ring.win_count,
            failures=ring.win_failures,
            sum_us=ring.win_sum_us,
            above_exact=ring.win_above,
            hist=ring.win_hist.copy(),
            newest_ts=ring.newest_ts,
            unit_counts=ring.win_unit_counts.copy(),
            unit_sums=ring.win_unit_sums.copy(),
        )
        stale = np.flatnonzero(in_window & ring.stale)
        if stale.shape[0]:
            totals.stale_hist = ring.hist[stale].sum(axis=0, dtype=np.int64)
        live = np.flatnonzero(in_window)
        if live.shape[0]:
            fills = ring.res_fill[live]
            mask = np.arange(SECOND_RESERVOIR_SIZE)[None, :] < fills[:, None]
            keys = ring.res_keys[live][mask]
            keep = bottom_k_index(keys, RESERVOIR_SIZE)
            totals.res_keys = keys[keep]
            totals.res_us = ring.res_us[live][mask][keep]
            totals.res_units = ring.res_unit[live][mask][keep]
            totals.distinct = ring.window_distinct(live)
        return totals

    def snapshot(self, now: float) -> dict[str, WindowSnapshot]:
        """Every variant's window at `now`."""
        return {
            name: self.totals(name, now).snapshot(
                self.mapping,
                experiment=self.experiment,
                variant=name,
                window_sec=self.config.window_sec,
                now=now,
                window_start=float(self._tail),
                threshold_ms=self.config.threshold_ms,
            )
            for name in self._variants
        }

    def ring(self, variant: str) -> _VariantRing:
        return self._rings[self._variants[variant]]

    def nbytes(self) -> int:
        return sum(ring.nbytes() for ring in self._rings)
