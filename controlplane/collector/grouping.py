"""Per-group reductions of a batch's columns: the vectorised half of ingestion.

A group is one (second, variant) of a batch; `group` gives each sample's group, or
is None when every sample is in group 0 (one second, one variant: no index array at
all). Each function reduces one column to one figure per group in a pass or two
(bincount, masked sums), so a batch costs O(samples + groups x bins) however many
seconds and variants it spans.

A read is reduced in two parts: what its samples share whatever latency a ring keeps
(`Groups`: each sample's group, the failures, the unit rows' keys and tallies), once,
and what depends on the latency (`LatencySums`: histogram, above-threshold counts,
sums), once per latency. Pure functions: no state, no clock, no randomness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controlplane.collector.log_mapping import F64, I64, U32
from controlplane.collector.totals import UNIT_ROWS
from controlplane.kernel.units import block_of

# Groups (second x variant) up to which per-group sums are masked reductions: a
# weighted bincount costs more whatever the number of groups.
_MASKED_SUM_GROUPS = 2
# Cells (groups x bins) up to which sums go through a flat histogram (8 MiB of
# float64; the read's histogram itself is as large), per group beyond.
_FLAT_SUM_CELLS = 1 << 20


@dataclass
class Groups:
    """A read's samples per group (second x variant): what every latency shares."""

    first: int  # the read's first second
    size: int  # groups: seconds spanned x variants
    group: I64 | None  # each sample's group; None: all in group 0
    # each sample's group's first bin in a flat histogram of all groups, plus the
    # mapping's offset (LogMapping.index); None: all in group 0
    base: npt.NDArray[np.int32] | None
    failed: npt.NDArray[np.bool_]
    failures: I64
    # each sample's (group, unit row), and per such key its samples and failures;
    # None: no sample has a unit (every sample in row 0, read off the histogram)
    unit_key: I64 | None
    unit_tally: I64 | None


@dataclass
class LatencySums:
    """One latency of a read's samples, per group: what each bucket adds."""

    hist: I64  # (groups, bins)
    counts: I64
    aboves: I64
    sums: F64
    unit_counts: I64  # (groups, UNIT_ROWS, 3)
    unit_sums: F64  # (groups, UNIT_ROWS, 2)
    active: list[int]  # groups with at least one sample


def group_samples(
    ts: F64,
    variant: npt.NDArray[np.integer],
    unit: U32,
    failed: npt.NDArray[np.bool_],
    *,
    first: int,
    span: int,
    n_variants: int,
    bins: int,
    offset: int,
) -> Groups:
    """The latency-free half of a read's reduction, for histograms of `bins` bins
    indexed by a mapping with `offset` (LogMapping)."""
    size = span * n_variants
    group = group_of(ts, variant, first, span, n_variants)
    base: npt.NDArray[np.int32] | None = None
    if group is not None:
        # < 2^31: groups are bounded by the window (3600 s + skew) x 16 variants
        base = group.astype(np.int32)
        base *= np.int32(bins)
        base += np.int32(offset)
    failures = per_group(group, failed, size)
    key: I64 | None = None
    tally: I64 | None = None
    if unit.any():
        key = block_of(unit)
        if group is not None:
            key += group * UNIT_ROWS
        rows = size * UNIT_ROWS
        tally = np.empty((rows, 2), dtype=np.int64)
        tally[:, 0] = np.bincount(key, minlength=rows)
        tally[:, 1] = np.bincount(key[failed], minlength=rows)
    return Groups(first, size, group, base, failed, failures, key, tally)


def reduce_latency(
    groups: Groups,
    values: npt.NDArray[np.uint32],
    flat: I64,
    above: npt.NDArray[np.bool_] | None,
    bin_index: F64,
) -> LatencySums:
    """Histogram, count, above-threshold, sum and unit rows per group of one latency.

    `flat`: each sample's bin in the flat histogram of all groups (LogMapping.index
    with the groups' base), `above`: which samples are above the threshold (None: none
    can be), `bin_index`: 0 … bins - 1 as floats."""
    size, bins, group = groups.size, bin_index.shape[0], groups.group
    hist = np.bincount(flat, minlength=size * bins).reshape(size, bins)
    counts = hist.sum(axis=1)
    active = [int(g) for g in np.flatnonzero(counts)]
    aboves = per_group(group, above, size)
    sums = group_sums(group, values, size, active, flat=flat, bins=bins)
    if groups.unit_key is None or groups.unit_tally is None:
        unit_counts, unit_sums = unitless_rows(hist, counts, groups.failures, aboves, bin_index)
    else:
        index = flat if group is None else flat - group * bins
        unit_counts, unit_sums = unit_rows(groups.unit_key, groups.unit_tally, index, above, size)
    return LatencySums(hist, counts, aboves, sums, unit_counts, unit_sums, active)


def unit_rows(
    key: I64, tally: I64, index: I64, above: npt.NDArray[np.bool_] | None, groups: int
) -> tuple[I64, F64]:
    """Per group and unit row: count, failures, above; Σ bin index, Σ bin index².

    `key` and `tally` as in `Groups`: the count and failures are the same for every
    latency, the rest is this one's."""
    size = groups * UNIT_ROWS
    counts = np.zeros((size, 3), dtype=np.int64)
    counts[:, :2] = tally
    if above is not None:
        counts[:, 2] = np.bincount(key[above], minlength=size)
    weights = index.astype(np.float64)
    sums = np.empty((size, 2), dtype=np.float64)
    sums[:, 0] = np.bincount(key, weights=weights, minlength=size)
    weights *= weights
    sums[:, 1] = np.bincount(key, weights=weights, minlength=size)
    return counts.reshape(groups, UNIT_ROWS, 3), sums.reshape(groups, UNIT_ROWS, 2)


def unitless_rows(
    hist: I64, counts: I64, failures: I64, aboves: I64, bin_index: F64
) -> tuple[I64, F64]:
    """`unit_rows` when no sample has a unit: all in row 0, the index sums read
    off the histogram (O(groups x bins), no pass over the samples)."""
    groups = hist.shape[0]
    unit_counts = np.zeros((groups, UNIT_ROWS, 3), dtype=np.int64)
    unit_counts[:, 0, 0] = counts
    unit_counts[:, 0, 1] = failures
    unit_counts[:, 0, 2] = aboves
    unit_sums = np.zeros((groups, UNIT_ROWS, 2), dtype=np.float64)
    weights = bin_index
    unit_sums[:, 0, 0] = hist @ weights
    unit_sums[:, 0, 1] = hist @ (weights * weights)
    return unit_counts, unit_sums


def per_group(group: I64 | None, mask: npt.NDArray[np.bool_] | None, groups: int) -> I64:
    """How many samples of each group the mask selects."""
    if mask is None:
        return np.zeros(groups, dtype=np.int64)
    if group is None:
        out = np.zeros(groups, dtype=np.int64)
        out[0] = np.count_nonzero(mask)
        return out
    return np.bincount(group[mask], minlength=groups)


def group_sums(
    group: I64 | None,
    rt_us: npt.NDArray[np.uint32],
    groups: int,
    active: list[int],
    *,
    flat: I64 | None = None,
    bins: int = 0,
) -> npt.NDArray[np.float64]:
    """Exact RT sum per group (integers summed in u64, or in float64 below 2^53).

    `flat`: each sample's (group, histogram bin) as in the histogram, with `bins`
    bins per group. Summing per (group, bin) and then per group costs less than per
    group at once: consecutive samples (a sidecar's batch, in time order) mostly share
    a group, and each would wait for the previous one's add to the same total."""
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
    elif flat is not None and groups * bins <= _FLAT_SUM_CELLS:
        spread = np.bincount(flat, weights=rt_us, minlength=groups * bins)
        out[:] = spread.reshape(groups, bins).sum(axis=1)
    else:
        out[:] = np.bincount(group, weights=rt_us, minlength=groups)
    return out


def group_of(
    ts: F64, variant: npt.NDArray[np.integer], first: int, span: int, n_variants: int
) -> I64 | None:
    """Each sample's group, second-major: (second - first) x n_variants + variant.

    None when every sample is in group 0 (one second, one variant)."""
    group: I64 | None = None
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
    return group
