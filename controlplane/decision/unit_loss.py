"""Units lost by one arm, judged at the ramp's planned looks (decision 0012).

The across-ramp test (ramp_split.py) judges each sighting of a unit given that it
was seen, so it can never use an absence: a unit lost in the canary looks like one
that stopped coming. This test uses the absences, and stays valid for any activity.

Under a sound assignment the units' activity (which settled windows each unit is
seen in, whatever its arm) is independent of their buckets. So given that activity,
each unit's bucket is still uniform, and "never seen in the canary" is a Bernoulli
event with the known probability 1 - top / 10,000, `top` the highest weight the unit
was seen at. Every such unit is an independent term; any weights computed from the
activity alone leave the test exact. The weights are the likelihood ratio of "a
share `LOSS_SHARE` of the units never reach the canary" with each unit's activity
estimated from its own sightings: a unit seen in the baseline in most windows at
50%, and not once in the windows of the 100% step, weighs far more than one seen
once. The weighted sum is judged against its exact mean and variance (a normal
tail; every weight is bounded, so no unit dominates the variance), one-sided in each
direction (the canary short of units, or the baseline).

A fixed-sample test, so it is judged at planned looks only: at the end of each step
of the schedule (known in advance), the schedule's alpha split between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import special as spc

from controlplane.kernel.routes import TOTAL_WEIGHT

# the alternative the weights are tuned to: a tenth of an arm's units never reach it
LOSS_SHARE = 0.1
# a unit's likelihood ratio is capped (at about 1.9 in the log): a bounded weight keeps
# the sum's normal tail honest, and one heavy unit cannot decide alone
LOSS_RATIO_CAP = 50.0
# fewer informative units than this: no verdict (the normal tail needs many terms)
LOSS_MIN_UNITS = 100
# the whole rollout's false-warning budget for this test, both directions together
LOSS_P_VALUE = 0.001

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class LossResult:
    """One look's verdict: the direction with the smaller p, its z and p."""

    short_arm: str  # "canary" or "baseline": the arm the evidence says loses units
    z: float
    p_value: float
    alpha: float
    units: int  # informative units in that direction
    look: int
    mismatch: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": "unit_loss_weighted_bernoulli",
            "short_arm": self.short_arm,
            "z": self.z,
            "p_value": self.p_value,
            "alpha": self.alpha,
            "units": self.units,
            "look": self.look,
            "mismatch": self.mismatch,
        }

    @classmethod
    def from_dict(cls, data: Any) -> LossResult:
        """Strict: a malformed stored look is a ValueError."""
        if not isinstance(data, dict):
            raise ValueError("a loss look is an object")
        short = data.get("short_arm")
        if short not in ("canary", "baseline"):
            raise ValueError("loss short_arm: canary or baseline")
        numbers = []
        for key in ("z", "p_value", "alpha"):
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"loss {key}: a number")
            if not math.isfinite(value) or abs(value) > 1e6:
                raise ValueError(f"loss {key}: a finite number")
            numbers.append(float(value))
        if not (0 <= numbers[1] <= 1 and 0 <= numbers[2] <= 1):
            raise ValueError("loss p_value and alpha: within 0..1")
        counts = []
        for key in ("units", "look"):
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
                raise ValueError(f"loss {key}: a count")
            counts.append(value)
        mismatch = data.get("mismatch")
        if not isinstance(mismatch, bool):
            raise ValueError("loss mismatch: a boolean")
        return cls(short, numbers[0], numbers[1], numbers[2], counts[0], counts[1], mismatch)


def look_alpha(look: int, looks: int) -> float:
    """The share of LOSS_P_VALUE spent at the `look`-th step end (1-based) of `looks`.

    The last step's end holds the absences of the whole ramp (every unit is in the
    canary there), so it gets half; the earlier step ends share the other half.
    """
    if looks <= 1:
        return LOSS_P_VALUE
    if look >= looks:
        return LOSS_P_VALUE / 2
    return LOSS_P_VALUE / 2 / (looks - 1)


def one_direction(
    top: I64, never: npt.NDArray[np.bool_], seen: I64, weights: I64, windows: I64, seconds: F64
) -> tuple[float, int]:
    """(z, informative units) for "units lost in the arm that holds buckets below w".

    `top`: the highest weight each unit was seen at; `never`: it was never seen in
    that arm; `seen`: in how many settled windows it was seen. `weights` (sorted,
    distinct), `windows` and `seconds`: the settled windows fed so far, per weight.
    """
    informative = (top > 0) & (top < TOTAL_WEIGHT)
    top, never, seen = top[informative], never[informative], seen[informative]
    units = int(top.shape[0])
    if units < LOSS_MIN_UNITS or weights.shape[0] == 0:
        return 0.0, units
    at = np.searchsorted(weights, top)  # `top` is a weight some window was fed at
    at = np.minimum(at, weights.shape[0] - 1)
    cum_windows = np.cumsum(windows)
    cum_seconds = np.cumsum(seconds)
    # activity: a unit's chance of being seen in one window, from the windows at
    # weights up to its top (where it could be seen in either hypothesis); Jeffreys
    exposure = cum_windows[at]
    chance = np.minimum((seen + 0.5) / (exposure + 1.0), exposure / (exposure + 1.0))
    mean_sec = cum_seconds[at] / np.maximum(exposure, 1)
    rate = -np.log1p(-chance) / np.maximum(mean_sec, 1e-9)  # per second
    # the seconds of windows at weights above each weight: unseen there, a lost unit's
    # bucket says it would have been in the arm that lost it
    above = float(seconds.sum()) - cum_seconds
    # G = the mean, over the buckets in [top, 10,000), of exp(rate x seconds above the
    # bucket): the segments between consecutive weights above the unit's top
    edges = np.append(weights, TOTAL_WEIGHT).astype(np.float64)
    width = np.diff(edges)  # segment j: buckets in [weights[j], weights[j + 1])
    k = np.arange(weights.shape[0])
    mask = k[None, :] >= at[:, None]
    exponent = np.minimum(rate[:, None] * above[None, :], 50.0)
    ratio = (mask * width[None, :] * np.exp(exponent)).sum(axis=1)
    ratio = np.minimum(ratio / (TOTAL_WEIGHT - top), LOSS_RATIO_CAP)
    weight = np.log1p(LOSS_SHARE / (1 - LOSS_SHARE) * ratio)
    p0 = 1.0 - top / TOTAL_WEIGHT  # never in that arm, under a sound assignment
    variance = float((weight * weight * p0 * (1 - p0)).sum())
    if variance <= 0:
        return 0.0, units
    excess = float((weight * (never - p0)).sum())
    return excess / math.sqrt(variance), units


def judge(
    top: I64,
    bottom: I64,
    never_canary: npt.NDArray[np.bool_],
    never_baseline: npt.NDArray[np.bool_],
    seen: I64,
    weights: I64,
    windows: I64,
    seconds: F64,
    *,
    look: int,
    looks: int,
) -> LossResult:
    """Both directions at one planned look; a mismatch when either is below its half
    of the look's alpha."""
    alpha = look_alpha(look, looks)
    z_c, n_c = one_direction(top, never_canary, seen, weights, windows, seconds)
    # the baseline's loss is the canary's seen in a mirror: bucket 9,999 - b, weight
    # 10,000 - w (the baseline holds the buckets >= w)
    order = np.argsort(TOTAL_WEIGHT - weights, kind="stable")
    z_b, n_b = one_direction(
        TOTAL_WEIGHT - bottom,
        never_baseline,
        seen,
        (TOTAL_WEIGHT - weights)[order],
        windows[order],
        seconds[order],
    )
    short, z, units = ("canary", z_c, n_c) if z_c >= z_b else ("baseline", z_b, n_b)
    p = float(spc.ndtr(-z))
    return LossResult(short, z, p, alpha, units, look, p < alpha / 2)
