"""`canary bench decision`: false trips in A/A and detection time, on a simulated clock.

Traffic is simulated per request (Poisson arrivals, lognormal response times,
Bernoulli failures). A window here is exact over the samples visible to a collector
(each one `SAMPLE_LAG_SEC` after it happened), so what is measured is the decision
core alone: route propagation to the sidecars comes on top.

(a) A/A: baseline and canary identical; full step schedules, `decide` every 250 ms as
    the controller calls it (the rule's window and the fast window, both from the
    same samples); a run with any trip is a false trip.
(b) Detection: the canary at 100 req/s degrades at a known instant during a step
    with the A/A runs' hold; the time from the onset to the decision that cuts its
    weight.
(c) Flagger-style reference on the same traffic: a threshold check every 60 s over a
    60-s window, rollback after 5 failed checks.
(d) Clustered A/A: the same schedules and looks as (a), but the requests come from a
    population of users with heavy-tailed request shares, sticky assignment and
    per-user latency and failure effects (identical in both arms), as real traffic
    does; the decision core judges it on units (decision 0012).
(e) Heavy users: (d)'s A/A over a sweep of the skew - users, Zipf exponent, per-user
    latency spread - where a few users carry most of the requests (decision 0050):
    false trips, and the share promoted within the schedule's time plus a bounded
    margin.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from controlplane.decision import (
    BreakerState,
    EventKind,
    ExperimentState,
    RolloutState,
    SetCanaryWeight,
    Step,
    decide,
    start,
)
from controlplane.decision.rollout import fast_window_sec
from controlplane.decision.tally import Tally
from controlplane.kernel.routes import BASELINE, CANARY, TOTAL_WEIGHT
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.units import UNIT_BLOCKS, UnitSummary, block_of, bottom_distinct

F64 = npt.NDArray[np.float64]

EVAL_INTERVAL_SEC = 0.25
SAMPLE_LAG_SEC = 0.1  # sidecar batch delay (<= 50 ms) plus the collector's read
ROUTE_DELAY_SEC = 0.5  # a route write reaches the sidecars' assignment
RESERVOIR_SIZE = 512  # as the collector's window reservoir
PERCENTILES = (0.5, 0.9, 0.95, 0.99, 0.999)

MEDIAN_MS = 100.0
SIGMA = 0.5
ERROR_RATE = 0.005
TOTAL_RPS = 200.0
# 1.25 x the healthy P95, as the rule recommendation proposes it
THRESHOLD_MS = round(1.25 * MEDIAN_MS * math.exp(1.6449 * SIGMA))

RULE = BreakerRule(
    service="bench",
    threshold_ms=THRESHOLD_MS,
    window_sec=10,
    failure_ratio=0.02,
    cooldown_sec=60,
    percentile=95,
    min_samples=100,
    consecutive_breaches=2,
    alpha=0.01,
)
BASELINE_RULE = BreakerRule.model_validate(
    {**RULE.model_dump(), "compare": "baseline", "baseline_margin": 1.2}
)

# a 100% step has no baseline left to compare with: in baseline mode promotion
# itself moves the last half of the traffic
ABSOLUTE_STEPS = (Step(1, 60), Step(5, 60), Step(25, 60), Step(50, 60), Step(100, 60))
BASELINE_STEPS = ABSOLUTE_STEPS[:-1]

SCENARIOS: dict[str, tuple[float, float]] = {
    # name: (latency factor, canary failure probability after the onset)
    "latency_x2": (2.0, ERROR_RATE),
    "latency_x5": (5.0, ERROR_RATE),
    "latency_x10": (10.0, ERROR_RATE),
    "failures_5pct": (1.0, 0.05),
    "failures_20pct": (1.0, 0.20),
}
DETECTION_CANARY_BP = 5000  # 100 of 200 req/s
DETECTION_HOLD_SEC = 60.0
FLAGGER_INTERVAL_SEC = 60.0
FLAGGER_THRESHOLD = 5

# (d) clustered traffic. The request-level marginal (per-request RT and failure
# chance, averaged over the population) is the independent traffic's, so the only
# difference from (a) is that requests share their user's effects and arm.
# A few thousand active users over a rollout's minutes: enough that the 1% step holds
# about 50 of them, few enough that each user makes many requests.
CLUSTER_USERS = 5_000
# request share of the user of rank k proportional to 1/k (Zipf, the classic fit of
# requests per client): the top user makes 11% of the requests, the top 10 32%, the
# top 100 57% (1 / sum of squared shares: 50 "effective" users) - a few heavy clients
# (integrations, bots, power users) that end up wholly in one arm.
CLUSTER_ZIPF_EXPONENT = 1.0
# per-user multiplicative latency factor, lognormal with median 1: a slow account or
# region is 1.35x at one sigma, 1.8x at two
CLUSTER_USER_SIGMA = 0.3
# per-request spread within a user, chosen so the population's per-request latency is
# still lognormal(MEDIAN_MS, SIGMA): 0.3^2 + 0.4^2 = 0.5^2 (the rule's threshold keeps
# its meaning, 1.25 x the healthy P95)
CLUSTER_REQUEST_SIGMA = math.sqrt(SIGMA**2 - CLUSTER_USER_SIGMA**2)
# the heavy-user sweep's users never spread their own requests less than this
HEAVY_MIN_REQUEST_SIGMA = 0.2
# a small fraction of users have a broken client or account that fails half of its
# requests: 0.2%, about 10 of 5,000, so one of the 10 heaviest users is broken in about
# 2 runs in 100
CLUSTER_BROKEN_SHARE = 0.002
CLUSTER_BROKEN_ERROR_RATE = 0.5
# everyone else fails a little less than ERROR_RATE, so that the population's expected
# failure rate is ERROR_RATE (0.4% + 0.2% x 50% = 0.5%)
CLUSTER_USER_ERROR_RATE = (ERROR_RATE - CLUSTER_BROKEN_SHARE * CLUSTER_BROKEN_ERROR_RATE) / (
    1 - CLUSTER_BROKEN_SHARE
)
CLUSTERED_SEED = 3_000  # clustered A/A runs draw their seeds from here (A/A: 1_000)
CLUSTER_EXPONENTS = (1.0, 0.8)
# a real sample ratio mismatch: this share of the canary's users never reach it
SRM_LOST_SHARE = 0.10
SRM_SEED = 20_000
# on clustered traffic, the canary degrades at half of the users
CLUSTERED_SCENARIOS = ("latency_x2", "failures_5pct")

# (e) heavy users: A/A over a sweep of the skew, (users, Zipf exponent, per-user
# latency sigma). The headline cell is the shape that false-tripped and stalled: a few
# thousand users, the heaviest making about a fifth of all requests (22%), each user
# with a latency level of its own; the other cells span the sweep's corners.
HEAVY_HEADLINE = (3_000, 1.2, 0.45)
HEAVY_SWEEP = (
    (500, 0.8, 0.2),
    (500, 1.4, 0.6),
    (20_000, 0.8, 0.6),
    (20_000, 1.4, 0.2),
    (3_000, 1.0, 0.6),
    (3_000, 1.4, 0.45),
)
HEAVY_SEED = 40_000
# promoted "in time": within the schedule's time plus this many times it (a step gate
# held on units waits at most one more hold: decision/gate_deadline.py), plus one
# rule window per step (a gate looks when the next disjoint window is in)
HEAVY_IN_TIME_MARGIN = 1.0


# ---------------------------------------------------------------- simulated traffic


class SimVariant:
    """One variant's samples, time-ordered, with running sums for exact windows."""

    def __init__(self, name: str, threshold_ms: float, capacity: int = 1 << 14) -> None:
        self.name = name
        self.threshold_ms = threshold_ms
        self.n = 0
        self._ts: F64 = np.empty(capacity)
        self._rt: F64 = np.empty(capacity)
        # per sample: unit hash, its unit row (controlplane/kernel/units.py), ln(ms),
        # failed, above the threshold
        self._unit: npt.NDArray[np.uint32] = np.zeros(capacity, dtype=np.uint32)
        self._row: npt.NDArray[np.int64] = np.zeros(capacity, dtype=np.int64)
        self._log: F64 = np.zeros(capacity)
        self._failed: F64 = np.zeros(capacity)
        self._above: F64 = np.zeros(capacity)
        # running sums with a leading zero: a window's count is a difference of two
        self._cum_failed: npt.NDArray[np.int64] = np.zeros(capacity + 1, dtype=np.int64)
        self._cum_above: npt.NDArray[np.int64] = np.zeros(capacity + 1, dtype=np.int64)

    def _grow(self, need: int) -> None:
        size = self._ts.size
        while size < need:
            size *= 2
        if size == self._ts.size:
            return
        for attr, extra in (
            ("_ts", 0), ("_rt", 0), ("_cum_failed", 1), ("_cum_above", 1), ("_unit", 0),
            ("_row", 0), ("_log", 0), ("_failed", 0), ("_above", 0),
        ):  # fmt: skip
            old = getattr(self, attr)
            grown = np.zeros(size + extra, dtype=old.dtype)
            grown[: old.size] = old
            setattr(self, attr, grown)

    def add(
        self,
        ts: F64,
        rt: F64,
        failed: npt.NDArray[np.bool_],
        unit: npt.NDArray[np.uint32] | None = None,
    ) -> None:
        k = ts.size
        if not k:
            return
        self._grow(self.n + k)
        a, b = self.n, self.n + k
        self._ts[a:b] = ts
        self._rt[a:b] = rt
        if unit is not None:
            self._unit[a:b] = unit
            self._row[a:b] = block_of(unit)
        self._log[a:b] = np.log(rt)
        self._failed[a:b] = failed
        self._above[a:b] = rt > self.threshold_ms
        self._cum_failed[a + 1 : b + 1] = self._cum_failed[a] + np.cumsum(failed)
        self._cum_above[a + 1 : b + 1] = self._cum_above[a] + np.cumsum(rt > self.threshold_ms)
        self.n = b

    def _span(self, lo: float, hi: float) -> tuple[int, int]:
        i, j = np.searchsorted(self._ts[: self.n], (lo, hi), side="right")
        return int(i), int(j)

    def snapshot(
        self, lo: float, hi: float, ts: float, window_sec: int, *, reservoir: bool
    ) -> WindowSnapshot:
        i, j = self._span(lo, hi)
        count = j - i
        pcts: list[float | None] = [None] * len(PERCENTILES)
        res: tuple[float, ...] = ()
        if count:
            window = self._rt[i:j]
            # inverted-CDF percentiles (the smallest x with F(x) >= q), as the collector's
            ranks = sorted({max(math.ceil(q * count), 1) - 1 for q in PERCENTILES})
            picked = np.partition(window, ranks)
            pcts = [float(picked[max(math.ceil(q * count), 1) - 1]) for q in PERCENTILES]
            if reservoir:
                stride = max(1, math.ceil(count / RESERVOIR_SIZE))
                res = tuple(window[::stride].tolist())
        units = self._units(i, j)
        res_units: tuple[int, ...] = ()
        if res:
            stride = max(1, math.ceil(count / RESERVOIR_SIZE))
            res_units = tuple(self._unit[i:j:stride].tolist())
        return WindowSnapshot(
            experiment="bench",
            variant=self.name,
            reservoir_units=res_units,
            units=units,
            count=count,
            failures=int(self._cum_failed[j] - self._cum_failed[i]),
            window_sec=window_sec,
            ts=ts,
            window_start=lo,
            window_end=hi,
            p50_ms=pcts[0],
            p90_ms=pcts[1],
            p95_ms=pcts[2],
            p99_ms=pcts[3],
            p999_ms=pcts[4],
            threshold_ms=self.threshold_ms,
            above_threshold=int(self._cum_above[j] - self._cum_above[i]),
            threshold_exact=True,
            reservoir_ms=res,
        )

    def _units(self, i: int, j: int) -> UnitSummary:
        """The window's unit sums, as the collector keeps them (exact ln here)."""
        rows = self._row[i:j]
        size = UNIT_BLOCKS + 1
        logs = self._log[i:j]
        table: F64 = np.column_stack(
            [
                np.bincount(rows, minlength=size).astype(np.float64),
                np.bincount(rows, weights=self._failed[i:j], minlength=size),
                np.bincount(rows, weights=self._above[i:j], minlength=size),
                np.bincount(rows, weights=logs, minlength=size),
                np.bincount(rows, weights=logs * logs, minlength=size),
            ]
        )
        return UnitSummary.from_arrays(table, bottom_distinct([self._unit[i:j]]))

    def counts(self, lo: float, hi: float) -> tuple[int, int, int]:
        """(count, failures, above threshold) over (lo, hi]."""
        i, j = self._span(lo, hi)
        return (
            j - i,
            int(self._cum_failed[j] - self._cum_failed[i]),
            int(self._cum_above[j] - self._cum_above[i]),
        )


@dataclass(frozen=True)
class Degradation:
    onset: float = math.inf
    latency_factor: float = 1.0
    error_rate: float = ERROR_RATE


class Traffic:
    """Requests split by the canary weight in force, generated tick by tick."""

    def __init__(self, rng: np.random.Generator, threshold_ms: float, degrade: Degradation):
        self.rng = rng
        self.degrade = degrade
        self.variants = {
            BASELINE: SimVariant(BASELINE, threshold_ms),
            CANARY: SimVariant(CANARY, threshold_ms),
        }

    def generate(self, t0: float, t1: float, canary_bp: int) -> None:
        share = canary_bp / TOTAL_WEIGHT
        for name, rate in ((CANARY, TOTAL_RPS * share), (BASELINE, TOTAL_RPS * (1 - share))):
            n = int(self.rng.poisson(rate * (t1 - t0))) if rate > 0 else 0
            if not n:
                continue
            ts = np.sort(self.rng.uniform(t0, t1, n))
            rt = self.rng.lognormal(math.log(MEDIAN_MS), SIGMA, n)
            error = np.full(n, ERROR_RATE)
            if name == CANARY:
                bad = ts >= self.degrade.onset
                rt[bad] *= self.degrade.latency_factor
                error[bad] = self.degrade.error_rate
            failed = self.rng.random(n) < error
            # every request from its own unit: independent traffic, as units see it
            unit = self.rng.integers(1, 2**32, n, dtype=np.uint64).astype(np.uint32)
            self.variants[name].add(ts, rt, failed, unit)

    def snapshots(
        self, now: float, rule: BreakerRule, *, reservoir: bool, window_sec: int | None = None
    ) -> dict[str, WindowSnapshot]:
        window = rule.window_sec if window_sec is None else window_sec
        hi = now - SAMPLE_LAG_SEC
        lo = hi - window
        return {
            name: v.snapshot(lo, hi, now, window, reservoir=reservoir)
            for name, v in self.variants.items()
        }

    def fast_snapshots(
        self, now: float, rule: BreakerRule, *, reservoir: bool
    ) -> dict[str, WindowSnapshot] | None:
        """The same data over the fast window, as the controller reads it a second time."""
        fast = fast_window_sec(rule.window_sec)
        if fast is None:
            return None
        return self.snapshots(now, rule, reservoir=reservoir, window_sec=fast)


def request_sigma(user_sigma: float) -> float:
    """The per-request spread within a user, for a per-user spread `user_sigma`.

    The population keeps the independent traffic's lognormal(MEDIAN_MS, SIGMA) while
    the users' spread leaves room for it; past that, each user's own requests keep
    at least HEAVY_MIN_REQUEST_SIGMA and the population spreads wider (the rule's
    threshold follows it: `population_sigma`).
    """
    return math.sqrt(population_sigma(user_sigma) ** 2 - user_sigma**2)


def population_sigma(user_sigma: float) -> float:
    """The per-request log-latency spread of the whole population."""
    return max(SIGMA, math.hypot(user_sigma, HEAVY_MIN_REQUEST_SIGMA))


def zipf_shares(users: int = CLUSTER_USERS, exponent: float = CLUSTER_ZIPF_EXPONENT) -> F64:
    """Each user's share of the requests, heaviest first (they sum to 1)."""
    weights = 1.0 / np.arange(1, users + 1, dtype=np.float64) ** exponent
    shares: F64 = weights / weights.sum()
    return shares


class ClusteredTraffic(Traffic):
    """Requests from a population of users, each sticky to one arm (architecture §8, §9).

    Per run, every user gets a bucket in 0..9999 (a uniform draw standing in for the
    salted hash), a latency factor and a failure probability, all independent of each
    other: the arms differ only in which users they hold, so this is still A/A. A user
    is in the canary iff its bucket is below the canary weight in basis points, as the
    sidecar assigns: at weight w' >= w every canary user of weight w stays there.
    Arrivals are Poisson at TOTAL_RPS; each request's user is drawn by share.
    """

    def __init__(
        self,
        rng: np.random.Generator,
        threshold_ms: float,
        *,
        exponent: float = CLUSTER_ZIPF_EXPONENT,
        degrade: Degradation = Degradation(),
        lost_share: float = 0.0,
        users: int = CLUSTER_USERS,
        user_sigma: float = CLUSTER_USER_SIGMA,
    ) -> None:
        super().__init__(rng, threshold_ms, degrade)
        shares = zipf_shares(users, exponent)
        self.request_sigma = request_sigma(user_sigma)
        self.shares = shares
        self._cdf = np.cumsum(shares)
        self._cdf[-1] = 1.0
        n = shares.size
        self.bucket = rng.integers(0, TOTAL_WEIGHT, n)
        self.latency_factor: F64 = rng.lognormal(0.0, user_sigma, n)
        broken = rng.random(n) < CLUSTER_BROKEN_SHARE
        self.error_rate: F64 = np.where(
            broken, CLUSTER_BROKEN_ERROR_RATE, CLUSTER_USER_ERROR_RATE
        ).astype(np.float64)
        self.unit_hash = rng.integers(1, 2**32, n, dtype=np.uint64).astype(np.uint32)
        # a real SRM: these users' canary requests never reach it (a crash on login)
        self.lost = rng.random(n) < lost_share

    def canary_users(self, canary_bp: int) -> npt.NDArray[np.bool_]:
        """Which users the canary holds at this weight."""
        in_canary: npt.NDArray[np.bool_] = self.bucket < canary_bp
        return in_canary

    def draw(
        self, t0: float, t1: float
    ) -> tuple[F64, npt.NDArray[np.intp], F64, npt.NDArray[np.bool_]]:
        """Requests in (t0, t1): time, user, RT and failed, time-ordered."""
        n = int(self.rng.poisson(TOTAL_RPS * (t1 - t0)))
        ts = np.sort(self.rng.uniform(t0, t1, n))
        user = np.searchsorted(self._cdf, self.rng.random(n), side="right")
        rt = self.rng.lognormal(math.log(MEDIAN_MS), self.request_sigma, n)
        rt *= self.latency_factor[user]
        failed = self.rng.random(n) < self.error_rate[user]
        return ts, user, rt, failed

    def generate(self, t0: float, t1: float, canary_bp: int) -> None:
        ts, user, rt, failed = self.draw(t0, t1)
        canary = self.canary_users(canary_bp)[user]
        bad = canary & (ts >= self.degrade.onset)
        if bad.any():
            rt[bad] *= self.degrade.latency_factor
            # the canary's own failures on top of the user's
            extra = max(self.degrade.error_rate - ERROR_RATE, 0.0)
            failed[bad] |= self.rng.random(int(bad.sum())) < extra
        unit = self.unit_hash[user]
        seen = canary & ~self.lost[user]
        self.variants[CANARY].add(ts[seen], rt[seen], failed[seen], unit[seen])
        baseline = ~canary
        self.variants[BASELINE].add(ts[baseline], rt[baseline], failed[baseline], unit[baseline])


class Controller:
    """The loop around decide(): evaluate every tick, apply route writes after a delay."""

    def __init__(self, rule: BreakerRule, steps: Sequence[Step], state: RolloutState):
        self.rule = rule
        self.steps = steps
        self.state = state
        self.effective_bp = state.canary_bp
        self.pending: list[tuple[float, int]] = []

    def apply(self, effects: Sequence[object], now: float) -> None:
        for a in effects:
            if isinstance(a, SetCanaryWeight):
                self.pending.append((now + ROUTE_DELAY_SEC, a.canary_bp))

    def weight_at(self, now: float) -> int:
        while self.pending and self.pending[0][0] <= now:
            self.effective_bp = self.pending.pop(0)[1]
        return self.effective_bp


# ---------------------------------------------------------------- (a) A/A


def aa_run(args: tuple[str, int, float, bool]) -> dict[str, Any]:
    """One full schedule with identical variants."""
    mode, seed, hold_sec, use_fast = args
    rule = BASELINE_RULE if mode == "baseline" else RULE
    rng = np.random.default_rng(seed)
    return _aa_schedule(mode, Traffic(rng, rule.threshold_ms, Degradation()), hold_sec, use_fast)


def aa_clustered_run(args: tuple[str, int, float, bool, float, float]) -> dict[str, Any]:
    """One full schedule with identical variants, on clustered traffic (d).

    args: mode, seed, hold, fast window, Zipf exponent, share of users the canary
    loses (0 for A/A; > 0 is a real sample ratio mismatch).
    """
    mode, seed, hold_sec, use_fast, exponent, lost = args
    rule = BASELINE_RULE if mode == "baseline" else RULE
    rng = np.random.default_rng(seed)
    traffic = ClusteredTraffic(rng, rule.threshold_ms, exponent=exponent, lost_share=lost)
    return _aa_schedule(mode, traffic, hold_sec, use_fast)


def heavy_rule(mode: str, user_sigma: float) -> BreakerRule:
    """The benchmark's rule for a heavy-user cell: the threshold stays 1.25 x the
    population's healthy P95 when the users spread it wider than SIGMA."""
    rule = BASELINE_RULE if mode == "baseline" else RULE
    spread = population_sigma(user_sigma)
    if spread == SIGMA:
        return rule
    threshold = round(1.25 * MEDIAN_MS * math.exp(1.6449 * spread))
    return rule.model_copy(update={"threshold_ms": threshold})


def aa_heavy_run(args: tuple[str, int, float, int, float, float]) -> dict[str, Any]:
    """One full A/A schedule on the heavy-user sweep's traffic (e).

    args: mode, seed, hold, users, Zipf exponent, per-user latency sigma (the broken
    users of (d) are kept).
    """
    mode, seed, hold_sec, users, exponent, user_sigma = args
    rule = heavy_rule(mode, user_sigma)
    rng = np.random.default_rng(seed)
    traffic = ClusteredTraffic(
        rng, rule.threshold_ms, exponent=exponent, users=users, user_sigma=user_sigma
    )
    out = _aa_schedule(mode, traffic, hold_sec, True, rule)
    in_canary = traffic.canary_users(TOTAL_WEIGHT // 2)
    out["top_user_in_canary_at_50"] = bool(in_canary[0])
    out["top_user_factor"] = float(traffic.latency_factor[0])
    return out


def _aa_schedule(
    mode: str,
    traffic: Traffic,
    hold_sec: float,
    use_fast: bool,
    rule: BreakerRule | None = None,
) -> dict[str, Any]:
    if rule is None:
        rule = BASELINE_RULE if mode == "baseline" else RULE
    steps = tuple(
        replace(s, hold_sec=hold_sec)
        for s in (BASELINE_STEPS if mode == "baseline" else ABSOLUTE_STEPS)
    )
    first = start(steps, 0.0)
    loop = Controller(rule, steps, first.new_state)
    loop.apply(first.effects, 0.0)
    now, trips, srm_events, naive_alarm = 0.0, 0, 0, False
    first_trip: dict[str, Any] | None = None
    last_reason = ""
    limit = 20 * len(steps) * max(hold_sec, rule.window_sec)
    while loop.state.status is ExperimentState.RUNNING and now < limit:
        traffic.generate(now, now + EVAL_INTERVAL_SEC, loop.weight_at(now))
        now += EVAL_INTERVAL_SEC
        reservoir = mode == "baseline"
        snaps = traffic.snapshots(now, rule, reservoir=reservoir)
        fast = traffic.fast_snapshots(now, rule, reservoir=reservoir) if use_fast else None
        before = loop.state
        d = decide(loop.state, snaps, rule, steps, now, fast)
        loop.state = d.new_state
        loop.apply(d.effects, now)
        last_reason = d.reason
        kinds = [e.kind for e in d.events]
        tripped = kinds.count(EventKind.TRIPPED) + kinds.count(EventKind.PROBE_FAILED)
        if tripped and first_trip is None:
            first_trip = _trip_summary(d.evidence, before.canary_bp, now)
        trips += tripped
        srm_events += kinds.count(EventKind.SRM_DETECTED)
        window = d.evidence.get("window", {})
        # what a naive check would do: alarm on any bound exceeded in any window
        if any(g["exceeded"] for g in window.get("guardrails", {}).values()):
            naive_alarm = True

    return {
        "tripped": trips > 0,
        "promoted": loop.state.status is ExperimentState.PROMOTED,
        "duration_s": now,
        "srm_warned": srm_events > 0,
        "naive_alarm": naive_alarm,
        "first_trip": first_trip,
        "status": loop.state.status.value,
        "step_index": loop.state.step_index,
        "last_reason": last_reason,
    }


def _trip_summary(evidence: dict[str, Any], canary_bp: int, now: float) -> dict[str, Any]:
    """Where a trip came from: the weight, and the guardrails breached in either window."""
    breached = sorted(
        {
            name
            for key in ("window", "fast_window")
            for name, g in (evidence.get(key) or {}).get("guardrails", {}).items()
            if g.get("breached")
        }
    )
    return {"at_s": now, "canary_bp": canary_bp, "guardrails": breached}


# ---------------------------------------------------------------- (b) detection


def detection_run(
    args: tuple[str, str, int, bool] | tuple[str, str, int, bool, float],
) -> dict[str, Any]:
    """Steady canary at 100 req/s; degrades at `onset`; seconds to the weight cut.

    A fifth element, a Zipf exponent, runs it on clustered traffic (the canary holds
    half of the users, all of them degraded from the onset).
    """
    mode, scenario, seed, use_fast = args[:4]
    rule = BASELINE_RULE if mode == "baseline" else RULE
    factor, error_rate = SCENARIOS[scenario]
    rng = np.random.default_rng(seed)
    warmup = rule.window_sec + 5.0
    onset = warmup + float(rng.uniform(0, 1))  # random phase against the 250-ms ticks
    degrade = Degradation(onset, factor, error_rate)
    traffic: Traffic
    if len(args) == 5:
        traffic = ClusteredTraffic(rng, rule.threshold_ms, exponent=args[4], degrade=degrade)
    else:
        traffic = Traffic(rng, rule.threshold_ms, degrade)
    # the A/A runs' step hold: the false-alarm budget is the same as theirs (a
    # degraded canary never passes the step gate, so the step does not end)
    steps = (Step(DETECTION_CANARY_BP / 100, DETECTION_HOLD_SEC),)
    state = RolloutState(
        status=ExperimentState.RUNNING,
        breaker=BreakerState.CLOSED,
        step_index=0,
        step_started_at=0.0,
        canary_bp=DETECTION_CANARY_BP,
        weight_since=0.0,
        tally=Tally.starting(0.0),
    )
    now = 0.0
    while now < onset + 120:
        traffic.generate(now, now + EVAL_INTERVAL_SEC, DETECTION_CANARY_BP)
        now += EVAL_INTERVAL_SEC
        if now < rule.window_sec:
            continue
        reservoir = mode == "baseline"
        snaps = traffic.snapshots(now, rule, reservoir=reservoir)
        fast = traffic.fast_snapshots(now, rule, reservoir=reservoir) if use_fast else None
        d = decide(state, snaps, rule, steps, now, fast)
        state = d.new_state
        write = d.route_write
        if write is not None and write.canary_bp < DETECTION_CANARY_BP:
            return {"detected_s": now - onset, "before_onset": now < onset}
    return {"detected_s": None, "before_onset": False}


# ---------------------------------------------------------------- (c) Flagger reference


def flagger_run(args: tuple[str, int]) -> dict[str, Any]:
    """Threshold checks every 60 s over the last 60 s; rollback at the 5th failed check."""
    scenario, seed = args
    factor, error_rate = SCENARIOS[scenario]
    rng = np.random.default_rng(seed)
    phase = float(rng.uniform(0, FLAGGER_INTERVAL_SEC))
    onset = 2 * FLAGGER_INTERVAL_SEC + phase
    traffic = Traffic(rng, RULE.threshold_ms, Degradation(onset, factor, error_rate))
    end = onset + (FLAGGER_THRESHOLD + 3) * FLAGGER_INTERVAL_SEC
    t = 0.0
    while t < end:
        traffic.generate(t, t + 1.0, DETECTION_CANARY_BP)
        t += 1.0
    canary = traffic.variants[CANARY]
    tail = (100 - RULE.percentile) / 100
    failed_checks = 0
    check = FLAGGER_INTERVAL_SEC
    while check <= end:
        count, failures, above = canary.counts(check - FLAGGER_INTERVAL_SEC, check)
        failing = count > 0 and (above > tail * count or failures > RULE.failure_ratio * count)
        failed_checks += int(failing)
        if failed_checks >= FLAGGER_THRESHOLD:
            return {"detected_s": check - onset}
        check += FLAGGER_INTERVAL_SEC
    return {"detected_s": None}


# ---------------------------------------------------------------- running and summing up


def _map(
    fn: Callable[[Any], dict[str, Any]], jobs: Sequence[Any], workers: int
) -> list[dict[str, Any]]:
    if workers <= 1 or len(jobs) < 4:
        return [fn(job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, jobs, chunksize=max(1, len(jobs) // (4 * workers))))


def _rate_with_ci(hits: int, runs: int) -> dict[str, Any]:
    # Clopper-Pearson: with few or no hits the upper bound is what the target is about
    lo = 0.0 if hits == 0 else float(sps.beta.ppf(0.025, hits, runs - hits + 1))
    hi = 1.0 if hits == runs else float(sps.beta.ppf(0.975, hits + 1, runs - hits))
    return {"rate": hits / runs if runs else 0.0, "ci95": [lo, hi]}


def _aa_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    trips = sum(r["tripped"] for r in results)
    promoted = [r["duration_s"] for r in results if r["promoted"]]
    return {
        "runs": len(results),
        "false_trips": trips,
        "false_trip_rate": _rate_with_ci(trips, len(results)),
        "promoted": len(promoted),
        "median_time_to_promote_s": float(np.median(promoted)) if promoted else None,
        "srm_warning_rate": sum(r["srm_warned"] for r in results) / len(results),
        "naive_alarm_rate": sum(r["naive_alarm"] for r in results) / len(results),
    }


def _trip_breakdown(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each run's first trip: at which step weight, on which guardrails."""
    firsts = [r["first_trip"] for r in results if r["first_trip"] is not None]
    by_step: dict[str, int] = {}
    by_guardrail: dict[str, int] = {}
    for t in firsts:
        step = f"{t['canary_bp'] / 100:g}"
        by_step[step] = by_step.get(step, 0) + 1
        key = "+".join(t["guardrails"]) or "other"
        by_guardrail[key] = by_guardrail.get(key, 0) + 1
    return {
        "first_trip_by_canary_pct": dict(sorted(by_step.items(), key=lambda kv: float(kv[0]))),
        "first_trip_by_guardrail": dict(sorted(by_guardrail.items())),
        "rolled_back": sum(r["status"] == ExperimentState.ROLLED_BACK.value for r in results),
        # neither promoted nor rolled back by the end of the run (20 x the schedule's
        # length): a step gate that never passes, since the gate wants every guardrail
        # within its bound, while no look is significant enough to trip
        "stalled": sum(r["status"] == ExperimentState.RUNNING.value for r in results),
    }


def _clustered_parameters(exponent: float) -> dict[str, Any]:
    shares = zipf_shares(exponent=exponent)
    top = np.cumsum(shares)
    return {
        "users": CLUSTER_USERS,
        "request_share": f"zipf(exponent {exponent}) over user rank",
        "top_user_share": float(top[0]),
        "top_10_users_share": float(top[9]),
        "top_100_users_share": float(top[99]),
        "effective_users": float(1.0 / np.sum(shares**2)),
        "assignment": "uniform bucket in 0..9999 per user; canary iff bucket < canary_bp",
        "user_latency_factor": f"lognormal(median 1, sigma {CLUSTER_USER_SIGMA})",
        "request_latency": (
            f"lognormal(median {MEDIAN_MS} ms, sigma {CLUSTER_REQUEST_SIGMA:.4g})"
            " x the user's factor"
        ),
        "broken_user_share": CLUSTER_BROKEN_SHARE,
        "broken_user_error_rate": CLUSTER_BROKEN_ERROR_RATE,
        "user_error_rate": CLUSTER_USER_ERROR_RATE,
        "population_error_rate": ERROR_RATE,
        "seeds_from": CLUSTERED_SEED,
    }


def _times(results: list[dict[str, Any]]) -> dict[str, Any]:
    found = [r["detected_s"] for r in results if r["detected_s"] is not None]
    early = sum(1 for r in results if r.get("before_onset"))
    valid = [t for t in found if t >= 0]
    return {
        "median_s": float(np.median(valid)) if valid else None,
        "p95_s": float(np.percentile(valid, 95)) if valid else None,
        "max_s": float(max(valid)) if valid else None,
        "runs": len(results),
        "detected": len(valid),
        "tripped_before_onset": early,
    }


def _heavy_cell(
    mode: str,
    cell: tuple[int, float, float],
    runs: int,
    hold: float,
    workers: int,
) -> dict[str, Any]:
    users, exponent, sigma = cell
    seeds = range(HEAVY_SEED, HEAVY_SEED + runs)
    results = _map(aa_heavy_run, [(mode, s, hold, users, exponent, sigma) for s in seeds], workers)
    steps = BASELINE_STEPS if mode == "baseline" else ABSOLUTE_STEPS
    schedule = len(steps) * hold
    limit = schedule * (1 + HEAVY_IN_TIME_MARGIN) + len(steps) * RULE.window_sec
    in_time = sum(r["promoted"] and r["duration_s"] <= limit for r in results)
    durations = [r["duration_s"] for r in results if r["promoted"]]
    return {
        **_aa_summary(results),
        **_trip_breakdown(results),
        "promoted_in_time": in_time,
        "promoted_in_time_rate": _rate_with_ci(in_time, len(results)),
        "in_time_limit_s": limit,
        "max_time_to_promote_s": max(durations) if durations else None,
        "tripped_seeds": [s for s, r in zip(seeds, results, strict=True) if r["tripped"]],
    }


def _heavy_users(
    quick: bool, hold: float, workers: int, say: Callable[[str], None]
) -> dict[str, Any]:
    """(e): the headline cell in both modes, the sweep's cells with baseline compare."""
    # 400 at the headline cell (no trip: the 95% upper bound is below 1%), 120 for
    # the rest (no trip: below 3.1%)
    headline_runs = 3 if quick else 400
    absolute_runs = 3 if quick else 120
    sweep_runs = 2 if quick else 120
    cells: list[tuple[str, tuple[int, float, float], int]] = [
        ("baseline", HEAVY_HEADLINE, headline_runs),
        ("absolute", HEAVY_HEADLINE, absolute_runs),
    ]
    cells += [
        ("baseline", cell, sweep_runs) for cell in (HEAVY_SWEEP[:1] if quick else HEAVY_SWEEP)
    ]
    out: dict[str, Any] = {}
    for mode, cell, runs in cells:
        users, exponent, sigma = cell
        key = f"users_{users}_zipf_{exponent:g}_sigma_{sigma:g}"
        say(f"heavy users {key} {mode}: {runs} runs")
        shares = zipf_shares(users, exponent)
        entry = out.setdefault(
            key,
            {
                "users": users,
                "zipf_exponent": exponent,
                "user_latency_sigma": sigma,
                "request_latency_sigma": request_sigma(sigma),
                "threshold_ms": heavy_rule("absolute", sigma).threshold_ms,
                "top_user_share": float(shares[0]),
                "top_10_users_share": float(np.sum(shares[:10])),
                "effective_users": float(1.0 / np.sum(shares**2)),
                "headline": cell == HEAVY_HEADLINE,
            },
        )
        entry[mode] = _heavy_cell(mode, cell, runs, hold, workers)
    return {
        "cells": out,
        "seeds_from": HEAVY_SEED,
        "in_time": (
            f"promoted within the schedule's time x {1 + HEAVY_IN_TIME_MARGIN:g} "
            "+ one rule window per step"
        ),
        "targets": {"false_trip_rate": 0.01, "promoted_in_time_share": 0.97},
    }


# the benchmark's sections, in the order they run (`--only` picks some of them)
SECTIONS = (
    "aa",
    "aa_clustered",
    "srm_clustered",
    "detection_clustered",
    "detection",
    "heavy_users",
    "provider_metric",
)


def parse_sections(only: str | None) -> frozenset[str]:
    """The sections named in `only` (comma-separated), all when None; ValueError on an
    unknown name."""
    if only is None:
        return frozenset(SECTIONS)
    names = {part.strip() for part in only.split(",") if part.strip()}
    unknown = sorted(names - set(SECTIONS))
    if unknown or not names:
        raise ValueError(
            f"unknown section(s) {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(SECTIONS)}"
        )
    return frozenset(names)


def run(
    *, quick: bool, progress: bool, only: str | None = None, workers: int | None = None
) -> dict[str, Any]:
    """All sections, or those named in `only` (comma-separated, from SECTIONS).

    `workers`: processes running the simulations (default: up to 2). The results do
    not depend on it: every run draws from its own seed.

    A partial run returns the keys of its sections (and the run's parameters), to be
    merged into a saved full run (`canary bench decision --only ... --save FILE`).
    """
    began = time.perf_counter()
    sections = parse_sections(only)
    # 400 runs per mode: with no false trip the 95% upper bound is below 1%
    aa_runs = 3 if quick else 400
    hold = 10.0 if quick else 60.0
    # the same count as (a), so the two false-trip rates have the same precision
    clustered_runs = 3 if quick else 400
    detection_runs = 2 if quick else 40
    clustered_detection_runs = 2 if quick else 100
    flagger_runs = 2 if quick else 40
    if workers is None:
        workers = 1 if quick else max(1, min(2, os.cpu_count() or 1))
    if not 1 <= workers <= 64:
        raise ValueError(f"workers {workers} outside 1..64")

    def say(text: str) -> None:
        if progress:
            print(f"[{time.perf_counter() - began:6.1f}s] {text}", file=sys.stderr, flush=True)

    result: dict[str, Any] = {}
    aa: dict[str, Any] = {}
    for mode in ("absolute", "baseline") if "aa" in sections else ():
        say(f"A/A {mode}: {aa_runs} runs")
        results = _map(aa_run, [(mode, 1_000 + i, hold, True) for i in range(aa_runs)], workers)
        aa[mode] = _aa_summary(results)

    by_exponent: dict[float, dict[str, Any]] = {}
    srm_warned = srm_runs = 0
    for exponent in CLUSTER_EXPONENTS if "aa_clustered" in sections else ():
        aa_clustered: dict[str, Any] = {}
        for mode in ("absolute", "baseline"):
            say(f"A/A clustered zipf {exponent} {mode}: {clustered_runs} runs")
            seeds = range(CLUSTERED_SEED, CLUSTERED_SEED + clustered_runs)
            aa_jobs = [(mode, seed, hold, True, exponent, 0.0) for seed in seeds]
            results = _map(aa_clustered_run, aa_jobs, workers)
            aa_clustered[mode] = {**_aa_summary(results), **_trip_breakdown(results)}
            srm_warned += sum(r["srm_warned"] for r in results)
            srm_runs += len(results)
        clustered_trips = sum(m["false_trips"] for m in aa_clustered.values())
        clustered_total = sum(m["runs"] for m in aa_clustered.values())
        aa_clustered["both_modes"] = {
            "runs": clustered_total,
            "false_trips": clustered_trips,
            "false_trip_rate": _rate_with_ci(clustered_trips, clustered_total),
        }
        aa_clustered["traffic"] = _clustered_parameters(exponent)
        by_exponent[exponent] = aa_clustered

    srm_clustered: dict[str, Any] = {}
    if srm_runs:
        # the SRM warnings of the clustered A/A runs are its false warnings
        srm_clustered = {
            "aa_runs": srm_runs,
            "false_warnings": srm_warned,
            "false_warning_rate": _rate_with_ci(srm_warned, srm_runs),
        }
    for exponent in CLUSTER_EXPONENTS if "srm_clustered" in sections else ():
        say(f"real SRM (canary loses {SRM_LOST_SHARE:.0%} of its users), zipf {exponent}")
        seeds = range(SRM_SEED, SRM_SEED + clustered_runs)
        srm_jobs = [("absolute", seed, hold, True, exponent, SRM_LOST_SHARE) for seed in seeds]
        results = _map(aa_clustered_run, srm_jobs, workers)
        found = sum(r["srm_warned"] for r in results)
        srm_clustered[f"real_srm_zipf_{exponent:g}"] = {
            "lost_user_share": SRM_LOST_SHARE,
            "runs": len(results),
            "detected": found,
            "detection_rate": _rate_with_ci(found, len(results)),
        }

    detection_clustered: dict[str, Any] = {}
    for exponent in CLUSTER_EXPONENTS if "detection_clustered" in sections else ():
        for mode, base in (("absolute", 80_000), ("baseline", 90_000)):
            for name in CLUSTERED_SCENARIOS:
                say(
                    f"detection clustered zipf {exponent} {mode} {name}: {clustered_detection_runs}"
                )
                det_jobs = [
                    (mode, name, base + i, True, exponent) for i in range(clustered_detection_runs)
                ]
                key = f"zipf_{exponent:g}"
                detection_clustered.setdefault(key, {}).setdefault(mode, {})[name] = _times(
                    _map(detection_run, det_jobs, workers)
                )

    detection: dict[str, Any] = {}
    detection_baseline: dict[str, Any] = {}
    flagger: dict[str, Any] = {}
    for name in SCENARIOS if "detection" in sections else ():
        say(f"detection {name}: {detection_runs} runs per mode, Flagger {flagger_runs}")
        jobs = [("absolute", name, 50_000 + i, True) for i in range(detection_runs)]
        detection[name] = _times(_map(detection_run, jobs, workers))
        jobs = [("baseline", name, 60_000 + i, True) for i in range(detection_runs)]
        detection_baseline[name] = _times(_map(detection_run, jobs, workers))
        flagger[name] = _times(
            _map(flagger_run, [(name, 70_000 + i) for i in range(flagger_runs)], workers)
        )

    heavy: dict[str, Any] = {}
    if "heavy_users" in sections:
        heavy = _heavy_users(quick, hold, workers, say)

    provider_metric: dict[str, Any] = {}
    if "provider_metric" in sections:
        # a Prometheus-style ratio judged every look beside latency and failures
        # (decision_metrics.py; also `canary bench decision-metrics` on its own)
        from controlplane.benchmarks import decision_metrics

        provider_metric = decision_metrics.run(quick=quick, progress=progress, workers=workers)

    say("done")
    if aa:
        total_runs = sum(m["runs"] for m in aa.values())
        total_trips = sum(m["false_trips"] for m in aa.values())
        result.update(
            aa_runs=total_runs,
            false_trip_rate=total_trips / total_runs,
            false_trip_rate_ci95=_rate_with_ci(total_trips, total_runs)["ci95"],
            aa=aa,
        )
    if by_exponent:
        result["aa_clustered"] = by_exponent[CLUSTER_EXPONENTS[0]]
        result["aa_clustered_zipf_0.8"] = by_exponent[CLUSTER_EXPONENTS[1]]
    if srm_clustered:
        result["srm_clustered"] = srm_clustered
    if heavy:
        result["heavy_users"] = heavy
    if provider_metric:
        result["provider_metric"] = provider_metric
    if detection_clustered:
        result["detection_clustered"] = detection_clustered
    if detection:
        result.update(
            detection=detection,
            detection_baseline_compare=detection_baseline,
            flagger_reference_s=flagger,
        )
    return {
        **result,
        "benchmark": "decision",
        "quick": quick,
        "clock": "simulated",
        "sections": [name for name in SECTIONS if name in sections],
        "rule": RULE.model_dump(mode="json"),
        "rule_baseline_compare": BASELINE_RULE.model_dump(mode="json"),
        "steps_pct": [s.weight_pct for s in ABSOLUTE_STEPS],
        "steps_baseline_compare_pct": [s.weight_pct for s in BASELINE_STEPS],
        "hold_sec": hold,
        "fast_window_sec": fast_window_sec(RULE.window_sec),
        "detection_hold_sec": DETECTION_HOLD_SEC,
        "traffic": {
            "total_rps": TOTAL_RPS,
            "latency": f"lognormal(median {MEDIAN_MS} ms, sigma {SIGMA})",
            "error_rate": ERROR_RATE,
            "detection_canary_rps": TOTAL_RPS * DETECTION_CANARY_BP / TOTAL_WEIGHT,
            "evaluation_interval_s": EVAL_INTERVAL_SEC,
            "sample_lag_s": SAMPLE_LAG_SEC,
            "route_delay_s": ROUTE_DELAY_SEC,
        },
        "flagger": {"interval_s": FLAGGER_INTERVAL_SEC, "threshold": FLAGGER_THRESHOLD},
        "targets": {
            "false_trip_rate": 0.01,
            "p95_detection_s": {"latency_x5": 2.0, "failures_20pct": 2.0},
            "clustered_false_trip_rate": 0.01,
            "clustered_promoted_share": 0.97,
            "srm_false_warning_rate": 0.01,
            "srm_detection_rate": 0.95,
            "clustered_detection_rate": 0.95,
        },
        "elapsed_s": time.perf_counter() - began,
    }
