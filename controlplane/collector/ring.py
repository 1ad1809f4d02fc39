"""One variant's ring of 1-second buckets and the running sum over its window.

A bucket holds the count, failures, the sum of response times, the requests the
sidecars shed (tallies, never samples: a total ring's only), the exact count above
the rule's threshold, a log-bucket histogram, a small bottom-k reservoir and the
bottom-k distinct unit hashes. The running sum over the buckets inside the window is
kept with subtract-on-evict (`add_to_window`), so a snapshot costs O(bins), not
O(window). The ring knows nothing of time or rules: its experiment decides which
seconds are in the window.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.collector.log_mapping import F64, I64, U32
from controlplane.collector.totals import UNIT_ROWS, bottom_k_index
from controlplane.kernel.units import DISTINCT_K, bottom_distinct

# Per-second sub-reservoirs are merged by their random keys (bottom-k), so the window
# reservoir is a uniform sample whenever no second holds more than this share of it.
SECOND_RESERVOIR_SIZE = 64
# Seconds up to which a claim is scalar steps per second rather than array operations.
_SCALAR_CLAIMS = 4


class VariantRing:
    """One variant's 1-second buckets and the running sum over those in the window."""

    # per slot (one second each), allocated together by _allocate
    second: I64
    count: I64
    failures: I64
    sum_us: F64
    above: I64
    shed: I64
    stale: npt.NDArray[np.bool_]
    dirty: npt.NDArray[np.bool_]
    touched: npt.NDArray[np.bool_]
    hist: npt.NDArray[np.int32]
    res_keys: npt.NDArray[np.float32]
    res_us: npt.NDArray[np.uint32]
    res_fill: I64
    res_tau: npt.NDArray[np.float32]
    res_unit: U32
    unit_counts: npt.NDArray[np.int32]
    unit_sums: F64
    # a first-byte ring's second that holds exactly the samples of the total ring's
    # same slot, with the same reservoir keys and units and the same distinct units
    # (every sample of that second carried a first byte): those are shared, not redone
    paired: npt.NDArray[np.bool_]

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
        self.win_shed = 0
        self.newest_ts: float | None = None

    def _allocate(self, capacity: int) -> None:
        old = self.__dict__.get("second")
        fresh: dict[str, npt.NDArray[Any]] = {
            "second": np.full(capacity, -1, dtype=np.int64),
            "count": np.zeros(capacity, dtype=np.int64),
            "failures": np.zeros(capacity, dtype=np.int64),
            "sum_us": np.zeros(capacity, dtype=np.float64),
            "above": np.zeros(capacity, dtype=np.int64),
            "shed": np.zeros(capacity, dtype=np.int64),
            "stale": np.zeros(capacity, dtype=bool),
            "dirty": np.ones(capacity, dtype=bool),
            # the same for the format 2 publish (second_partials.py), which clears it
            "touched": np.ones(capacity, dtype=bool),
            # int32 per second halves the ring; the running sum is int64
            "hist": np.zeros((capacity, self.bins), dtype=np.int32),
            "res_keys": np.zeros((capacity, SECOND_RESERVOIR_SIZE), dtype=np.float32),
            "res_us": np.zeros((capacity, SECOND_RESERVOIR_SIZE), dtype=np.uint32),
            "res_fill": np.zeros(capacity, dtype=np.int64),
            "res_tau": np.full(capacity, 2.0, dtype=np.float32),
            "res_unit": np.zeros((capacity, SECOND_RESERVOIR_SIZE), dtype=np.uint32),
            "unit_counts": np.zeros((capacity, UNIT_ROWS, 3), dtype=np.int32),
            "unit_sums": np.zeros((capacity, UNIT_ROWS, 2), dtype=np.float64),
            "paired": np.zeros(capacity, dtype=bool),
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

    def claim(self, seconds: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
        """The slots of `seconds` (distinct, all in the ring's span), and which of them
        held their second already; the others are cleared for it."""
        if seconds.shape[0] <= _SCALAR_CLAIMS:
            claimed = [self._claim_one(second) for second in seconds.tolist()]
            return (
                np.array([slot for slot, _ in claimed], dtype=np.int64),
                np.array([held for _, held in claimed], dtype=bool),
            )
        slots = seconds % self.capacity
        held = self.second[slots] == seconds
        if not held.all():
            # those slots' previous seconds left the window (capacity > window + skew)
            fresh, new = slots[~held], seconds[~held]
            self.second[fresh] = new
            self.count[fresh] = self.failures[fresh] = self.above[fresh] = 0
            self.shed[fresh] = 0
            self.sum_us[fresh] = 0.0
            self.stale[fresh] = False
            self.hist[fresh] = 0
            self.res_fill[fresh] = 0
            self.res_tau[fresh] = 2.0
            self.unit_counts[fresh] = 0
            self.unit_sums[fresh] = 0.0
            for slot in fresh.tolist():
                self.distinct[slot] = np.zeros(0, dtype=np.uint32)
        self.dirty[slots] = True
        self.touched[slots] = True
        return slots, held

    def _claim_one(self, second: int) -> tuple[int, bool]:
        """`claim` of one second, in scalar steps: a sidecar's batch falls in a second or
        two, and a dozen fancy-indexed writes cost more than its samples."""
        slot = second % self.capacity
        held = int(self.second[slot]) == second
        if not held:
            self.second[slot] = second
            self.count[slot] = self.failures[slot] = self.above[slot] = 0
            self.shed[slot] = 0
            self.sum_us[slot] = 0.0
            self.stale[slot] = False
            self.hist[slot] = 0
            self.res_fill[slot] = 0
            self.res_tau[slot] = 2.0
            self.unit_counts[slot] = 0
            self.unit_sums[slot] = 0.0
            self.distinct[slot] = np.zeros(0, dtype=np.uint32)
        self.dirty[slot] = True
        self.touched[slot] = True
        return slot, held

    def add_to_window(self, slot: int, sign: int) -> None:
        self.win_count += sign * int(self.count[slot])
        self.win_failures += sign * int(self.failures[slot])
        self.win_sum_us += sign * float(self.sum_us[slot])
        self.win_shed += sign * int(self.shed[slot])
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
    ) -> I64:
        """Keep the bottom k of the slot's keys and `keys`; which positions of the
        two concatenated were kept."""
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
        return keep

    def follow(
        self, twin: VariantRing, slot: int, keep: I64, values: npt.NDArray[np.uint32]
    ) -> None:
        """Offer as `twin` just did (`keep`, what its `offer` returned), with `values`.

        For a paired slot: both rings held the same keys, were offered the same new
        ones, and so keep the same positions; only the latency values differ."""
        fill = int(self.res_fill[slot])
        all_values = np.concatenate([self.res_us[slot, :fill], values])
        kept = keep.shape[0]
        self.res_us[slot, :kept] = all_values[keep]
        self.res_keys[slot, :kept] = twin.res_keys[slot, :kept]
        self.res_unit[slot, :kept] = twin.res_unit[slot, :kept]
        self.res_fill[slot] = kept
        self.res_tau[slot] = twin.res_tau[slot]

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
            self.win_hist, self.res_unit, self.unit_counts, self.unit_sums, self.paired,
        ]  # fmt: skip
        return sum(a.nbytes for a in arrays) + sum(d.nbytes for d in self.distinct)
