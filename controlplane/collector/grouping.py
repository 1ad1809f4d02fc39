"""Per-group reductions of a batch's columns: the vectorised half of ingestion.

A group is one (second, variant) of a batch; `group` gives each sample's group, or
is None when every sample is in group 0 (one second, one variant: no index array at
all). Each function reduces one column to one figure per group in a pass or two
(bincount, masked sums), so a batch costs O(samples + groups x bins) however many
seconds and variants it spans. Pure functions: no state, no clock, no randomness.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from controlplane.collector.log_mapping import F64, I64, U32
from controlplane.collector.totals import UNIT_ROWS
from controlplane.kernel.units import block_of

# Groups (second x variant) up to which per-group RT sums are masked reductions: a
# weighted bincount costs several ns per sample whatever the number of groups.
_MASKED_SUM_GROUPS = 4


def unit_rows(
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
