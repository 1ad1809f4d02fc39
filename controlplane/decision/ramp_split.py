"""The split judged on units across the whole ramp, not one step at a time.

A unit's arm is `bucket < canary_bp` (architecture §9), its bucket uniform on
0..9999 and independent of when the unit is active. So what the rollout has seen of
a unit narrows its bucket to an interval [lo, hi): seen in the baseline at weight w,
bucket >= w; seen in the canary at w, bucket < w. The next sighting at a weight w
strictly inside the interval is a Bernoulli event, "in the canary", with the
predictable probability (w - lo) / (hi - lo); a sighting at w <= lo or w >= hi
teaches nothing (its arm is known) unless it contradicts the interval. On a monotone
ramp the first sighting is in the canary with probability w, and a unit seen in the
baseline at w1 is in the canary at w2 with probability (w2 - w1) / (1 - w1); any
other sequence of weights (a cut, a probe) is the same rule.

Which units are seen, and when, is independent of their buckets when the assignment
is sound, so under that hypothesis the events form a martingale whatever the
activity (heavy users, users who come and go). When the canary loses units (a crash
on login: their requests never reach it) the units that should have been seen in the
canary are missing, and the canary's events fall short of their expectation. The
verdict is an always-valid mixture likelihood-ratio test over an odds-ratio shift
(decision 0012): it may be looked at after every window, for the whole rollout.

The same ledger keeps, per unit, the lowest and highest weight it was seen at and in
how many settled windows, and the seconds of settled windows fed at each weight
(0% and 100% included): what the loss test (unit_loss.py) judges at the end of each
step of the schedule, where the absences are.

Memory is bounded: the first `LEDGER_UNITS` units are followed (admitted in hash
order within a window, never by arm, so which units are followed is independent of
their buckets), later ones only counted. A window's units are read from both arms'
bottom-k sketches (controlplane/kernel/units.py): only hashes up to the k-th
smallest of their union are known in both arms, and that bound depends on which
units were active, not on their arms.
"""

from __future__ import annotations

import base64
import itertools
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.decision import unit_loss
from controlplane.decision.stats import SRM_P_VALUE
from controlplane.kernel.json_text import FrozenDict
from controlplane.kernel.routes import TOTAL_WEIGHT
from controlplane.kernel.units import DISTINCT_K, bottom_distinct

# units whose bucket interval is followed; 8 bytes each in the rollout state
LEDGER_UNITS = 4096
# the alternatives mixed in the always-valid test: the odds of "in the canary" times
# these factors, equally weighted (a lost tenth of the canary's units is about 0.9)
ODDS_RATIOS: tuple[float, ...] = (
    0.5,
    0.7,
    0.8,
    0.9,
    0.95,
    1 / 0.95,
    1 / 0.9,
    1 / 0.8,
    1 / 0.7,
    2.0,
)
# the state's numbers are bounded: a hostile or corrupted state is refused, not read
_MAX_EVENTS = 2**53
# distinct weights whose windows the loss test's exposure table keeps; windows at a
# weight beyond them are not fed to it (a schedule has a handful of weights)
MAX_WEIGHTS = 64
# step ends judged by the loss test, remembered to judge each step's end once
MAX_LOOKS = 256
_SEEN_MAX = 2**16 - 1

U32 = npt.NDArray[np.uint32]
U16 = npt.NDArray[np.uint16]
F64 = npt.NDArray[np.float64]


def _u16() -> U16:
    return np.zeros(0, dtype=np.uint16)


def _increasing(values: npt.NDArray[Any]) -> bool:
    return values.ndim == 1 and bool(np.all(values[1:] > values[:-1]))


def _isin(values: npt.NDArray[Any], among: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """np.isin(values, among, assume_unique=True), by binary search where both are
    strictly increasing (the sketches and the ledger are): the same answer, without
    isin's sort of both. Anything else goes to np.isin as before."""
    if not (
        values.dtype == among.dtype
        and values.shape[0]
        and among.shape[0]
        and _increasing(values)
        and _increasing(among)
    ):
        found: npt.NDArray[np.bool_] = np.isin(values, among, assume_unique=True)
        return found
    at = np.minimum(np.searchsorted(among, values), among.shape[0] - 1)
    hit: npt.NDArray[np.bool_] = among[at] == values
    return hit


@dataclass(frozen=True, eq=False)
class RampSplit:
    """Every followed unit's bucket interval, and the ramp's event sums.

    `hashes` is sorted and distinct; `lo[i] <= bucket < hi[i]` for the unit
    `hashes[i]`. `log_terms[j]` is Σ ln(1 + p (ψ_j - 1)) over the events, the
    normaliser of the likelihood ratio for the odds ratio ψ_j = ODDS_RATIOS[j].
    `bottom[i]`, `top[i]`: the lowest and highest weight the unit was seen at,
    `seen[i]` in how many settled windows; `exposure`: (weight, windows, seconds) of
    the settled windows fed, sorted by weight.
    """

    hashes: U32 = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))
    lo: U16 = field(default_factory=_u16)
    hi: U16 = field(default_factory=_u16)
    bottom: U16 = field(default_factory=_u16)
    top: U16 = field(default_factory=_u16)
    seen: U16 = field(default_factory=_u16)
    exposure: tuple[tuple[int, int, float], ...] = ()
    events: int = 0
    canary_events: int = 0
    expected: float = 0.0  # Σ p
    variance: float = 0.0  # Σ p (1 - p)
    log_terms: tuple[float, ...] = (0.0,) * len(ODDS_RATIOS)
    windows: int = 0
    # units seen in both arms of one window, or in an arm their interval rules out
    inconsistent: int = 0
    # sightings of units that came after the ledger was full
    not_followed: int = 0
    # the test crossed its level once: an always-valid rejection stands
    mismatch: bool = False
    # which test rejected first: "ramp" (the always-valid one) or "loss" (unit_loss.py)
    decided_by: str | None = None
    # the step indices whose end the loss test judged, and its last look
    judged_steps: tuple[int, ...] = ()
    loss: unit_loss.LossResult | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RampSplit):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.hashes.tobytes())

    @property
    def units(self) -> int:
        return int(self.hashes.shape[0])

    def observe(
        self,
        baseline: U32,
        canary: U32,
        canary_bp: int,
        *,
        seconds: float = 1.0,
        k: int = DISTINCT_K,
    ) -> RampSplit:
        """Add one settled window of `seconds` at `canary_bp`: each arm's bottom-k unit
        sketch.

        At 0% and 100% every unit's arm is known, so nothing is judged and no unit is
        admitted; the followed units' sightings still count for the loss test.
        """
        w = canary_bp
        judged = 0 < w < TOTAL_WEIGHT
        weights = [e[0] for e in self.exposure]
        tracked = w in weights or len(weights) < MAX_WEIGHTS
        if not (judged or tracked):
            return self
        # the bottom k of the union: each arm's sketch holds every one of these that
        # is in that arm (a full arm's largest hash is at least the union's k-th)
        union = bottom_distinct([baseline, canary], k)
        in_c = _isin(union, canary)
        in_b = _isin(union, baseline)
        both = in_c & in_b
        seen, in_c = union[~both], in_c[~both]
        if judged:
            hashes, lo, hi, bottom, top, count, not_followed = self._admit(seen)
        else:
            hashes, lo, hi, bottom, top, count = self._ledger()
            not_followed = 0
        at = np.searchsorted(hashes, seen)
        followed = _isin(seen, hashes)
        at, x = at[followed], in_c[followed]
        lo_at, hi_at = lo[at].astype(np.int64), hi[at].astype(np.int64)
        contradicts = (x & (w <= lo_at)) | (~x & (w >= hi_at))
        informative = (lo_at < w) & (w < hi_at)
        p: F64 = (w - lo_at[informative]) / (hi_at[informative] - lo_at[informative])
        hit = x[informative]
        ok = ~contradicts
        lo, hi = lo.copy(), hi.copy()
        lo[at[ok & ~x]] = np.maximum(lo_at[ok & ~x], w).astype(np.uint16)
        hi[at[ok & x]] = np.minimum(hi_at[ok & x], w).astype(np.uint16)
        exposure = self.exposure
        if tracked:
            bottom, top, count = bottom.copy(), top.copy(), count.copy()
            mine = at[ok]
            bottom[mine] = np.minimum(bottom[mine], w)
            top[mine] = np.maximum(top[mine], w)
            count[mine] = np.minimum(count[mine].astype(np.int64) + 1, _SEEN_MAX)
            exposure = _add_window(exposure, w, seconds)
        psi = np.asarray(ODDS_RATIOS)
        terms = np.log1p(np.outer(p, psi - 1.0)).sum(axis=0) if p.shape[0] else np.zeros(psi.size)
        new = replace(
            self,
            hashes=hashes,
            lo=lo,
            hi=hi,
            bottom=bottom,
            top=top,
            seen=count,
            exposure=exposure,
            events=self.events + int(p.shape[0]),
            canary_events=self.canary_events + int(hit.sum()),
            expected=self.expected + float(p.sum()),
            variance=self.variance + float((p * (1.0 - p)).sum()),
            log_terms=tuple(a + float(b) for a, b in zip(self.log_terms, terms, strict=True)),
            windows=self.windows + int(judged),
            inconsistent=self.inconsistent + int(both.sum()) + int(contradicts.sum()),
            not_followed=self.not_followed + not_followed,
        )
        if new.mismatch or new.always_valid_p() >= SRM_P_VALUE:
            return new
        return replace(new, mismatch=True, decided_by=new.decided_by or "ramp")

    def judge_loss(self, step_index: int, steps: int) -> RampSplit:
        """The loss test's look at the end of step `step_index` (0-based) of `steps`.

        Each step's end is judged once (the schedule's alpha is split between its
        step ends, unit_loss.look_alpha); a rejection stands, as the ramp's does.
        """
        if step_index in self.judged_steps or len(self.judged_steps) >= MAX_LOOKS:
            return self
        table = self.exposure
        result = unit_loss.judge(
            self.top.astype(np.int64),
            self.bottom.astype(np.int64),
            self.hi == TOTAL_WEIGHT,
            self.lo == 0,
            self.seen.astype(np.int64),
            np.array([e[0] for e in table], dtype=np.int64),
            np.array([e[1] for e in table], dtype=np.int64),
            np.array([e[2] for e in table], dtype=np.float64),
            look=step_index + 1,
            looks=steps,
        )
        decided_by = self.decided_by
        if result.mismatch and not self.mismatch:
            decided_by = "loss"
        return replace(
            self,
            judged_steps=(*self.judged_steps, step_index),
            loss=result,
            mismatch=self.mismatch or result.mismatch,
            decided_by=decided_by,
        )

    def _ledger(self) -> tuple[U32, U16, U16, U16, U16, U16]:
        """The ledger's columns as they are: hashes, lo, hi, bottom, top, seen."""
        return self.hashes, self.lo, self.hi, self.bottom, self.top, self.seen

    def _admit(self, seen: U32) -> tuple[U32, U16, U16, U16, U16, U16, int]:
        """The ledger with the window's new units added while there is room."""
        known = _isin(seen, self.hashes)
        fresh = seen[~known]
        room = max(LEDGER_UNITS - self.units, 0)
        admitted = fresh[:room]  # hash order: independent of the units' arms
        n = int(admitted.shape[0])
        if not n:
            return (*self._ledger(), int(fresh.shape[0]))
        hashes = np.concatenate([self.hashes, admitted])
        order = np.argsort(hashes, kind="stable")

        def grown(old: U16, value: int) -> U16:
            joined: U16 = np.concatenate([old, np.full(n, value, dtype=np.uint16)])[order]
            return joined

        return (
            hashes[order],
            grown(self.lo, 0),
            grown(self.hi, TOTAL_WEIGHT),
            grown(self.bottom, TOTAL_WEIGHT),  # not seen yet: no lowest weight
            grown(self.top, 0),
            grown(self.seen, 0),
            int(fresh.shape[0]) - n,
        )

    def log_likelihood_ratios(self) -> F64:
        psi = np.asarray(ODDS_RATIOS)
        ratios: F64 = self.canary_events * np.log(psi) - np.asarray(self.log_terms)
        return ratios

    def always_valid_p(self) -> float:
        """1 / the mixture's likelihood ratio, capped at 1.

        Each ψ's likelihood ratio is a nonnegative martingale with mean 1 under a sound
        assignment (the events' p are predictable), so is their average, and by Ville's
        inequality it exceeds 1/alpha at any look with probability at most alpha.
        """
        if not self.events:
            return 1.0
        llr = self.log_likelihood_ratios()
        top = float(llr.max())
        log_mix = top + math.log(float(np.mean(np.exp(llr - top))))
        return float(min(1.0, math.exp(-log_mix)))

    def z(self) -> float | None:
        """(canary events - expected) / sd, for the evidence; None before any event."""
        if self.variance <= 0:
            return None
        return (self.canary_events - self.expected) / math.sqrt(self.variance)

    def to_evidence(self) -> dict[str, Any]:
        return {
            "method": "ramp_bucket_intervals_mixture_lr",
            "units_followed": self.units,
            "windows": self.windows,
            "events": self.events,
            "canary_events": self.canary_events,
            "expected_canary_events": self.expected,
            "variance": self.variance,
            "z": self.z(),
            "always_valid_p": self.always_valid_p(),
            "mismatch": self.mismatch,
            "decided_by": self.decided_by,
            "inconsistent_units": self.inconsistent,
            "not_followed": self.not_followed,
            "loss": self.loss.to_dict() if self.loss is not None else None,
            "loss_looks": len(self.judged_steps),
        }

    def to_dict(self) -> dict[str, Any]:
        return self._dict

    @cached_property
    def _dict(self) -> FrozenDict:
        # the arrays are never changed in place (each look makes a new value)
        packed = (
            self.hashes.astype("<u4").tobytes()
            + self.lo.astype("<u2").tobytes()
            + self.hi.astype("<u2").tobytes()
        )
        activity = (
            self.bottom.astype("<u2").tobytes()
            + self.top.astype("<u2").tobytes()
            + self.seen.astype("<u2").tobytes()
        )
        return FrozenDict({
            "units": base64.b64encode(packed).decode("ascii"),
            "activity": base64.b64encode(activity).decode("ascii"),
            "exposure": [list(e) for e in self.exposure],
            "judged_steps": list(self.judged_steps),
            "loss": self.loss.to_dict() if self.loss is not None else None,
            "decided_by": self.decided_by,
            "events": self.events,
            "canary_events": self.canary_events,
            "expected": self.expected,
            "variance": self.variance,
            "log_terms": list(self.log_terms),
            "windows": self.windows,
            "inconsistent": self.inconsistent,
            "not_followed": self.not_followed,
            "mismatch": self.mismatch,
        })

    @classmethod
    def from_dict(cls, data: Any) -> RampSplit:
        """Strict: a malformed ledger is a ValueError, never a half-read one."""
        if not isinstance(data, dict):
            raise ValueError("a ramp split is an object")
        raw = data.get("units", "")
        if not isinstance(raw, str) or len(raw) > 4 * (8 * LEDGER_UNITS + 2) // 3 + 4:
            raise ValueError(f"ramp split units: at most {LEDGER_UNITS} units")
        try:
            packed = base64.b64decode(raw.encode("ascii"), validate=True)
        except (ValueError, UnicodeEncodeError) as exc:
            raise ValueError("ramp split units: not base64") from exc
        if len(packed) % 8 or len(packed) // 8 > LEDGER_UNITS:
            raise ValueError("ramp split units: 8 bytes a unit, at most LEDGER_UNITS")
        n = len(packed) // 8
        hashes = np.frombuffer(packed[: 4 * n], dtype="<u4").astype(np.uint32)
        lo = np.frombuffer(packed[4 * n : 6 * n], dtype="<u2").astype(np.uint16)
        hi = np.frombuffer(packed[6 * n :], dtype="<u2").astype(np.uint16)
        if n and (hashes[0] == 0 or np.any(np.diff(hashes.astype(np.int64)) <= 0)):
            raise ValueError("ramp split units: hashes are non-zero, sorted and distinct")
        if np.any(lo >= hi) or np.any(hi > TOTAL_WEIGHT):
            raise ValueError("ramp split units: every interval is 0 <= lo < hi <= 10000")
        counts = [_count(data, key) for key in ("events", "canary_events", "windows")]
        counts += [_count(data, key) for key in ("inconsistent", "not_followed")]
        if counts[1] > counts[0]:
            raise ValueError("ramp split: more canary events than events")
        expected, variance = _finite(data, "expected"), _finite(data, "variance")
        terms = data.get("log_terms")
        if not isinstance(terms, list) or len(terms) != len(ODDS_RATIOS):
            raise ValueError(f"ramp split log_terms: {len(ODDS_RATIOS)} numbers")
        log_terms = tuple(_number(v, "log_terms") for v in terms)
        mismatch = data.get("mismatch", False)
        if not isinstance(mismatch, bool):
            raise ValueError("ramp split mismatch: a boolean")
        bottom, top, seen = _activity(data.get("activity"), n)
        decided_by = data.get("decided_by")
        if decided_by not in (None, "ramp", "loss"):
            raise ValueError("ramp split decided_by: ramp, loss or null")
        loss = data.get("loss")
        return cls(
            hashes=hashes,
            lo=lo,
            hi=hi,
            bottom=bottom,
            top=top,
            seen=seen,
            exposure=_exposure(data.get("exposure", [])),
            judged_steps=_judged(data.get("judged_steps", [])),
            loss=unit_loss.LossResult.from_dict(loss) if loss is not None else None,
            decided_by=decided_by,
            events=counts[0],
            canary_events=counts[1],
            expected=expected,
            variance=variance,
            log_terms=log_terms,
            windows=counts[2],
            inconsistent=counts[3],
            not_followed=counts[4],
            mismatch=mismatch,
        )


def _add_window(
    table: tuple[tuple[int, int, float], ...], weight: int, seconds: float
) -> tuple[tuple[int, int, float], ...]:
    """The exposure table with one more window of `seconds` at `weight`."""
    seconds = max(float(seconds), 0.0)
    rows = {w: (n, s) for w, n, s in table}
    n, s = rows.get(weight, (0, 0.0))
    rows[weight] = (n + 1, s + seconds)
    return tuple((w, n, s) for w, (n, s) in sorted(rows.items()))


def _activity(raw: Any, n: int) -> tuple[U16, U16, U16]:
    """Each unit's lowest and highest weight seen and its window count; a ledger
    stored before they were kept reads as units never seen (the loss test skips them)."""
    if raw is None:
        return (
            np.full(n, TOTAL_WEIGHT, dtype=np.uint16),
            np.zeros(n, dtype=np.uint16),
            np.zeros(n, dtype=np.uint16),
        )
    if not isinstance(raw, str) or len(raw) > 4 * (6 * LEDGER_UNITS + 2) // 3 + 4:
        raise ValueError("ramp split activity: 6 bytes a unit")
    try:
        packed = base64.b64decode(raw.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise ValueError("ramp split activity: not base64") from exc
    if len(packed) != 6 * n:
        raise ValueError("ramp split activity: 6 bytes for each unit")
    bottom = np.frombuffer(packed[: 2 * n], dtype="<u2").astype(np.uint16)
    top = np.frombuffer(packed[2 * n : 4 * n], dtype="<u2").astype(np.uint16)
    seen = np.frombuffer(packed[4 * n :], dtype="<u2").astype(np.uint16)
    if np.any(bottom > TOTAL_WEIGHT) or np.any(top > TOTAL_WEIGHT):
        raise ValueError("ramp split activity: weights within 0..10000")
    if np.any((seen > 0) & (bottom > top)):
        raise ValueError("ramp split activity: a unit's lowest weight above its highest")
    return bottom, top, seen


def _exposure(raw: Any) -> tuple[tuple[int, int, float], ...]:
    if not isinstance(raw, list) or len(raw) > MAX_WEIGHTS:
        raise ValueError(f"ramp split exposure: at most {MAX_WEIGHTS} weights")
    rows: list[tuple[int, int, float]] = []
    for row in raw:
        if not isinstance(row, list) or len(row) != 3:
            raise ValueError("ramp split exposure: [weight, windows, seconds] rows")
        weight, windows = row[0], row[1]
        for value in (weight, windows):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError("ramp split exposure: integer weight and windows")
        if not 0 <= weight <= TOTAL_WEIGHT or not 0 < windows < _MAX_EVENTS:
            raise ValueError("ramp split exposure: a weight in 0..10000, windows > 0")
        seconds = _number(row[2], "exposure")
        if seconds < 0:
            raise ValueError("ramp split exposure: seconds not negative")
        rows.append((weight, windows, seconds))
    if any(a[0] >= b[0] for a, b in itertools.pairwise(rows)):
        raise ValueError("ramp split exposure: sorted by weight, each weight once")
    return tuple(rows)


def _judged(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_LOOKS:
        raise ValueError(f"ramp split judged_steps: at most {MAX_LOOKS} step indices")
    if any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**31 for v in raw):
        raise ValueError("ramp split judged_steps: step indices")
    if len(set(raw)) != len(raw):
        raise ValueError("ramp split judged_steps: each step once")
    return tuple(raw)


def _count(data: dict[str, Any], key: str) -> int:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_EVENTS:
        raise ValueError(f"ramp split {key}: a count")
    return value


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"ramp split {key}: a number")
    number = float(value)
    if not math.isfinite(number) or abs(number) > _MAX_EVENTS:
        raise ValueError(f"ramp split {key}: a finite number")
    return number


def _finite(data: dict[str, Any], key: str) -> float:
    number = _number(data.get(key, 0.0), key)
    if number < 0:
        raise ValueError(f"ramp split {key}: not negative")
    return number
