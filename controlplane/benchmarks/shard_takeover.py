"""`canary bench shard-takeover`: a controller replica SIGKILLed, its shards judged again.

Sharded controllers (decision 0057) on real PostgreSQL and etcd: R replica processes
(`controlplane/benchmarks/replicas.py`, each a `Controller` with `shards` set, as
`canary serve` runs it) share S shards of N running experiments.
Again and again, one replica holding shards is SIGKILLed; from the kill, the bench
times (polling every 20 ms):

- `claimed`: every shard of the dead replica held again in etcd, by a survivor;
- `fenced`: every such shard's fence in SQL raised by its new owner;
- `judged`: an experiment of the dead replica's shards judged again: a history point
  (the controller writes one per judged experiment and second) for a second after
  the kill, which only a survivor can write.

The dead replica is then started again and the fleet settles before the next kill.
The target: `judged` within the lease TTL + 1 s. `measure_takeover` is the function
the scale benchmark calls for its replicas dimension.

URLs: CANARY_BENCH_DATABASE_URL (a PostgreSQL server; a scratch database of its own)
and CANARY_BENCH_ETCD (a prefix of its own), as `canary bench control`.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.benchmarks.replicas import STATS_DIR_VARIABLE, ReplicaFleet, replica_env

if TYPE_CHECKING:
    from controlplane.runtime import Backends

DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_ETCD = "http://127.0.0.1:2379"
POLL_SEC = 0.02


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by the nearest-rank method (pure)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(n q), at least 1
    return ordered[int(rank) - 1]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_s": round(quantile(values, 0.5), 3), "p95_s": round(quantile(values, 0.95), 3),
            "max_s": round(max(values), 3), "min_s": round(min(values), 3)}


async def _until(check: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(POLL_SEC)


async def _running(backends: Backends, count: int) -> list[int]:
    """`count` running experiments, each on a service with its rule in etcd."""
    from controlplane.experiments.actions import apply_action, create_experiment
    from controlplane.experiments.lifecycle import LifecycleAction
    from controlplane.experiments.store import ExperimentSpec, StepSpec

    ids: list[int] = []
    for i in range(count):
        service = f"takeover-{i}"
        rule = {"service": service, "threshold_ms": 300, "window_sec": 10, "min_samples": 50}
        await backends.kv.put(backends.keys.rule(service), json.dumps(rule).encode())
        spec = ExperimentSpec(
            name=f"takeover {i}", service=service,
            baseline_upstream="http://127.0.0.1:9001", canary_upstream="http://127.0.0.1:9002",
            steps=(StepSpec(1000, 86_400),), sticky_header="x-user-id", sticky_cookie=None,
            rule=None,
        )  # fmt: skip
        record = await create_experiment(store=backends.store, clock=backends.clock, spec=spec,
                                         actor="bench")  # fmt: skip
        await apply_action(store=backends.store, changes=backends.route_changes,
                           clock=backends.clock, experiment_id=record.id,
                           action=LifecycleAction.START, actor="bench")  # fmt: skip
        ids.append(record.id)
    return ids


async def measure_spread(
    *,
    database_url: str,
    etcd: str,
    experiments: int,
    replicas: int,
    shards: int = 256,
    seconds: float = 20.0,
    stats_dir: Path,
) -> dict[str, Any]:
    """`replicas` sharded replicas judging `experiments` running experiments (no
    samples: each judged as no data) for `seconds`: per replica, its share and its
    CPU per evaluation (one experiment judged in one round), from two reads of its
    own counters. The fixed costs of sharding (lease, watch, fences) are in it."""
    from controlplane.controller.shards import assign
    from controlplane.kernel.settings import Settings
    from controlplane.runtime import open_backends

    prefix = f"/canary-bench-{secrets.token_hex(4)}"
    settings = Settings(database_url=database_url, etcd=etcd, etcd_prefix=prefix)
    backends = await open_backends(settings, streams=False)
    await _running(backends, experiments)
    env = replica_env(database_url=database_url, etcd=etcd, prefix=prefix, shards=shards,
                      lease_ttl=5, **{STATS_DIR_VARIABLE: str(stats_dir)})  # fmt: skip
    fleet = ReplicaFleet(env)
    names = [f"spread-{replicas}-{i}" for i in range(replicas)]

    async def settled() -> bool:
        items, _ = await backends.kv.get_prefix(backends.keys.controller_shards_prefix)
        held = {int(kv.key.rsplit("/", 1)[1]): kv.value.decode() for kv in items}
        return held == assign(shards, [fleet.identity(n) for n in names])

    per_replica: list[dict[str, float]] = []
    try:
        for name in names:
            fleet.start(name)
        await _until(settled, 120, f"{replicas} replicas hold every shard")
        await asyncio.sleep(2.0)  # the first rounds of a new share: caches, history
        first = {n: await asyncio.to_thread(fleet.stats, n, stats_dir) for n in names}
        await asyncio.sleep(seconds)
        last = {n: await asyncio.to_thread(fleet.stats, n, stats_dir) for n in names}
        for name in names:
            evaluations = last[name]["evaluations"] - first[name]["evaluations"]
            cpu = last[name]["cpu_s"] - first[name]["cpu_s"]
            per_replica.append({
                "shards_held": last[name]["shards_held"],
                "evaluations": evaluations,
                "rounds_per_s": round(evaluations / max(1.0, experiments / replicas) / seconds, 2),
                "cpu_ms_per_evaluation": round(1000 * cpu / max(evaluations, 1), 3),
            })  # fmt: skip
    finally:
        fleet.close()
        await backends.close()
    costs = [r["cpu_ms_per_evaluation"] for r in per_replica]
    return {"experiments": experiments, "replicas": replicas, "shards": shards,
            "seconds": seconds, "per_replica": per_replica,
            "cpu_ms_per_evaluation_mean": round(sum(costs) / len(costs), 3)}  # fmt: skip


async def measure_takeover(
    *,
    database_url: str,
    etcd: str,
    replicas: int = 3,
    shards: int = 64,
    experiments: int = 64,
    kills: int = 8,
    lease_ttl: int = 2,
    progress: bool = False,
) -> dict[str, Any]:
    """Kill a replica `kills` times; how long until its shards are claimed, fenced in
    SQL and judged again (P50/P95 over the kills). `database_url` must be migrated."""
    from controlplane.controller.shards import assign, shard_of
    from controlplane.db.shards import shard_fences
    from controlplane.kernel.settings import Settings
    from controlplane.runtime import open_backends

    prefix = f"/canary-bench-{secrets.token_hex(4)}"
    settings = Settings(database_url=database_url, etcd=etcd, etcd_prefix=prefix)
    backends = await open_backends(settings, streams=False)
    ids = await _running(backends, experiments)
    by_shard: dict[int, list[int]] = {}
    for experiment in ids:
        by_shard.setdefault(shard_of(experiment, shards), []).append(experiment)

    fleet = ReplicaFleet(replica_env(database_url=database_url, etcd=etcd, prefix=prefix,
                                     shards=shards, lease_ttl=lease_ttl))  # fmt: skip
    names = [f"bench-replica-{i}" for i in range(replicas)]
    shards_prefix = backends.keys.controller_shards_prefix

    async def owner_keys() -> dict[int, tuple[str, int]]:
        """Every owner key: shard → (holder, the key's create revision: its fence)."""
        items, _ = await backends.kv.get_prefix(shards_prefix)
        return {int(kv.key.rsplit("/", 1)[1]): (kv.value.decode(), kv.create_revision)
                for kv in items}  # fmt: skip

    async def holders() -> dict[int, str]:
        return {s: holder for s, (holder, _) in (await owner_keys()).items()}

    async def sql_fences() -> dict[int, tuple[int, str]]:
        async with backends.database.transaction() as tx:
            return await tx.run(shard_fences)

    async def settled() -> dict[int, str] | None:
        """The fleet at rest: every shard held by the replica the assignment gives it
        (not a share still moving after a start) and fenced in SQL by that key. A kill
        before then times a release or a fence already under way, not a takeover."""
        live = [fleet.identity(n) for n in names]
        keys = await owner_keys()
        held = {s: holder for s, (holder, _) in keys.items()}
        if held != assign(shards, live):
            return None
        fences = await sql_fences()
        if any(fences.get(s) != (revision, holder) for s, (holder, revision) in keys.items()):
            return None
        return held

    def fleet_state() -> str:
        # said when the fleet does not settle: a replica that died at its start (its
        # output is not kept) and one that settles elsewhere read alike otherwise
        return ", ".join(f"{fleet.identity(n)} exited {fleet.procs[n].returncode}"
                         for n in names if fleet.procs[n].poll() is not None) or "all alive"

    async def latest_point(experiment_ids: list[int]) -> int:
        spans = await backends.history.spans(experiment_ids=experiment_ids)
        return max((last for _, _, last in spans.values()), default=0)

    runs: list[dict[str, float]] = []
    load_before = os.getloadavg()
    try:
        for name in names:
            fleet.start(name)
        for k in range(kills):
            try:
                before = await _until(settled, 60, f"{replicas} replicas hold every shard")
            except RuntimeError as exc:
                raise RuntimeError(f"{exc} ({fleet_state()})") from None
            # each replica in turn, passing over one whose shards hold no experiment
            turn = [names[(k + i) % replicas] for i in range(replicas)]
            name = next((n for n in turn if any(
                by_shard.get(s) for s, owner in before.items() if owner == fleet.identity(n)
            )), turn[0])  # fmt: skip
            victim = fleet.identity(name)
            lost = sorted(s for s, owner in before.items() if owner == victim)
            judged_ids = [e for s in lost for e in by_shard.get(s, [])]
            if not judged_ids:
                raise RuntimeError("no replica holds a shard with an experiment")
            fleet.kill(name)  # returns once it is dead: it writes nothing after this
            killed = time.monotonic()
            killed_wall = time.time()
            times: dict[str, float] = {}

            async def step(
                times: dict[str, float] = times, lost: list[int] = lost,
                victim: str = victim, judged_ids: list[int] = judged_ids,
                killed_wall: float = killed_wall, killed: float = killed,
            ) -> bool:
                now = time.monotonic() - killed
                if "claimed" not in times:
                    held = await holders()
                    if all(held.get(s) not in (None, victim) for s in lost):
                        times["claimed"] = now
                if "fenced" not in times:
                    fences = await sql_fences()
                    if all(fences.get(s, (0, victim))[1] != victim for s in lost):
                        times["fenced"] = now
                if "judged" not in times and await latest_point(judged_ids) > int(killed_wall):
                    times["judged"] = now
                return len(times) == 3

            await _until(step, lease_ttl + 30, f"{victim}'s shards taken over")
            runs.append(times)
            if progress:
                print(f"  kill {k + 1}/{kills}: {victim} ({len(lost)} shards): "
                      + ", ".join(f"{key} {value:.2f} s" for key, value in times.items()),
                      file=sys.stderr)  # fmt: skip
            fleet.start(name)
    finally:
        fleet.close()
        await backends.close()
    load_after = os.getloadavg()
    judged = summary([r["judged"] for r in runs])
    return {
        "benchmark": "shard-takeover",
        "replicas": replicas,
        "shards": shards,
        "experiments": experiments,
        "lease_ttl_s": lease_ttl,
        "kills": len(runs),
        "claimed": summary([r["claimed"] for r in runs]),
        "fenced": summary([r["fenced"] for r in runs]),
        "judged": judged,
        "target_s": lease_ttl + 1.0,
        "meets_target": judged["max_s"] <= lease_ttl + 1.0,
        "runs": [{key: round(value, 3) for key, value in r.items()} for r in runs],
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_before": round(load_before[0], 2),
                    "loadavg_1m_after": round(load_after[0], 2)},
        "backends": {"database": "postgresql", "etcd": etcd},
    }


SECTIONS = ("takeover", "spread")


def run(
    *, quick: bool = False, progress: bool = True, only: str | None = None
) -> dict[str, Any]:
    server = os.environ.get("CANARY_BENCH_DATABASE_URL", DEFAULT_DATABASE)
    etcd = os.environ.get("CANARY_BENCH_ETCD", DEFAULT_ETCD)
    sections = SECTIONS if only is None else tuple(p.strip() for p in only.split(","))
    unknown = [p for p in sections if p not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown sections {unknown} (known: {', '.join(SECTIONS)})")
    from controlplane.db import migrate
    from controlplane.db.scratch import scratch_database

    result: dict[str, Any] = {"benchmark": "shard-takeover"}
    load_before = os.getloadavg()
    if "takeover" in sections:
        with scratch_database(server, tag="canary_bench") as url:
            migrate.upgrade(url)
            result.update(asyncio.run(measure_takeover(
                database_url=url, etcd=etcd, kills=3 if quick else 12, progress=progress,
            )))  # fmt: skip
    if "spread" in sections:
        import tempfile

        spread: dict[str, Any] = {}
        experiments = 40 if quick else 400
        for replicas in (1, 4):
            with scratch_database(server, tag="canary_bench") as url, \
                    tempfile.TemporaryDirectory() as stats:
                migrate.upgrade(url)
                spread[f"replicas_{replicas}"] = asyncio.run(measure_spread(
                    database_url=url, etcd=etcd, experiments=experiments, replicas=replicas,
                    seconds=5.0 if quick else 20.0, stats_dir=Path(stats),
                ))  # fmt: skip
            if progress:
                print(f"  spread over {replicas}: {spread[f'replicas_{replicas}']}",
                      file=sys.stderr)
        one = spread["replicas_1"]["cpu_ms_per_evaluation_mean"]
        spread["ratio_4_to_1"] = round(spread["replicas_4"]["cpu_ms_per_evaluation_mean"] / one, 3)
        load_after = os.getloadavg()
        spread["machine"] = {"cpus": os.cpu_count(),
                             "loadavg_1m_before": round(load_before[0], 2),
                             "loadavg_1m_after": round(load_after[0], 2)}  # fmt: skip
        result["spread"] = spread
    return result
