"""`canary bench scale --replicas 1,4`: N experiments judged by R sharded controllers.

For each replica count R in turn, on one set of N running experiments (PostgreSQL in a
scratch database, etcd and Redis under a prefix and a namespace of their own): R
controller replica processes (`controlplane/benchmarks/replicas.py`, each a
`Controller` as `canary serve` runs it, sharded over SHARDS shards), a `canary
collector` process and the steady feed (`scale_feed.py`) scaled to fit the machine:
FEED_TOTAL samples a second over all N experiments. Once the fleet holds every shard
as assigned, each replica's own counters are read twice (SIGUSR1), `seconds` apart and
then as long as it takes every replica to judge its share ROUNDS times:

- per replica: shards and experiments held, evaluations (one experiment judged in one
  round), rounds per second (its evaluations over its experiments and the span), CPU
  per experiment and round (its process CPU over its evaluations);
- per R: the spread (max over mean of the experiments held and of the CPU per
  evaluation), and each replica's CPU per evaluation over the one-replica run's.

The replicas start together and stop (SIGTERM, leases revoked) before the next R.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.benchmarks.replicas import STATS_DIR_VARIABLE, ReplicaFleet, replica_env

if TYPE_CHECKING:
    from controlplane.benchmarks.scale import Rig

SHARDS = 256
LEASE_TTL = 5
FEED_TOTAL = 8_000  # samples a second over all experiments: what the 2 shared cores carry
MAX_REPLICAS = 16
CREATORS = 8
ROUNDS = 2  # rounds over its share each replica judges in the measured span, at least
MAX_SPAN_SEC = 600.0
POLL_SEC = 2.0
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def parse_replicas(text: str) -> tuple[int, ...]:
    """`1,4` → (1, 4) (pure); each within 1..MAX_REPLICAS, no repeats."""
    counts: list[int] = []
    for token in (t.strip() for t in text.split(",")):
        if not (token.isdigit() and 1 <= int(token) <= MAX_REPLICAS):
            raise ValueError(f"--replicas: {token!r} is not a replica count in 1..{MAX_REPLICAS}")
        if int(token) in counts:
            raise ValueError(f"--replicas: {token} twice")
        counts.append(int(token))
    return tuple(counts)


def feed_samples(n: int) -> int:
    """Samples a second to each of `n` experiments: FEED_TOTAL shared, at least one."""
    return max(1, FEED_TOTAL // n)


def spread(per_replica: list[dict[str, float]], one: float | None) -> dict[str, Any]:
    """The imbalance of one replica count's figures (pure): max over mean of the
    experiments held and of the CPU per evaluation, and each replica's CPU per
    evaluation over the one-replica run's (`one`; None: not measured)."""
    held = [r["experiments_held"] for r in per_replica]
    costs = [r["cpu_ms_per_evaluation"] for r in per_replica]
    mean_cost = sum(costs) / len(costs)
    return {
        "experiments_max_over_mean": round(max(held) / (sum(held) / len(held)), 3),
        "cpu_per_evaluation_mean_ms": round(mean_cost, 4),
        "cpu_per_evaluation_max_over_mean": round(max(costs) / mean_cost, 3),
        "cpu_per_evaluation_over_one_replica": (
            [round(c / one, 3) for c in costs] if one else None
        ),
    }


async def _measure(
    rig: Rig, database_url: str, etcd: str, redis_url: str, replicas: int, seconds: float,
    stats_dir: Path, progress: bool,
) -> list[dict[str, float]]:
    """R replicas over the rig's experiments: each one's share and costs."""
    from controlplane.controller.shards import assign, shard_of

    env = replica_env(
        database_url=database_url, etcd=etcd, prefix=rig.prefix, shards=SHARDS,
        lease_ttl=LEASE_TTL, redis_url=redis_url, CANARY_REDIS_NAMESPACE=rig.namespace,
        CANARY_SAMPLE_KEYS=rig.sample_keys, **{STATS_DIR_VARIABLE: str(stats_dir)},
    )  # fmt: skip
    fleet = ReplicaFleet(env)
    names = [f"scale-{replicas}-{i}" for i in range(replicas)]
    experiments = Counter(shard_of(int(e), SHARDS) for e, _ in rig.experiments)
    backends = rig.backends
    try:
        for name in names:
            fleet.start(name)
        deadline = time.monotonic() + 180
        while True:
            items, _ = await backends.kv.get_prefix(backends.keys.controller_shards_prefix)
            held = {int(kv.key.rsplit("/", 1)[1]): kv.value.decode() for kv in items}
            wanted = assign(SHARDS, [fleet.identity(n) for n in names])
            if held == wanted:
                break
            dead = [n for n in names if fleet.procs[n].poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{replicas} replicas did not settle (exited: {dead})")
            await asyncio.sleep(0.1)
        await asyncio.sleep(5.0)  # the first rounds of a share: caches, rule book, history
        first = {n: await asyncio.to_thread(fleet.stats, n, stats_dir, 60.0) for n in names}
        began = time.monotonic()
        await asyncio.sleep(seconds)
        # and on until each replica has judged its share ROUNDS times over: a round at
        # N = 4,000 outlasts a fixed span on a loaded machine, and a read inside one
        # round would count its CPU without its evaluations
        while True:
            last = {n: await asyncio.to_thread(fleet.stats, n, stats_dir, 60.0) for n in names}
            span = time.monotonic() - began
            done = all(
                last[n]["evaluations"] - first[n]["evaluations"]
                >= ROUNDS * sum(experiments[s] for s, o in wanted.items() if o == fleet.identity(n))
                for n in names
            )  # fmt: skip
            if done or span > MAX_SPAN_SEC:
                break
            await asyncio.sleep(POLL_SEC)
    finally:
        fleet.close()
    per_replica: list[dict[str, float]] = []
    for name in names:
        mine = [s for s, owner in wanted.items() if owner == fleet.identity(name)]
        count = sum(experiments[s] for s in mine)
        evaluations = last[name]["evaluations"] - first[name]["evaluations"]
        cpu = last[name]["cpu_s"] - first[name]["cpu_s"]
        per_replica.append({
            "shards_held": len(mine),
            "experiments_held": count,
            "evaluations": evaluations,
            "decisions_applied": last[name]["decisions_applied"],
            "rounds_per_s": round(evaluations / max(count, 1) / span, 3),
            "span_s": round(span, 1),
            "cpu_s": round(cpu, 3),
            "cpu_ms_per_evaluation": round(1000 * cpu / max(evaluations, 1), 4),
        })  # fmt: skip
        if progress:
            print(f"  R={replicas} {name}: {per_replica[-1]}", file=sys.stderr)
    return per_replica


async def _all_counts(
    n: int, counts: tuple[int, ...], seconds: float, redis_url: str, etcd: str,
    database_url: str, progress: bool,
) -> dict[str, Any]:
    import redis.asyncio as aioredis

    from controlplane.benchmarks.children import stop_child
    from controlplane.benchmarks.scale import (
        KID,
        Rig,
        Sidecars,
        _clean,
        _create,
        _free_port,
        _start_collector,
        _start_feed,
        _stop_feed,
        _wait_ready,
    )  # fmt: skip
    from controlplane.kernel.errors import BackendError
    from controlplane.kernel.sample_auth import SampleSigner
    from controlplane.kernel.sample_keys import parse_sample_keys
    from controlplane.kernel.settings import Settings
    from controlplane.runtime import open_backends

    tag = secrets.token_hex(4)
    namespace, prefix = f"canary-bench-{tag}", f"/canary-bench-{tag}"
    sample_keys = f"{KID}:{secrets.token_hex(32)}"
    redis = aioredis.Redis.from_url(redis_url)
    settings = Settings(database_url=database_url, etcd=etcd, etcd_prefix=prefix,
                        redis_url=redis_url, redis_namespace=namespace)  # fmt: skip
    backends = await open_backends(settings)
    assert backends.streams is not None
    signer = SampleSigner(parse_sample_keys(sample_keys, origin="bench"))
    rig = Rig(n, backends, [], Sidecars(backends.streams, signer), namespace, prefix,
              sample_keys)  # fmt: skip
    feeder: subprocess.Popen[str] | None = None
    out: dict[str, Any] = {"n": n, "feed_samples_per_experiment_s": feed_samples(n)}
    try:
        began = time.perf_counter()
        # created CREATORS at a time: PostgreSQL takes them side by side
        chunk = -(-n // CREATORS)
        made = await asyncio.gather(*(
            _create(backends, min(chunk, n - first), progress and first == 0, first)
            for first in range(0, n, chunk)
        ))  # fmt: skip
        rig.experiments = [pair for part in made for pair in part]
        out["setup_s"] = round(time.perf_counter() - began, 2)
        admin = _free_port()
        rig.collector = _start_collector(rig, redis_url, etcd, admin)
        await _wait_ready(admin)
        feeder = _start_feed(rig, redis_url, feed_samples(n))
        one: float | None = None
        for replicas in counts:
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory() as stats:
                per_replica = await _measure(rig, database_url, etcd, redis_url, replicas,
                                             seconds, Path(stats), progress)  # fmt: skip
            figures = spread(per_replica, one)
            if replicas == 1:
                one = figures["cpu_per_evaluation_mean_ms"]
                figures["cpu_per_evaluation_over_one_replica"] = [1.0]
            out[f"replicas_{replicas}"] = {
                "replicas": replicas, "per_replica": per_replica, "spread": figures,
                "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
            }  # fmt: skip
            if progress:
                print(f"  R={replicas}: {figures}", file=sys.stderr)
    finally:
        if feeder is not None:
            _stop_feed(feeder)
        if rig.collector is not None:
            stop_child(rig.collector, 20.0)
        try:
            await _clean(backends, redis, namespace, prefix)
        except BackendError as exc:
            # thousands of deletes on a loaded etcd may run out of time: the figures
            # stand, and what is left is under a prefix of its own
            print(f"  clean-up incomplete ({exc}); prefix {prefix}", file=sys.stderr)
        await backends.close()
        await redis.aclose()
    return out


def run_replicas(
    *, sizes: tuple[int, ...], counts: tuple[int, ...], seconds: float, progress: bool,
    server: str | None = None,
) -> dict[str, Any]:
    """The replicas dimension of `canary bench scale`, one scratch database per N on
    the PostgreSQL server of `server` (else CANARY_BENCH_DATABASE_URL's)."""
    from controlplane.db import migrate
    from controlplane.db.scratch import scratch_database

    server = server or os.environ.get("CANARY_BENCH_DATABASE_URL", DEFAULT_SERVER)
    redis_url = os.environ.get("CANARY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
    etcd = os.environ.get("CANARY_BENCH_ETCD", "http://127.0.0.1:2379")
    load_before = os.getloadavg()
    by_n: dict[str, Any] = {}
    for n in sizes:
        if progress:
            print(f"N={n} experiments over {', '.join(map(str, counts))} replicas",
                  file=sys.stderr)  # fmt: skip
        with scratch_database(server, tag="canary_bench") as url:
            migrate.upgrade(url)
            by_n[str(n)] = asyncio.run(_all_counts(n, counts, seconds, redis_url, etcd, url,
                                                   progress))  # fmt: skip
    return {
        "sizes": by_n,
        "settings": {"shards": SHARDS, "lease_ttl_s": LEASE_TTL, "seconds": seconds,
                     "feed_total_samples_per_s": FEED_TOTAL, "database": "postgresql"},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": list(load_before),
                    "loadavg_after": list(os.getloadavg())},
    }  # fmt: skip
