"""The DDSketch logarithmic mapping: latency in µs → histogram bin, and back.

Every window histogram (a ring's seconds, a window's totals, a merged partial) is
indexed by this mapping; a bin's representative value is within alpha of anything
in it, which is what bounds the error of every percentile the collector reports.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

DEFAULT_ALPHA = 0.01
U32_LIMIT = 2**32

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
U32 = npt.NDArray[np.uint32]


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
        top = math.ceil(math.log(U32_LIMIT) / math.log(self.gamma)) + 1
        self.bins = self.offset + top + 1
        exponents = np.arange(self.bins, dtype=np.float64) - self.offset
        self.representative_us: F64 = 2 * self.gamma**exponents / (self.gamma + 1)
        self.representative_us[: self.offset] = 0.0
        self.representative_ms: F64 = self.representative_us / 1000.0
        # log_ms_sums' coefficients, taken once: it runs for every snapshot made
        a = math.log(self.gamma)
        c = -self.offset * a + math.log(2 / (self.gamma + 1)) - math.log(1000.0)
        self._log_terms = (a, c, a * a, 2 * a * c, c * c)

    def log_ms_sums(self, n: F64, s1: F64, s2: F64) -> tuple[F64, F64]:
        """Σ ln(ms) and Σ ln(ms)² of samples from their bin indices' count, sum and
        sum of squares: each sample stands for its bin's representative value."""
        a, c, aa, two_ac, cc = self._log_terms
        return a * s1 + c * n, aa * s2 + two_ac * s1 + cc * n

    def index(
        self, rt_us: npt.NDArray[np.integer], base: npt.NDArray[np.int32] | None = None
    ) -> I64:
        """Each value's bin; with `base`, each value's bin in a flat histogram of several:
        its bin - offset + base (the base holding its histogram's first bin, plus offset)."""
        x = rt_us.astype(np.float32)
        if rt_us.shape[0] and rt_us.min() <= 0:  # a float max costs 8x an integer min
            np.maximum(x, self._floor, out=x)
        np.log(x, out=x)
        x *= self._scale
        np.ceil(x, out=x)
        # small integers: exact in int32, which float32 converts to in one vector
        # instruction (to int64 it does not)
        bins = x.astype(np.int32)
        if base is None:
            bins += np.int32(self.offset)
        else:
            bins += base
        return bins.astype(np.int64)

    def above_mask(self, threshold_ms: float | None) -> npt.NDArray[np.bool_]:
        """Bins the histogram estimate counts as above threshold_ms."""
        if threshold_ms is None:
            return np.zeros(self.bins, dtype=bool)
        return self.representative_ms > threshold_ms
