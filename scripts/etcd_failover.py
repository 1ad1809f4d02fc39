"""Measure what a 3-member etcd cluster's faults cost the store (decision 0029).

Starts its own cluster on free ports (the tests' support code), then:
- kills the raft leader `--rounds` times under a held leadership and records the
  time from the kill to the first renewal confirmed after it (and any lapse);
- freezes a follower (SIGSTOP) and times `--calls` puts and gets through the store.

Run from the repository root:
    PYTHONPATH=. python scripts/etcd_failover.py --out bench/results/etcd-failover.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path

from controlplane.kernel.errors import BackendError
from controlplane.kernel.kv_etcd import EtcdKV
from tests.support.etcd_cluster import EtcdCluster


async def leader_kills(cluster: EtcdCluster, *, ttl: int, rounds: int) -> dict[str, object]:
    kv = EtcdKV(cluster.endpoints)
    leadership = kv.leadership("/failover/election", identity="probe", ttl=ttl)
    await leadership.campaign()
    renewals: list[float | None] = []
    lapses = 0
    try:
        for n in range(rounds):
            # a different phase against the renewals each round
            await asyncio.sleep(ttl / 3 * (n % 3) / 3)
            before = leadership._expires_at
            killed_at = time.monotonic()
            cluster.kill(cluster.leader())
            renewed: float | None = None
            while time.monotonic() - killed_at < ttl + 1:
                await asyncio.sleep(0.02)
                if not leadership.is_leader:
                    lapses += 1
                    break
                if leadership._expires_at > before:
                    renewed = round(time.monotonic() - killed_at, 2)
                    break
            renewals.append(renewed)
            await asyncio.to_thread(cluster.heal)
    finally:
        await kv.close()
    return {"ttl_s": ttl, "kill_to_renewal_s": renewals, "lapses": lapses}


async def frozen_follower(cluster: EtcdCluster, *, calls: int) -> dict[str, object]:
    kv = EtcdKV(cluster.endpoints)
    await kv.put("/failover/key", b"0")
    frozen = cluster.follower()
    assert frozen.proc is not None
    frozen.proc.send_signal(signal.SIGSTOP)
    took: list[float] = []
    failed = 0
    try:
        for n in range(calls):
            started = time.monotonic()
            try:
                await (kv.put("/failover/key", b"%d" % n) if n % 2 else kv.get("/failover/key"))
            except BackendError:
                failed += 1
            took.append(round(time.monotonic() - started, 3))
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
        await kv.close()
    return {"calls": calls, "failed": failed, "seconds": took}


async def measure(args: argparse.Namespace) -> dict[str, object]:
    results: dict[str, object] = {"loadavg": Path("/proc/loadavg").read_text().split()[:3]}
    for heartbeat_ms, election_ms, ttl in ((100, 1000, 5), (50, 500, 3)):
        cluster = EtcdCluster(heartbeat_ms=heartbeat_ms, election_ms=election_ms)
        try:
            cluster.start()
            name = f"raft_{heartbeat_ms}ms_{election_ms}ms"
            results[name] = {
                "leader_kills": await leader_kills(cluster, ttl=ttl, rounds=args.rounds),
                "frozen_follower": await frozen_follower(cluster, calls=args.calls),
            }
        finally:
            cluster.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=9)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = asyncio.run(measure(args))
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
