"""`canary bench full-pass`: a trip's route while the leader's reconciler is in a full
pass, the loop shared with rounds that hold it for milliseconds at a time.

N services, each with a running experiment and a breaker rule (what `canary bench
scale` creates), on SQLite and real etcd (CANARY_BENCH_ETCD, default
http://127.0.0.1:2379, a prefix of its own). The leader's reconciler runs its loop
(`RouteReconciler.run`) with a full pass every `FULL_PASS_SEC`; beside it on the same
event loop a stand-in for the rounds holds the loop `LOOK_MS` at a time, as a look at
N = 1,000 does between two yields (by sleeping: the GIL stays free for the SQL).
Trips are committed at random instants, one experiment each (`apply_decision`, which
wakes the reconciler as the controller's commits do), and each is timed from its
commit to its route in etcd.

Both ways in turn in the same run, `TRIPS` trips each: the routes of a commit
announced during a full pass written between its parts (`ahead`, decision 0078) and
after the whole pass (`after_pass`, as before). Reported per way: P50 / P95 / max of
commit → route, the trips committed during a full pass, and the full passes' length;
and before the trips, one full pass's CPU with nothing else running
(`full_pass_cpu_ms`).
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from controlplane.benchmarks.shard_takeover import quantile

DEFAULT_ETCD = "http://127.0.0.1:2379"
N = 1000
QUICK_N = 100
TRIPS = 24
QUICK_TRIPS = 4
FULL_PASS_SEC = 2.0
LOOK_MS = 3.0


async def _rounds_stand_in(stop: asyncio.Event) -> None:
    """Hold the loop LOOK_MS at a time, then yield: what a round's looks do. Held by a
    sleep, not by computing: a thread computing in Python would also keep the GIL from
    the reconciler's SQL thread, which is another cost than the one measured here."""
    while not stop.is_set():
        time.sleep(LOOK_MS / 1000)
        await asyncio.sleep(0)


async def _trip(backends: Any, experiment_id: int, fence: Any) -> float:
    """Commit a trip of `experiment_id`; the instant it was committed."""
    from controlplane.controller.apply import apply_decision
    from controlplane.decision.model import Decision, SetCanaryWeight
    from controlplane.experiments.lifecycle import BreakerState
    from controlplane.experiments.rollout_state import rollout_state_of
    from controlplane.kernel.routes import RouteState
    from controlplane.kernel.rules import BreakerRule

    async with backends.store.transaction() as tx:
        row = await tx.load_experiment(experiment_id=experiment_id)
    now = backends.clock.now()
    state = rollout_state_of(row, now).with_changes(
        breaker=BreakerState.OPEN, canary_bp=0, trips=1, opened_at=now
    )
    decision = Decision(state, (SetCanaryWeight(0, RouteState.TRIPPED),), "bench trip", {},
                        now + 60)  # fmt: skip
    await apply_decision(backends, experiment_id=experiment_id, version=row.version,
                         decision=decision, rule=BreakerRule(service=row.service, threshold_ms=250),
                         fence=fence)  # fmt: skip
    return time.perf_counter()


async def _cut(backends: Any, service: str, timeout: float) -> float | None:
    """When `service`'s route in etcd first sends the canary nothing (polled)."""
    from controlplane.kernel.routes import parse_route

    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        value = await backends.kv.get(backends.keys.route(service))
        if value is not None and parse_route(value.value).weight_of("canary") == 0:
            return time.perf_counter()
        await asyncio.sleep(0.002)
    return None


@dataclass
class _Way:
    """What the trips of one way measured, over its halves of the run."""

    cuts_ms: list[float] = field(default_factory=list)
    during_a_pass: list[bool] = field(default_factory=list)
    passes_s: list[float] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        cuts = self.cuts_ms
        return {
            "trips": len(cuts),
            "committed_during_a_full_pass": sum(self.during_a_pass),
            "commit_to_route_p50_ms": round(quantile(cuts, 0.5), 1),
            "commit_to_route_p95_ms": round(quantile(cuts, 0.95), 1),
            "commit_to_route_max_ms": round(max(cuts), 1),
            "commit_to_route_each_ms": [round(c, 1) for c in cuts],
            "full_pass_s_median": round(statistics.median(self.passes_s), 3),
        }


async def _way(
    backends: Any, fence: Any, made: list[tuple[str, str]], ahead: bool, trips: int,
    rng: random.Random, into: _Way,
) -> None:  # fmt: skip
    """`trips` trips under a reconciler of one way, measured into `into`."""
    from controlplane.controller.reconciler import RouteReconciler

    reconciler = RouteReconciler(full_pass_sec=FULL_PASS_SEC, ahead_of_full_pass=ahead)
    passes = len(into.passes_s)
    in_pass = False
    reconcile = reconciler.reconcile

    async def timed(*args: Any, **kwargs: Any) -> bool:
        nonlocal in_pass
        if kwargs.get("services") is not None:  # a pass woken by a commit
            return await reconcile(*args, **kwargs)
        began, in_pass = time.perf_counter(), True
        try:
            return await reconcile(*args, **kwargs)
        finally:
            in_pass = False
            into.passes_s.append(time.perf_counter() - began)

    reconciler.reconcile = timed  # type: ignore[method-assign]
    stop = asyncio.Event()
    busy = asyncio.create_task(_rounds_stand_in(stop))
    loop = asyncio.create_task(reconciler.run(backends, fence))
    try:
        while len(into.passes_s) == passes:  # the pass on taking the lead
            await asyncio.sleep(0.05)
        for _ in range(trips):
            await asyncio.sleep(rng.uniform(0.2, FULL_PASS_SEC))
            experiment, service = made.pop()
            was_in_pass = in_pass
            committed = await _trip(backends, int(experiment), fence)
            seen = await _cut(backends, service, 30.0)
            if seen is None:
                raise RuntimeError(f"the trip of {service} never reached etcd")
            into.cuts_ms.append((seen - committed) * 1000)
            into.during_a_pass.append(was_in_pass)
    finally:
        stop.set()
        loop.cancel()
        await asyncio.gather(busy, loop, return_exceptions=True)


async def _pass_cpu(backends: Any, fence: Any) -> float:
    """One full pass's CPU with nothing else running, the median of three after a first
    (which writes what etcd lacks): what a leader pays every `full_pass_sec`."""
    from controlplane.controller.reconciler import RouteReconciler

    reconciler = RouteReconciler()
    await reconciler.reconcile(backends, fence)
    cpus = []
    for _ in range(3):
        began = time.process_time()
        await reconciler.reconcile(backends, fence)
        cpus.append((time.process_time() - began) * 1000)
    return round(statistics.median(cpus), 1)


async def _measure(n: int, trips: int, etcd: str, progress: bool) -> dict[str, Any]:
    from controlplane.benchmarks.scale import _create
    from controlplane.db.migrate import upgrade
    from controlplane.kernel.clock import SystemClock
    from controlplane.kernel.settings import Settings
    from controlplane.runtime import open_backends

    prefix = f"/canary-bench-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{scratch}/full-pass.db"
        upgrade(url)
        settings = Settings(database_url=url, etcd=etcd, etcd_prefix=prefix,
                            redis_url="memory://")  # fmt: skip
        backends = await open_backends(settings, clock=SystemClock(), streams=False)
        leadership = backends.kv.leadership(backends.keys.election, identity="bench", ttl=60)
        fence = await leadership.campaign()
        try:
            made = await _create(backends, n, progress)
            rng = random.Random(7)
            rng.shuffle(made)
            result: dict[str, Any] = {"full_pass_cpu_ms": await _pass_cpu(backends, fence)}
            # in turn, a half each, so that the machine's load falls on both alike
            ways = {"ahead": _Way(), "after_pass": _Way()}
            for half in range(2):
                for way, measured in ways.items():
                    await _way(backends, fence, made, way == "ahead", max(1, trips // 2), rng,
                               measured)  # fmt: skip
                    if progress:
                        print(f"  {way} {half + 1}/2: {len(measured.cuts_ms)} trips", flush=True)
            result |= {way: measured.figures() for way, measured in ways.items()}
            return result
        finally:
            await leadership.resign()
            await backends.close()


def run(*, quick: bool = False, progress: bool = True) -> dict[str, Any]:
    n = QUICK_N if quick else N
    trips = QUICK_TRIPS if quick else TRIPS
    etcd = os.environ.get("CANARY_BENCH_ETCD", DEFAULT_ETCD)
    load_before = os.getloadavg()
    result = asyncio.run(_measure(n, trips, etcd, progress))
    return {
        "benchmark": "full-pass",
        "n": n,
        "settings": {"full_pass_sec": FULL_PASS_SEC, "look_ms": LOOK_MS},
        **result,
        "load_avg": {"before": list(load_before), "after": list(os.getloadavg())},
    }
