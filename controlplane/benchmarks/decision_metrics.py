"""`canary bench decision-metrics`: a provider metric judged every look, on a simulated clock.

The cells of `canary bench decision` (A/A false trips, detection time) with a rule
that also carries a Prometheus-style ratio metric (decision 0048, 0049): the
service's own error counter over its request counter, per variant, read every
`interval_sec` as the metric board reads Prometheus (the value between two reads is
the last one read), over the rule's window, and handed to `decide()` at every look
(250 ms) as the controller hands it. The samples' latency and failures are simulated
as in `decision.py` (its `Traffic`), so the family the breaker controls holds three
guardrails: latency, failures and the metric.

(a) A/A: both variants' own error share is `METRIC_ERROR_SHARE` (1 %); the full
    baseline-mode schedule; a run with any trip is a false trip.
(b) Detection: at 50 % canary, the canary's own error share rises to 3 % or 5 %
    while its latency and the samples' failures stay healthy; seconds from the onset
    to the decision that cuts its weight.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from controlplane.benchmarks.decision import (
    BASELINE_RULE,
    BASELINE_STEPS,
    DETECTION_CANARY_BP,
    DETECTION_HOLD_SEC,
    EVAL_INTERVAL_SEC,
    TOTAL_RPS,
    Controller,
    Degradation,
    Traffic,
    _map,
    _rate_with_ci,
)
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
from controlplane.decision.tally import Tally
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.kernel.routes import BASELINE, CANARY, TOTAL_WEIGHT
from controlplane.kernel.rules import BreakerRule
from controlplane.providers.evidence import MetricEvidence, Reading

METRIC_ERROR_SHARE = 0.01
METRIC_SEED = 40_000
DETECTION_SEED = 41_000
INTERVALS = (15.0, 5.0)  # the board's default, and a fast one
DETECTION_SHARES = (0.03, 0.05)
DETECTION_LIMIT_SEC = 120.0  # as decision.py: not cut within this is undetected


def metric_rule(interval_sec: float) -> BreakerRule:
    spec = MetricSpec(
        name="error_ratio",
        kind="ratio",  # type: ignore[arg-type]
        query='sum(increase(app_errors_total{variant="$variant"}[$window]))',
        total_query='sum(increase(app_requests_total{variant="$variant"}[$window]))',
        compare="baseline",  # type: ignore[arg-type]
        margin=0.005,
        interval_sec=interval_sec,
        action="stop",  # type: ignore[arg-type]
    )
    return BreakerRule.model_validate({**BASELINE_RULE.model_dump(), "metrics": [spec]})


class ServiceCounters:
    """The service's own requests and errors per variant, per second (what Prometheus
    would scrape), and the board's reads of them."""

    def __init__(self, rng: np.random.Generator, interval_sec: float, window_sec: int) -> None:
        self.rng = rng
        self.interval = interval_sec
        self.window = window_sec
        self.share = {BASELINE: METRIC_ERROR_SHARE, CANARY: METRIC_ERROR_SHARE}
        self.seconds: dict[str, dict[int, list[int]]] = {BASELINE: {}, CANARY: {}}
        self.next_read = 0.0
        self.latest: dict[str, MetricEvidence] = {}

    def generate(self, t0: float, t1: float, canary_bp: int) -> None:
        share = canary_bp / TOTAL_WEIGHT
        second = int(t0)
        for name, rate in ((CANARY, TOTAL_RPS * share), (BASELINE, TOTAL_RPS * (1 - share))):
            n = int(self.rng.poisson(rate * (t1 - t0))) if rate > 0 else 0
            bad = int(self.rng.binomial(n, self.share[name])) if n else 0
            bucket = self.seconds[name].setdefault(second, [0, 0])
            bucket[0] += bad
            bucket[1] += n

    def read(self, now: float) -> dict[str, MetricEvidence]:
        """The board's evidence at `now`: read afresh when due, else the last read."""
        if now >= self.next_read:
            self.next_read = now + self.interval
            readings = {}
            for name in (BASELINE, CANARY):
                lo = now - self.window
                bad = total = 0
                for second, (b, t) in self.seconds[name].items():
                    if lo <= second < now:
                        bad += b
                        total += t
                readings[name] = (
                    Reading(bad / total, bad=float(bad), total=float(total))
                    if total
                    else Reading.missing("no requests in the window")
                )
            self.latest = {"error_ratio": MetricEvidence(
                "error_ratio", readings[CANARY], readings[BASELINE], read_at=now,
            )}  # fmt: skip
        return self.latest


def aa_run(args: tuple[int, float]) -> dict[str, Any]:
    seed, interval = args
    rule = metric_rule(interval)
    rng = np.random.default_rng(seed)
    traffic = Traffic(rng, rule.threshold_ms, Degradation())
    counters = ServiceCounters(rng, interval, rule.window_sec)
    steps = tuple(replace(s, hold_sec=60.0) for s in BASELINE_STEPS)
    return _schedule(rule, steps, traffic, counters, onset=math.inf, stop_at_cut=False)


def detection_run(args: tuple[int, float, float]) -> dict[str, Any]:
    """As `decision.detection_run`: one step at 50 % with the A/A runs' hold (a
    degraded canary never passes its gate, so the step does not end), the canary's own
    error share rising at `onset`; seconds to the decision that cuts its weight."""
    seed, interval, share = args
    rule = metric_rule(interval)
    rng = np.random.default_rng(seed)
    traffic = Traffic(rng, rule.threshold_ms, Degradation())
    counters = ServiceCounters(rng, interval, rule.window_sec)
    warmup = rule.window_sec + 5.0
    onset = warmup + float(rng.uniform(0, interval))  # any phase against the reads
    steps = (Step(DETECTION_CANARY_BP / 100, DETECTION_HOLD_SEC),)
    state = RolloutState(
        status=ExperimentState.RUNNING, breaker=BreakerState.CLOSED, step_index=0,
        step_started_at=0.0, canary_bp=DETECTION_CANARY_BP, weight_since=0.0,
        tally=Tally.starting(0.0),
    )  # fmt: skip
    now = 0.0
    while now < onset + DETECTION_LIMIT_SEC:
        traffic.generate(now, now + EVAL_INTERVAL_SEC, DETECTION_CANARY_BP)
        if now >= onset:
            counters.share[CANARY] = share
        counters.generate(now, now + EVAL_INTERVAL_SEC, DETECTION_CANARY_BP)
        now += EVAL_INTERVAL_SEC
        if now < rule.window_sec:
            continue
        snaps = traffic.snapshots(now, rule, reservoir=True)
        fast = traffic.fast_snapshots(now, rule, reservoir=True)
        d = decide(state, snaps, rule, steps, now, fast, counters.read(now))
        state = d.new_state
        write = d.route_write
        if write is not None and write.canary_bp < DETECTION_CANARY_BP:
            window = (d.evidence.get("window") or {}).get("guardrails", {})
            return {
                "cut_after_s": now - onset, "before_onset": now < onset,
                "tripped_by": sorted(n for n, g in window.items() if g.get("breached")),
            }  # fmt: skip
    return {"cut_after_s": None, "before_onset": False, "tripped_by": []}


def _schedule(
    rule: BreakerRule, steps: Sequence[Step], traffic: Traffic, counters: ServiceCounters,
    *, onset: float, stop_at_cut: bool, degraded_share: float = METRIC_ERROR_SHARE,
) -> dict[str, Any]:
    """A full schedule, the looks as the controller makes them."""
    first = start(steps, 0.0)
    loop = Controller(rule, steps, first.new_state)
    loop.apply(first.effects, 0.0)
    now, trips, cut_at = 0.0, 0, None
    by: list[str] = []
    limit = sum(s.hold_sec for s in steps) * 3
    if not math.isinf(onset):
        limit = onset + DETECTION_LIMIT_SEC
    while loop.state.status is ExperimentState.RUNNING and now < limit:
        weight = loop.weight_at(now)
        traffic.generate(now, now + EVAL_INTERVAL_SEC, weight)
        if now >= onset:
            counters.share[CANARY] = degraded_share
        counters.generate(now, now + EVAL_INTERVAL_SEC, weight)
        now += EVAL_INTERVAL_SEC
        snaps = traffic.snapshots(now, rule, reservoir=True)
        fast = traffic.fast_snapshots(now, rule, reservoir=True)
        d = decide(loop.state, snaps, rule, steps, now, fast, counters.read(now))
        loop.state = d.new_state
        loop.apply(d.effects, now)
        kinds = [e.kind for e in d.events]
        tripped = kinds.count(EventKind.TRIPPED) + kinds.count(EventKind.PROBE_FAILED)
        if tripped:
            trips += tripped
            window = (d.evidence.get("window") or {}).get("guardrails", {})
            by += sorted(name for name, g in window.items() if g.get("breached"))
        cuts = [a for a in d.effects if isinstance(a, SetCanaryWeight) and a.canary_bp == 0]
        if cuts and cut_at is None and now >= onset:
            cut_at = now
            if stop_at_cut:
                break
    return {
        "tripped": trips > 0,
        "tripped_by": sorted(set(by)),
        "promoted": loop.state.status is ExperimentState.PROMOTED,
        "duration_s": now,
        "cut_after_s": None if cut_at is None or math.isinf(onset) else cut_at - onset,
    }


def run(*, quick: bool, progress: bool, workers: int | None = None) -> dict[str, Any]:
    import sys

    began = time.perf_counter()
    workers = 2 if workers is None else workers
    # quick: every part runs and reports (the suite's smoke); figures come from full runs
    aa_runs = 6 if quick else 400  # 0 in 400: the 95% upper bound is under 1%
    detection_runs = 3 if quick else 40

    def say(text: str) -> None:
        if progress:
            print(f"[decision-metrics] {text}", file=sys.stderr, flush=True)

    result: dict[str, Any] = {
        "benchmark": "decision-metrics", "quick": quick,
        "metric": {"kind": "ratio", "compare": "baseline", "margin": 0.005,
                   "error_share": METRIC_ERROR_SHARE, "window_sec": BASELINE_RULE.window_sec},
        "aa": {}, "detection": {},
    }  # fmt: skip
    for interval in INTERVALS:
        say(f"A/A, metric read every {interval:g} s: {aa_runs} runs")
        runs = _map(aa_run, [(METRIC_SEED + i, interval) for i in range(aa_runs)], workers)
        trips = sum(r["tripped"] for r in runs)
        result["aa"][f"interval_{interval:g}s"] = {
            "runs": aa_runs,
            "false_trips": trips,
            "false_trip_rate": _rate_with_ci(trips, aa_runs),
            "tripped_by": sorted({g for r in runs for g in r["tripped_by"]}),
            "promoted": sum(r["promoted"] for r in runs),
            "median_duration_s": float(np.median([r["duration_s"] for r in runs])),
            "target_false_trip_rate_max": 0.01,
        }
        for share in DETECTION_SHARES:
            say(f"detection {share:.0%}, read every {interval:g} s: {detection_runs} runs")
            jobs = [(DETECTION_SEED + i, interval, share) for i in range(detection_runs)]
            found = _map(detection_run, jobs, workers)
            times = [
                r["cut_after_s"] for r in found
                if r["cut_after_s"] is not None and not r["before_onset"]
            ]  # fmt: skip
            result["detection"][f"share_{share:g}_interval_{interval:g}s"] = {
                "runs": detection_runs,
                "detected": len(times),
                "tripped_by": sorted({g for r in found for g in r["tripped_by"]}),
                "cut_after_s_p50": float(np.median(times)) if times else None,
                "cut_after_s_p95": float(np.percentile(times, 95)) if times else None,
                "cut_after_s_max": max(times) if times else None,
            }
    result["seconds"] = round(time.perf_counter() - began, 1)
    return result


__all__ = ["run"]
