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

Memory is bounded: the first `LEDGER_UNITS` units are followed (admitted in hash
order within a window, never by arm, so which units are followed is independent of
their buckets), later ones only counted. A window's units are read from both arms'
bottom-k sketches (controlplane/kernel/units.py): only hashes up to the k-th
smallest of their union are known in both arms, and that bound depends on which
units were active, not on their arms.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.decision.stats import SRM_P_VALUE
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

U32 = npt.NDArray[np.uint32]
U16 = npt.NDArray[np.uint16]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class RampSplit:
    """Every followed unit's bucket interval, and the ramp's event sums.

    `hashes` is sorted and distinct; `lo[i] <= bucket < hi[i]` for the unit
    `hashes[i]`. `log_terms[j]` is Σ ln(1 + p (ψ_j - 1)) over the events, the
    normaliser of the likelihood ratio for the odds ratio ψ_j = ODDS_RATIOS[j].
    """

    hashes: U32 = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))
    lo: U16 = field(default_factory=lambda: np.zeros(0, dtype=np.uint16))
    hi: U16 = field(default_factory=lambda: np.zeros(0, dtype=np.uint16))
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
        self, baseline: U32, canary: U32, canary_bp: int, *, k: int = DISTINCT_K
    ) -> RampSplit:
        """Add one settled window at `canary_bp`: each arm's bottom-k unit sketch."""
        if not 0 < canary_bp < TOTAL_WEIGHT:
            return self  # every unit's arm is known: nothing to learn
        # the bottom k of the union: each arm's sketch holds every one of these that
        # is in that arm (a full arm's largest hash is at least the union's k-th)
        union = bottom_distinct([baseline, canary], k)
        in_c = np.isin(union, canary, assume_unique=True)
        in_b = np.isin(union, baseline, assume_unique=True)
        both = in_c & in_b
        seen, in_c = union[~both], in_c[~both]
        hashes, lo, hi, not_followed = self._admit(seen)
        at = np.searchsorted(hashes, seen)
        followed = np.isin(seen, hashes, assume_unique=True)
        at, x = at[followed], in_c[followed]
        w = canary_bp
        lo_at, hi_at = lo[at].astype(np.int64), hi[at].astype(np.int64)
        contradicts = (x & (w <= lo_at)) | (~x & (w >= hi_at))
        informative = (lo_at < w) & (w < hi_at)
        p: F64 = (w - lo_at[informative]) / (hi_at[informative] - lo_at[informative])
        hit = x[informative]
        ok = ~contradicts
        lo, hi = lo.copy(), hi.copy()
        lo[at[ok & ~x]] = np.maximum(lo_at[ok & ~x], w).astype(np.uint16)
        hi[at[ok & x]] = np.minimum(hi_at[ok & x], w).astype(np.uint16)
        psi = np.asarray(ODDS_RATIOS)
        terms = np.log1p(np.outer(p, psi - 1.0)).sum(axis=0) if p.shape[0] else np.zeros(psi.size)
        new = replace(
            self,
            hashes=hashes,
            lo=lo,
            hi=hi,
            events=self.events + int(p.shape[0]),
            canary_events=self.canary_events + int(hit.sum()),
            expected=self.expected + float(p.sum()),
            variance=self.variance + float((p * (1.0 - p)).sum()),
            log_terms=tuple(a + float(b) for a, b in zip(self.log_terms, terms, strict=True)),
            windows=self.windows + 1,
            inconsistent=self.inconsistent + int(both.sum()) + int(contradicts.sum()),
            not_followed=self.not_followed + not_followed,
        )
        return replace(new, mismatch=new.mismatch or new.always_valid_p() < SRM_P_VALUE)

    def _admit(self, seen: U32) -> tuple[U32, U16, U16, int]:
        """The ledger with the window's new units added while there is room."""
        known = np.isin(seen, self.hashes, assume_unique=True)
        fresh = seen[~known]
        room = max(LEDGER_UNITS - self.units, 0)
        admitted = fresh[:room]  # hash order: independent of the units' arms
        if not admitted.shape[0]:
            return self.hashes, self.lo, self.hi, int(fresh.shape[0])
        hashes = np.concatenate([self.hashes, admitted])
        order = np.argsort(hashes, kind="stable")
        lo = np.concatenate([self.lo, np.zeros(admitted.shape[0], dtype=np.uint16)])
        hi = np.concatenate([self.hi, np.full(admitted.shape[0], TOTAL_WEIGHT, dtype=np.uint16)])
        return hashes[order], lo[order], hi[order], int(fresh.shape[0] - admitted.shape[0])

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
            "inconsistent_units": self.inconsistent,
            "not_followed": self.not_followed,
        }

    def to_dict(self) -> dict[str, Any]:
        packed = (
            self.hashes.astype("<u4").tobytes()
            + self.lo.astype("<u2").tobytes()
            + self.hi.astype("<u2").tobytes()
        )
        return {
            "units": base64.b64encode(packed).decode("ascii"),
            "events": self.events,
            "canary_events": self.canary_events,
            "expected": self.expected,
            "variance": self.variance,
            "log_terms": list(self.log_terms),
            "windows": self.windows,
            "inconsistent": self.inconsistent,
            "not_followed": self.not_followed,
            "mismatch": self.mismatch,
        }

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
        return cls(
            hashes=hashes,
            lo=lo,
            hi=hi,
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
