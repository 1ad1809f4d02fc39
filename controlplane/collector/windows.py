"""Sliding windows of latency samples per experiment: the collector's engine.

An `ExperimentWindow` holds one ring of 1-second buckets per variant (ring.py) and
decides which seconds are in the window. Each variant has two rings, one per latency:
the total time of every sample, and the time to the first response byte of the
samples that carry one (batches from sidecars older than batch version 2 do not: they
count in the total ring only, and a first-byte window is the window over the samples
that have one). Both rings see the same seconds, threshold and failure statuses.
Batches go in through `record_many`, and `totals`/`snapshot` (totals.py) come out.
Ingestion is vectorised over a whole read: the samples are admitted (clamped, late
ones dropped), grouped by (second, variant), reduced per group (grouping.py), and each
group's sums are added to its bucket and to the running window sum.

No I/O and no clock reads outside the injected clock: the service feeds batches in
and publishes what `snapshot()` returns. The modules split out of this one are
re-exported here, so `controlplane.collector.windows` stays the engine's one import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.collector.grouping import (
    Groups,
    LatencySums,
    group_samples,
    reduce_latency,
)
from controlplane.collector.log_mapping import (
    DEFAULT_ALPHA,
    F64,
    I64,
    U32,
    U32_LIMIT,
    LogMapping,
)
from controlplane.collector.ring import SECOND_RESERVOIR_SIZE, VariantRing
from controlplane.collector.totals import (
    RESERVOIR_SIZE,
    UNIT_ROWS,
    WindowTotals,
    bottom_k,
    bottom_k_index,
    inverted_cdf_rank,
    with_first_byte,
)
from controlplane.kernel.codec import (
    ABORTED,
    GRPC_MAX_CODE,
    GRPC_OK,
    GRPC_STATUS,
    SHED,
    VERSION_SHED,
    DecodedBatch,
    RawBatch,
)
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.units import DISTINCT_K
from controlplane.kernel.window_rules import WindowRule

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_SKEW_SEC",
    "MAX_WINDOW_SEC",
    "RESERVOIR_SIZE",
    "SECOND_RESERVOIR_SIZE",
    "UNIT_ROWS",
    "ExperimentWindow",
    "IngestCounters",
    "LogMapping",
    "VariantRing",
    "WindowConfig",
    "WindowTotals",
    "bottom_k",
    "bottom_k_index",
    "failure_table",
    "inverted_cdf_rank",
    "with_first_byte",
]

MAX_WINDOW_SEC = 3600
DEFAULT_SKEW_SEC = 2.0
_REMAP_CACHE = 1024
# A filling bucket gives a key to each of its samples up to this many in one ingest;
# above, only to those whose key falls under a bound (see _reservoir_candidates).
_SAMPLED_FILL = 8192
# A variant's groups in a read up to which each is added to its bucket in scalars and
# rows: a sidecar's batch spans a second or two, where a dozen array ops per variant
# cost more than the samples.
_SCALAR_GROUPS = 4


@dataclass(frozen=True)
class WindowConfig:
    """What the windows take from a service's breaker rule."""

    window_sec: int = 60
    threshold_ms: float | None = None
    failure_statuses: frozenset[int] | None = None  # None: 5xx
    grpc_failure_codes: frozenset[int] | None = None  # None: every code but 0 (OK)

    @classmethod
    def from_rule(cls, rule: BreakerRule | WindowRule) -> WindowConfig:
        """From a service's rule, or an experiment's window rule (its own rule's)."""
        statuses = None if rule.failure_statuses == "5xx" else frozenset(rule.failure_statuses)
        codes = rule.grpc_failure_codes
        grpc = None if codes == "nonzero" else frozenset(codes)
        return cls(min(rule.window_sec, MAX_WINDOW_SEC), rule.threshold_ms, statuses, grpc)

    @property
    def default_failures(self) -> bool:
        """5xx and every non-OK gRPC code: classified without the table."""
        return self.failure_statuses is None and self.grpc_failure_codes is None


def failure_table(
    statuses: frozenset[int] | None, grpc_codes: frozenset[int] | None = None
) -> npt.NDArray[np.bool_]:
    """`is_failure_outcome` for every u16 outcome, so a batch is classified by one gather."""
    table = np.zeros(65536, dtype=bool)
    table[:100] = True
    table[ABORTED] = False
    if statuses is None:
        table[500:GRPC_STATUS] = True
    else:
        table[sorted(s for s in statuses if 100 <= s < GRPC_STATUS)] = True
    grpc = table[GRPC_STATUS : GRPC_STATUS + GRPC_MAX_CODE + 1]
    if grpc_codes is None:
        grpc[1:] = True
    else:
        grpc[sorted(c for c in grpc_codes if 0 <= c <= GRPC_MAX_CODE)] = True
    # outcomes past the gRPC range never pass the codec; as in the default, 5xx-like
    table[GRPC_STATUS + GRPC_MAX_CODE + 1 :] = statuses is None
    return table


def _concat(parts: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _timestamps(batch: DecodedBatch | RawBatch) -> F64:
    if isinstance(batch, RawBatch):
        return batch.t0 + batch.dt_us.astype(np.float64) / 1e6
    return batch.ts


@dataclass
class _Columns:
    """A batch's samples after admission: columns of equal length, variant as ring index.

    `rt_us` is the latency the rings being filled keep; `fb_us` the first byte (None:
    no sample has one) and `known` which samples have one (None: all of them)."""

    variant: npt.NDArray[np.integer[Any]]
    ts: F64
    rt_us: npt.NDArray[np.uint32]
    outcome: npt.NDArray[np.uint16]
    unit: U32
    lo: float
    hi: float
    fb_us: npt.NDArray[np.uint32] | None = None
    known: npt.NDArray[np.bool_] | None = None

    @property
    def size(self) -> int:
        return int(self.ts.shape[0])

    def first_byte(self) -> _Columns | None:
        """The samples with a first byte, their first byte as the latency."""
        fb = self.fb_us
        if fb is None:
            return None
        if self.known is None:
            return _Columns(self.variant, self.ts, fb, self.outcome, self.unit, self.lo, self.hi)
        keep = self.known
        if not keep.any():
            return None
        ts = self.ts[keep]
        return _Columns(
            self.variant[keep], ts, fb[keep], self.outcome[keep], self.unit[keep],
            float(ts.min()), float(ts.max()),
        )  # fmt: skip


def _first_byte_column(
    batches: Sequence[DecodedBatch | RawBatch],
) -> tuple[npt.NDArray[np.uint32] | None, npt.NDArray[np.bool_] | None]:
    """The batches' first bytes concatenated, and which samples have one (None: all)."""
    if all(b.fb_us is not None for b in batches):
        return _concat([b.fb_us for b in batches if b.fb_us is not None]), None
    if all(b.fb_us is None for b in batches):
        return None, None
    parts = [
        b.fb_us if b.fb_us is not None else np.zeros(b.rt_us.shape[0], np.uint32) for b in batches
    ]
    known = [np.full(b.rt_us.shape[0], b.fb_us is not None) for b in batches]
    return np.concatenate(parts), np.concatenate(known)


class _Placement(list[tuple[int, I64, I64, npt.NDArray[np.bool_]]]):
    """Where a read's active groups go, per variant: (variant, its groups, their slots,
    which slots held their second already). The first-byte ring of a variant has the
    same capacity as its total ring, so the same slots; `slots` maps group → slot."""

    def __init__(self) -> None:
        super().__init__()
        self.slots: dict[int, int] = {}


@dataclass
class IngestCounters:
    ingested: int = 0
    late: int = 0
    clamped: int = 0
    without_first_byte: int = 0  # ingested from batches older than version 2
    shed: int = 0  # requests shed by the sidecars, from the tallies (never samples)


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
        self._rings: list[VariantRing] = []  # total time, per variant
        self._fb_rings: list[VariantRing] = []  # first byte, same variants and seconds
        self._failure_table = failure_table(config.failure_statuses, config.grpc_failure_codes)
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
        if (config.failure_statuses, config.grpc_failure_codes) != (
            old.failure_statuses,
            old.grpc_failure_codes,
        ):
            # recorded failures cannot be re-classified; new samples use the new set
            self._failure_table = failure_table(config.failure_statuses, config.grpc_failure_codes)
        if config.threshold_ms != old.threshold_ms:
            self._threshold_us = self._threshold_in_us(config.threshold_ms)
            for ring in self._every_ring():
                # every bucket so far counted "above" under the old threshold: exclude
                # them from the exact sum; the histogram stands in until they leave
                ring.stale[ring.second >= 0] = True
                ring.win_above = 0
        if config.window_sec != old.window_sec:
            self._longest = max(self._longest, config.window_sec)
            now_sec = math.floor(now)
            new_tail = now_sec - config.window_sec + 1
            for ring in self._every_ring():
                ring.grow(self._capacity())
                if new_tail > self._tail:
                    for slot in ring.slots_between(self._tail, new_tail - 1):
                        ring.add_to_window(slot, -1)
                else:
                    for slot in ring.slots_between(new_tail, self._tail - 1):
                        ring.add_to_window(slot, +1)
            self._tail = new_tail

    def advance(self, now: float) -> None:
        """Evict the seconds that left the window (subtract-on-evict).

        An eviction alone does not mark the window changed: every reader of a
        partial drops the seconds that left its own window (sharding.py), so a
        publish for it would tell nothing new, and it was one publish in three
        under a steady feed (decision 0033). The heartbeat still republishes an
        experiment without samples."""
        new_tail = math.floor(now) - self.config.window_sec + 1
        if new_tail <= self._tail:
            return
        for ring in self._every_ring():
            for slot in ring.slots_between(self._tail, new_tail - 1):
                ring.add_to_window(slot, -1)
        self._tail = new_tail

    @property
    def window_start(self) -> int:
        return self._tail

    def _every_ring(self) -> list[VariantRing]:
        return self._rings + self._fb_rings

    def _variant_index(self, name: str) -> int:
        index = self._variants.get(name)
        if index is None:
            index = self._variants[name] = len(self._rings)
            self._rings.append(VariantRing(self.mapping.bins, self._capacity()))
            self._fb_rings.append(VariantRing(self.mapping.bins, self._capacity()))
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
        fb_us, known = _first_byte_column(batches)
        # only a version 3 batch may hold a tally (codec.py); a decoded one may be any
        if any(getattr(b, "version", VERSION_SHED) >= VERSION_SHED for b in batches):
            tallies = outcome == SHED
            if tallies.any():
                self.record_shed(variant[tallies], ts[tallies], rt_us[tallies], now)
                keep = ~tallies
                variant, ts, rt_us = variant[keep], ts[keep], rt_us[keep]
                outcome, unit = outcome[keep], unit[keep]
                fb_us = None if fb_us is None else fb_us[keep]
                known = None if known is None else known[keep]
        self.ingest(variant, ts, rt_us, outcome, now, unit, fb_us=fb_us, known=known)

    def record_shed(
        self,
        variant: npt.NDArray[np.integer[Any]],
        ts: F64,
        counts: npt.NDArray[np.uint32],
        now: float,
    ) -> None:
        """Shed tallies (variant as ring indices) into their seconds' `shed` counts.

        Admitted as samples are (ahead of the clock: clamped to now; older than the
        window: dropped); they touch nothing else of a bucket. A few per sidecar worker
        and flush at most, so a loop over them costs little."""
        self.advance(now)
        ts = np.where(ts > now + self.skew_sec, now, ts)
        per_second: dict[tuple[int, int], int] = {}
        for t, v, n in zip(np.floor(ts).tolist(), variant.tolist(), counts.tolist(), strict=True):
            if t >= self._tail:
                key = (int(t), int(v))
                per_second[key] = per_second.get(key, 0) + int(n)
        for (second, v), n in per_second.items():
            ring, fb_ring = self._rings[v], self._fb_rings[v]
            seconds = np.array([second], dtype=np.int64)
            slots, held = ring.claim(seconds)
            # the first-byte ring claims the second too, paired as _fill pairs them:
            # a second claimed in the total ring alone would cost every later read of
            # it a reservoir and a unit sketch of its own in the first-byte ring
            fb_held = fb_ring.claim(seconds)[1]
            fb_ring.paired[slots] = (held == fb_held) & (~held | fb_ring.paired[slots])
            slot = int(slots[0])
            ring.shed[slot] += n
            ring.win_shed += n
            self.counters.shed += n
            self.changed = True

    def ingest(
        self,
        variant: npt.NDArray[np.integer[Any]],
        ts: F64,
        rt_us: npt.NDArray[np.uint32],
        outcome: npt.NDArray[np.uint16],
        now: float,
        unit: U32 | None = None,
        *,
        fb_us: npt.NDArray[np.uint32] | None = None,
        known: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        """The vectorised core: columns of equal length, variant as ring indices.

        `unit`: each sample's unit hash (0 or None: no unit). `fb_us`: each sample's
        time to the first byte (None: no sample has one), `known`: which samples have
        one (None: all). Steps: admit the samples (clamp the ones ahead of the clock,
        drop the late ones), then fill the total rings and the first-byte rings.
        """
        self.advance(now)
        n = int(ts.shape[0])
        if n == 0:
            return
        if unit is None:
            unit = np.zeros(n, dtype=np.uint32)
        start = _Columns(variant, ts, rt_us, outcome, unit, 0.0, 0.0, fb_us, known)
        cols = self._admit(start, now)
        if cols is None:
            return
        self.counters.ingested += cols.size
        self.changed = True
        if cols.known is not None and cols.known.all():
            cols.known = None
        if cols.fb_us is not None and cols.known is None:
            # every sample has a first byte (batches of version 2 only): one grouping
            # for both latencies, and paired seconds share their reservoir and units
            self._fill(self._rings, cols, first_byte=cols.fb_us)
            return
        self._fill(self._rings, cols)
        first_byte = cols.first_byte()
        missing = cols.size if first_byte is None else cols.size - first_byte.size
        self.counters.without_first_byte += missing
        if first_byte is not None:
            self._fill(self._fb_rings, first_byte)

    def _fill(
        self,
        rings: list[VariantRing],
        cols: _Columns,
        *,
        first_byte: npt.NDArray[np.uint32] | None = None,
    ) -> None:
        """Reduce the samples per (second, variant), add each group to its bucket and
        the window, offer reservoir and distinct-unit candidates, note the newest sample.

        `rings` keep `cols.rt_us`. With `first_byte` (every sample's; `rings` are then
        the total rings) the first-byte rings are filled from the same groups: the
        seconds a ring pair holds the same samples of (`VariantRing.paired`) take the
        reservoir keys and distinct units of the total ring instead of drawing their
        own; the histogram, counts above the threshold, sums and reservoir values are
        the first byte's. A first byte equal to the total in every sample is reduced
        once."""
        first = math.floor(cols.lo)
        span = math.floor(cols.hi) - first + 1
        failed = self._failed(cols.outcome)
        groups = group_samples(
            cols.ts, cols.variant, cols.unit, failed, first=first, span=span,
            n_variants=len(rings), bins=self.mapping.bins, offset=self.mapping.offset,
        )  # fmt: skip
        sums = self._reduce(groups, cols.rt_us)
        active = sums.active
        place = self._place(rings, first, active)
        self._add_to_buckets(rings, groups, sums, place)
        fb_rings = self._fb_rings
        if first_byte is None:
            for v, groups_v, slots_v, _ in place:  # these seconds' samples differ in the two rings
                if rings is not fb_rings:
                    # the first-byte ring holds the second too, if only empty: its slot
                    # may still hold a second that left the window, which a publish of
                    # this second would otherwise send as this second's first byte
                    fb_rings[v].claim(first + groups_v // len(rings))
                fb_rings[v].paired[slots_v] = False
            self._offer_reservoirs(
                rings, cols.rt_us, cols.unit, groups.group, sums.counts, active, place.slots
            )
            self._offer_distinct(rings, groups, cols.unit, active, place.slots)
            self._mark_newest(rings, active, cols.hi)
            return
        # the first sample tells in O(1) when they differ, the common case
        same = first_byte[0] == cols.rt_us[0] and np.array_equal(first_byte, cols.rt_us)
        fb_sums = sums if same else self._reduce(groups, first_byte)
        paired: set[int] = set()
        for v, groups_v, slots_v, held_v in place:
            ring = fb_rings[v]
            fb_held = ring.claim(first + groups_v // len(rings))[1]  # the same slots
            # both start these seconds now, or both held them, paired, before this read
            pair = (held_v == fb_held) & (~held_v | ring.paired[slots_v])
            ring.paired[slots_v] = pair
            paired.update(groups_v[pair].tolist())
        alone = [g for g in active if g not in paired]
        self._add_to_buckets(fb_rings, groups, fb_sums, place)
        slots = place.slots
        follow = (fb_rings, first_byte, paired)
        self._offer_reservoirs(
            rings, cols.rt_us, cols.unit, groups.group, sums.counts, active, slots,
            follow=follow,
        )  # fmt: skip
        self._offer_distinct(rings, groups, cols.unit, active, slots)
        for g in paired:
            slot = slots[g]
            fb_rings[g % len(rings)].distinct[slot] = rings[g % len(rings)].distinct[slot]
        if alone:  # seconds that already held samples without a first byte
            self._offer_reservoirs(
                fb_rings, first_byte, cols.unit, groups.group, sums.counts, alone, slots
            )
            self._offer_distinct(fb_rings, groups, cols.unit, alone, slots)
        self._mark_newest(rings, active, cols.hi)
        self._mark_newest(fb_rings, active, cols.hi)

    def _admit(self, cols: _Columns, now: float) -> _Columns | None:
        """Clamp samples ahead of now + skew to now; drop those older than the window."""
        ts = cols.ts
        lo, hi = float(ts.min()), float(ts.max())
        limit = now + self.skew_sec
        if hi > limit:
            ahead = ts > limit
            self.counters.clamped += int(np.count_nonzero(ahead))
            ts = np.where(ahead, now, ts)
            lo, hi = float(ts.min()), float(ts.max())
        cols.ts, cols.lo, cols.hi = ts, lo, hi
        if math.floor(lo) >= self._tail:
            return cols
        keep = np.floor(ts) >= self._tail
        m = int(np.count_nonzero(keep))
        self.counters.late += cols.size - m
        if m == 0:
            return None
        ts = ts[keep]
        return _Columns(
            cols.variant[keep], ts, cols.rt_us[keep], cols.outcome[keep], cols.unit[keep],
            float(ts.min()), float(ts.max()),
            None if cols.fb_us is None else cols.fb_us[keep],
            None if cols.known is None else cols.known[keep],
        )  # fmt: skip

    def _failed(self, outcome: npt.NDArray[np.uint16]) -> npt.NDArray[np.bool_]:
        failed: npt.NDArray[np.bool_]
        if self.config.default_failures:
            # the default (5xx, connect errors, timeouts, non-OK gRPC) in cheap comparisons
            failed = ((outcome >= 500) & (outcome != GRPC_OK)) | (
                (outcome < 100) & (outcome != ABORTED)
            )
        else:
            failed = self._failure_table[outcome]
        return failed

    def _reduce(self, groups: Groups, values: npt.NDArray[np.uint32]) -> LatencySums:
        """One latency's histogram, count, above-threshold, sum and unit rows per group."""
        flat = self.mapping.index(values, groups.base)
        return reduce_latency(groups, values, flat, self._above(values), self._bin_index)

    def _place(self, rings: list[VariantRing], first: int, active: list[int]) -> _Placement:
        """Claim each active group's bucket slot in `rings`."""
        n_variants = len(rings)
        # split in Python: a read mostly holds a group or two per variant, and a mask
        # per variant over them costs more in numpy's calls than it saves
        by_variant: dict[int, list[int]] = {}
        for g in active:
            by_variant.setdefault(g % n_variants, []).append(g)
        place = _Placement()
        for v in sorted(by_variant):
            groups_v = np.array(by_variant[v], dtype=np.int64)
            slots_v, held_v = rings[v].claim(first + groups_v // n_variants)
            place.append((v, groups_v, slots_v, held_v))
            place.slots.update(zip(by_variant[v], slots_v.tolist(), strict=True))
        return place

    def _taus(
        self, rings: list[VariantRing], active: list[int], slots: dict[int, int], counts: I64
    ) -> npt.NDArray[np.float32]:
        """The key bound each active group's reservoir offers under (0 for the others:
        they offer nothing)."""
        n_variants = len(rings)
        taus = np.zeros(counts.shape[0], dtype=np.float32)
        k = SECOND_RESERVOIR_SIZE
        for g in active:
            ring, slot = rings[g % n_variants], slots[g]
            if int(ring.res_fill[slot]) >= k:
                taus[g] = ring.res_tau[slot]
            elif int(counts[g]) > _SAMPLED_FILL:
                # filling, with many samples: about 4k of their keys fall below this
                taus[g] = 4 * k / int(counts[g])
            else:
                taus[g] = 2.0
        return taus

    def _add_to_buckets(
        self, rings: list[VariantRing], groups: Groups, sums: LatencySums, place: _Placement
    ) -> None:
        """Each group's sums into its second's bucket and into the running window sum,
        a variant's seconds at once."""
        for v, g, slot, _ in place:
            ring = rings[v]
            if g.shape[0] <= _SCALAR_GROUPS:
                for one, one_slot in zip(g.tolist(), slot.tolist(), strict=True):
                    self._add_one(ring, one, one_slot, groups, sums)
                continue
            counts, failures = sums.counts[g], groups.failures[g]
            group_sums, aboves = sums.sums[g], sums.aboves[g]
            hist = sums.hist[g]
            unit_counts, unit_sums = sums.unit_counts[g], sums.unit_sums[g]
            ring.count[slot] += counts
            ring.failures[slot] += failures
            ring.sum_us[slot] += group_sums
            ring.above[slot] += aboves
            ring.hist[slot] += hist.astype(np.int32)
            ring.unit_counts[slot] += unit_counts.astype(np.int32)
            ring.unit_sums[slot] += unit_sums
            ring.win_count += int(counts.sum())
            ring.win_failures += int(failures.sum())
            ring.win_sum_us += float(group_sums.sum())
            ring.win_above += int(aboves[~ring.stale[slot]].sum())
            ring.win_hist += hist.sum(axis=0)
            ring.win_unit_counts += unit_counts.sum(axis=0)
            ring.win_unit_sums += unit_sums.sum(axis=0)

    @staticmethod
    def _add_one(ring: VariantRing, g: int, slot: int, groups: Groups, sums: LatencySums) -> None:
        """`_add_to_buckets` of one group, in scalars and rows: the same sums (integers,
        and floats that are sums of integers below 2^53, exact in any order)."""
        count, failures = int(sums.counts[g]), int(groups.failures[g])
        group_sum, above = float(sums.sums[g]), int(sums.aboves[g])
        hist = sums.hist[g]
        unit_counts, unit_sums = sums.unit_counts[g], sums.unit_sums[g]
        ring.count[slot] += count
        ring.failures[slot] += failures
        ring.sum_us[slot] += group_sum
        ring.above[slot] += above
        ring.hist[slot] += hist.astype(np.int32)
        ring.unit_counts[slot] += unit_counts.astype(np.int32)
        ring.unit_sums[slot] += unit_sums
        ring.win_count += count
        ring.win_failures += failures
        ring.win_sum_us += group_sum
        if not ring.stale[slot]:
            ring.win_above += above
        ring.win_hist += hist
        ring.win_unit_counts += unit_counts
        ring.win_unit_sums += unit_sums

    def _offer_reservoirs(
        self,
        rings: list[VariantRing],
        values: npt.NDArray[np.uint32],
        unit: U32,
        group: I64 | None,
        counts: I64,
        active: list[int],
        slots: dict[int, int],
        *,
        follow: tuple[list[VariantRing], npt.NDArray[np.uint32], set[int]] | None = None,
    ) -> None:
        """Each bucket's bottom-k reservoir takes the read's candidates of its group
        (`counts`: each group's samples).

        `follow`: other rings, their values of the same samples, and the groups whose
        slots there are paired with these: those take what these rings keep."""
        n_variants = len(rings)
        m = int(values.shape[0])
        taus = self._taus(rings, active, slots, counts)
        k = SECOND_RESERVOIR_SIZE
        cand_pos, cand_keys = self._reservoir_candidates(group, taus, active, m)
        cand_group = group[cand_pos] if group is not None else np.zeros_like(cand_pos)
        for g in active:
            ring = rings[g % n_variants]
            slot = slots[g]
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
            if not keys.shape[0]:
                continue
            keep = ring.offer(slot, keys, values[pos].astype(np.uint32), unit[pos])
            if follow is not None and g in follow[2]:
                follow[0][g % n_variants].follow(ring, slot, keep, follow[1][pos])

    def _mark_newest(self, rings: list[VariantRing], active: list[int], hi: float) -> None:
        # the batch's newest sample stands for every variant in it: lag is a health
        # figure, and a per-variant max would cost a pass over the batch per variant
        n_variants = len(rings)
        for g in active:
            ring = rings[g % n_variants]
            if ring.newest_ts is None or hi > ring.newest_ts:
                ring.newest_ts = hi

    def _offer_distinct(
        self,
        rings: list[VariantRing],
        groups: Groups,
        unit: U32,
        active: list[int],
        slots: dict[int, int],
    ) -> None:
        """Each active second's new unit hashes into its distinct sketch.

        Once a second's sketch is full only hashes below its largest can enter, so a
        comparison pass filters a batch first. What is left is sorted once, keyed by
        (group, hash), and each group takes its smallest distinct hashes from its run.
        Groups not in `active` offer nothing.
        """
        if groups.unit_key is None:  # no sample has a unit
            return
        n_variants = len(rings)
        group = groups.group
        limits = np.zeros(groups.size, dtype=np.int64)
        for g in active:
            held = rings[g % n_variants].distinct[slots[g]]
            limits[g] = int(held[-1]) if held.shape[0] >= DISTINCT_K else U32_LIMIT
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
                mine = (keys[lo : min(hi, lo + DISTINCT_K)] & np.uint64(U32_LIMIT - 1)).astype(
                    np.uint32
                )
                rings[g % n_variants].offer_units(slots[g], mine)

    def _above(self, rt_us: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_] | None:
        """Samples above the threshold (None: none can be), in integer comparisons."""
        threshold = self._threshold_us
        if threshold >= U32_LIMIT - 1:
            return None
        if threshold < 0:
            return np.ones(rt_us.shape[0], dtype=bool)
        # integer rt > t  ⟺  rt > floor(t)
        return rt_us > np.uint32(math.floor(threshold))

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

    def totals(self, variant: str, now: float, *, first_byte: bool = False) -> WindowTotals:
        """The window's sums for one variant, O(bins) (+ stale buckets in a transition):
        of the total time, or (`first_byte`) of the first byte of the samples with one."""
        self.advance(now)
        ring = self.ring(variant, first_byte=first_byte)
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
            shed=ring.win_shed,
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
        """Every variant's window at `now`, its first-byte window nested in it."""
        return {
            name: with_first_byte(
                self.mapping,
                self.totals(name, now),
                self.totals(name, now, first_byte=True),
                experiment=self.experiment,
                variant=name,
                window_sec=self.config.window_sec,
                now=now,
                window_start=float(self._tail),
                threshold_ms=self.config.threshold_ms,
            )
            for name in self._variants
        }

    def ring(self, variant: str, *, first_byte: bool = False) -> VariantRing:
        rings = self._fb_rings if first_byte else self._rings
        return rings[self._variants[variant]]

    def nbytes(self) -> int:
        return sum(ring.nbytes() for ring in self._every_ring())
