"""A window's mergeable sums (`WindowTotals`) and the snapshot read from them.

Percentiles use the inverted-CDF definition (architecture §8): P_q is the smallest x with
F(x) ≥ q, read from the histogram as the representative value of the bin holding the
ceil(q·n)-th smallest sample, so every reported value is within alpha of the exact one.

"P_q > threshold" holds exactly when more than (1 - q)·n samples are above the
threshold, which is why each bucket also counts those samples exactly; buckets
counted under an older threshold are kept apart (`stale_hist`) and estimated.

The same type is the local window's snapshot and the sum of several collectors'
partial windows (see controlplane/collector/sharding.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controlplane.collector.log_mapping import F64, I64, U32, LogMapping
from controlplane.kernel.rules import PERCENTILES
from controlplane.kernel.snapshots import FIRST_BYTE, PERCENTILE_FIELDS, TOTAL, WindowSnapshot
from controlplane.kernel.units import UNIT_BLOCKS, UnitSummary, bottom_distinct

RESERVOIR_SIZE = 512
# rows of the unit sums: 0 for samples without a unit, then one per unit block
UNIT_ROWS = UNIT_BLOCKS + 1


def inverted_cdf_rank(percentile: float, n: int) -> int:
    """1-based rank of P_q over n samples: ceil(q·n), in integers to dodge float error."""
    tenths = round(percentile * 10)
    return max(1, -(-tenths * n // 1000))


# each reported percentile in tenths of a percent, as inverted_cdf_rank takes it
_TENTHS = tuple(round(q * 10) for q in PERCENTILES)
_FIELDS = tuple(PERCENTILE_FIELDS[q] for q in PERCENTILES)


@dataclass
class WindowTotals:
    """A window's mergeable sums: add two and you have the window over both inputs."""

    bins: int
    count: int = 0
    failures: int = 0
    sum_us: float = 0.0
    above_exact: int = 0
    shed: int = 0  # requests the sidecars shed (tallies, not samples)
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
        self.shed += other.shed
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
        # the rows written in place (a column_stack of converted copies was a third of
        # a snapshot's cost, made eight times a look)
        rows = np.empty((self.unit_counts.shape[0], 5), dtype=np.float64)
        rows[:, :3] = self.unit_counts
        rows[:, 3], rows[:, 4] = mapping.log_ms_sums(
            rows[:, 0], self.unit_sums[:, 0], self.unit_sums[:, 1]
        )
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
        latency: str = TOTAL,
        shed: int | None = None,
        first_byte: WindowSnapshot | None = None,
    ) -> WindowSnapshot:
        """The window's snapshot; `latency`, `shed` and `first_byte` as
        `with_first_byte` nests them (set here rather than by `replace` after)."""
        percentiles: dict[str, float | None] = dict.fromkeys(PERCENTILE_FIELDS.values())
        mean_ms: float | None = None
        if self.count:
            n = self.count
            cumulative = np.cumsum(self.hist)
            # inverted_cdf_rank of each percentile, inline: it ran per percentile per
            # snapshot, eight snapshots a look
            ranks = [max(1, -(-tenths * n // 1000)) for tenths in _TENTHS]
            where = np.searchsorted(cumulative, ranks, side="left")
            np.minimum(where, mapping.bins - 1, out=where)
            values = mapping.representative_ms[where].tolist()
            percentiles.update(zip(_FIELDS, values, strict=True))
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
            shed=self.shed if shed is None else shed,
            # float64 division is the one float(v) / 1000.0 makes, value for value
            reservoir_ms=tuple((self.res_us.astype(np.float64) / 1000.0).tolist()),
            reservoir_units=tuple(self.res_units.tolist()),
            units=self.unit_summary(mapping),
            first_byte=first_byte,
            latency=latency,
            p50_ms=percentiles["p50_ms"],
            p90_ms=percentiles["p90_ms"],
            p95_ms=percentiles["p95_ms"],
            p99_ms=percentiles["p99_ms"],
            p999_ms=percentiles["p999_ms"],
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


def with_first_byte(
    mapping: LogMapping,
    total: WindowTotals,
    first_byte: WindowTotals,
    *,
    experiment: str,
    variant: str,
    window_sec: int,
    now: float,
    window_start: float,
    threshold_ms: float | None,
) -> WindowSnapshot:
    """A variant's snapshot of the total time, its first-byte window nested in it (the
    shed requests are the variant's, whichever latency is judged)."""

    inner = first_byte.snapshot(
        mapping, experiment=experiment, variant=variant, window_sec=window_sec, now=now,
        window_start=window_start, threshold_ms=threshold_ms, latency=FIRST_BYTE,
        shed=total.shed,
    )  # fmt: skip
    return total.snapshot(
        mapping, experiment=experiment, variant=variant, window_sec=window_sec, now=now,
        window_start=window_start, threshold_ms=threshold_ms, first_byte=inner,
    )  # fmt: skip
