"""What a window knows about the units (users) behind its samples.

Samples carry a 32-bit hash of their sticky unit (0: none). Requests of one unit are
not independent (a slow account is slow on every request, a heavy client makes a
large share of them), so the decision core judges on units, and for that a window
keeps, per variant (docs/decisions/0012-cluster-robust-judgment.md):

- **blocks**: the units split into `UNIT_BLOCKS` ranges of their hash
  (`block = hash * UNIT_BLOCKS >> 32`), each with its sample count, failures,
  above-threshold count and the sum and sum of squares of ln(RT in ms). Every unit
  lies wholly in one block, so blocks are valid clusters for a cluster-robust
  variance; they add up exactly across seconds, partial windows and collectors.
- **no_unit**: the same five sums over the samples without a unit, which are judged
  as independent samples, as before units were known.
- **distinct**: the smallest `DISTINCT_K` distinct unit hashes (a bottom-k / KMV
  sketch). The union of two sketches' bottom-k is the sketch of the union, so it
  merges exactly; below `DISTINCT_K` units it is the exact set.

The top units' shares come from the window's reservoir, which carries each sample's
unit (`WindowSnapshot.reservoir_units`): a uniform sample of the window's requests.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.kernel.json_text import FrozenDict

UNIT_BLOCKS = 64
UNIT_BLOCK_SHIFT = 26  # 32 - log2(UNIT_BLOCKS)
DISTINCT_K = 1024
# count, failures, above threshold, sum of ln(ms), sum of ln(ms)^2
BLOCK_COLUMNS = 5
_U32 = 2**32

F64 = npt.NDArray[np.float64]
U32 = npt.NDArray[np.uint32]


def block_of(unit: npt.NDArray[np.uint32]) -> npt.NDArray[np.int64]:
    """Row index per sample: 0 for no unit, 1 + the hash's block otherwise."""
    rows = (unit >> np.uint32(UNIT_BLOCK_SHIFT)).astype(np.int64)
    rows += 1
    rows *= unit != 0
    return rows


def bottom_distinct(hashes: Iterable[npt.NDArray[np.uint32]], k: int = DISTINCT_K) -> U32:
    """The k smallest distinct non-zero hashes of the union, sorted."""
    parts = [h for h in hashes if h.shape[0]]
    if not parts:
        return np.zeros(0, dtype=np.uint32)
    ordered = np.sort(np.concatenate(parts).astype(np.uint32, copy=False))
    first = np.empty(ordered.shape[0], dtype=bool)
    first[0] = ordered[0] != 0
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first][:k]


@dataclass(frozen=True, eq=False)
class UnitSummary:
    """One variant's window (or a step's sum of windows), per unit block.

    `rows` is (1 + UNIT_BLOCKS) x BLOCK_COLUMNS: row 0 the samples without a unit,
    then one row per block; `distinct` the sorted bottom-k unit hashes.
    """

    rows: F64
    distinct: U32

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UnitSummary):
            return NotImplemented
        return bool(
            np.array_equal(self.rows, other.rows) and np.array_equal(self.distinct, other.distinct)
        )

    def __hash__(self) -> int:
        return hash((self.rows.tobytes(), self.distinct.tobytes()))

    @classmethod
    def empty(cls) -> UnitSummary:
        return cls(np.zeros((UNIT_BLOCKS + 1, BLOCK_COLUMNS)), np.zeros(0, dtype=np.uint32))

    @classmethod
    def from_arrays(cls, rows: F64, distinct: U32) -> UnitSummary:
        return cls(np.asarray(rows, dtype=np.float64), np.asarray(distinct, dtype=np.uint32))

    @property
    def blocks(self) -> F64:
        blocks: F64 = self.rows[1:]
        return blocks

    @property
    def no_unit(self) -> F64:
        row: F64 = self.rows[0]
        return row

    def add(self, other: UnitSummary) -> UnitSummary:
        return UnitSummary(self.rows + other.rows, bottom_distinct([self.distinct, other.distinct]))

    # counted once: the rows are never changed in place, and the controller reads a
    # window's summary at every look (a restamped window keeps the same summary)
    @cached_property
    def unit_samples(self) -> int:
        return int(self.rows[1:, 0].sum())

    @property
    def no_unit_samples(self) -> int:
        return int(self.rows[0, 0])

    def distinct_units(self) -> float:
        """Distinct units: exact below DISTINCT_K, else the KMV estimate (k-1)/u_k."""
        return self._distinct_units

    @cached_property
    def _distinct_units(self) -> float:
        n = int(self.distinct.shape[0])
        if n < DISTINCT_K:
            return float(n)
        return (n - 1) / ((int(self.distinct[-1]) + 1) / _U32)

    def to_dict(self) -> dict[str, Any]:
        return self._dict

    @cached_property
    def _dict(self) -> FrozenDict:
        # the rows are never changed in place (add() makes new ones): built once
        counts = self.rows[:, :3].astype(np.int64).tolist()
        sums = self.rows[:, 3:].tolist()
        rows = [c + s for c, s in zip(counts, sums, strict=True)]
        return FrozenDict(
            blocks=rows[1:], no_unit=rows[0], distinct=self.distinct.astype(np.int64).tolist()
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UnitSummary:
        """Strict: a malformed summary is a ValueError, never a half-read one."""
        blocks = data.get("blocks")
        if not isinstance(blocks, list) or len(blocks) != UNIT_BLOCKS:
            raise ValueError(f"unit blocks: expected {UNIT_BLOCKS} rows")
        distinct = data.get("distinct") or []
        if not isinstance(distinct, list) or len(distinct) > DISTINCT_K:
            raise ValueError(f"distinct units: at most {DISTINCT_K} hashes")
        hashes = [int(h) for h in distinct]
        if any(not 0 < h < _U32 for h in hashes):
            raise ValueError("distinct units: hashes are 32-bit and non-zero")
        rows = [_row(data.get("no_unit")), *(_row(b) for b in blocks)]
        return cls(np.array(rows, dtype=np.float64), np.array(sorted(set(hashes)), dtype=np.uint32))


def _row(raw: Any) -> list[float]:
    if not isinstance(raw, (list, tuple)) or len(raw) != BLOCK_COLUMNS:
        raise ValueError(f"a unit block is {BLOCK_COLUMNS} numbers")
    count, failures, above = (int(v) for v in raw[:3])
    if count < 0 or not 0 <= failures <= count or not 0 <= above <= count:
        raise ValueError("a unit block's counts are out of range")
    log_sum, log_sq = float(raw[3]), float(raw[4])
    if not (math.isfinite(log_sum) and math.isfinite(log_sq)):
        raise ValueError("a unit block's log sums are not finite")
    return [count, failures, above, log_sum, log_sq]


@dataclass(frozen=True)
class Concentration:
    """How much of a window its heaviest units make, from a uniform sample of requests."""

    sampled: int
    top: tuple[tuple[int, float], ...]  # (unit hash, share of the sample)
    effective_units: float | None  # 1 / sum of squared unit shares; None: no repeat seen

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampled": self.sampled,
            "top_units": [{"unit": f"{u:08x}", "share": s} for u, s in self.top],
            "effective_units": self.effective_units,
        }


def concentration(units: Sequence[int], count: int, top: int = 5) -> Concentration:
    """Top units' shares and the effective number of units (Kish: N² / Σ n_u²).

    `units` is a uniform sample without replacement of the window's `count` samples'
    units (0: no unit, each such sample its own unit). Two sampled requests share a
    unit with probability Σ n_u(n_u - 1) / (N(N - 1)), estimated by the sample's
    repeated pairs, which gives Σ n_u² and so N² / Σ n_u².
    """
    m = len(units)
    if m == 0:
        return Concentration(0, (), None)
    tally = Counter(units)
    tally.pop(0, None)  # samples without a unit are each their own
    shares = tuple((int(u), c / m) for u, c in tally.most_common(top))
    pairs = float(sum(c * (c - 1) for c in tally.values()))
    if m < 2 or count < 2 or pairs == 0:
        return Concentration(m, shares, None)
    sum_sq = count * (count - 1) * pairs / (m * (m - 1)) + count
    return Concentration(m, shares, count * count / sum_sq)
