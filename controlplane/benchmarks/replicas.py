"""Controller replica processes for the benchmarks (decision 0057).

`python -m controlplane.benchmarks.replicas NAME` runs one `Controller` as `canary
serve` runs it (sharded when CANARY_CONTROLLER_SHARDS is set), on the settings of its
environment, until SIGTERM; its identity is `NAME-<pid>`; with
CANARY_BENCH_REPLICA_STATS set it then writes its evaluations and CPU there.
`ReplicaFleet` starts, kills and measures such processes by their own pids: the
takeover benchmark kills them, and a benchmark that spreads experiments over replicas
reads each one's CPU per evaluation.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controlplane.controller.runner import Controller

# a directory: each replica writes what it did there when it stops (write_stats)
STATS_DIR_VARIABLE = "CANARY_BENCH_REPLICA_STATS"


def replica_env(
    *, database_url: str, etcd: str, prefix: str, shards: int, lease_ttl: int,
    redis_url: str = "memory://", **extra: str,
) -> dict[str, str]:
    """The environment of a replica: these backends, `shards` shards (0: elected)."""
    return dict(
        os.environ, CANARY_DATABASE_URL=database_url, CANARY_ETCD=etcd,
        CANARY_ETCD_PREFIX=prefix, CANARY_REDIS_URL=redis_url,
        CANARY_CONTROLLER_SHARDS=str(shards), CANARY_CONTROLLER_LEASE_TTL=str(lease_ttl),
        CANARY_LOG_LEVEL="warning", **extra,
    )  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """User + system CPU a live process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        # the command name may hold spaces: the fields after its closing parenthesis
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class ReplicaFleet:
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str) -> None:
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "controlplane.benchmarks.replicas", name],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def identity(self, name: str) -> str:
        return f"{name}-{self.procs[name].pid}"

    def cpu_seconds(self, name: str) -> float:
        return cpu_seconds(self.procs[name].pid)

    def stats(self, name: str, directory: Path, timeout: float = 10.0) -> dict[str, float]:
        """Ask a replica what it did so far (SIGUSR1) and read its answer."""
        path = directory / f"{self.identity(name)}.json"
        before = path.stat().st_mtime_ns if path.exists() else -1
        self.procs[name].send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while not (path.exists() and path.stat().st_mtime_ns != before):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.identity(name)} did not report its stats")
            time.sleep(0.02)
        loaded: dict[str, float] = json.loads(path.read_text())
        return loaded

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _replica(name: str) -> None:
    from controlplane.controller.runner import Controller
    from controlplane.kernel.settings import Settings
    from controlplane.runtime import open_backends

    settings = Settings()
    backends = await open_backends(settings, streams=settings.redis_url != "memory://")
    controller = Controller(identity=f"{name}-{os.getpid()}", shards=settings.controller_shards,
                            lease_ttl=settings.controller_lease_ttl)  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    report = os.environ.get(STATS_DIR_VARIABLE)
    stats_path = Path(report) / f"{name}-{os.getpid()}.json" if report else None
    if stats_path is not None:
        # SIGUSR1: what it did so far, so a bench can take the difference of two reads
        loop.add_signal_handler(signal.SIGUSR1, write_stats, stats_path, controller)
    await controller.start(backends)
    try:
        await stop.wait()
    finally:
        await controller.stop()
        await backends.close()
        if stats_path is not None:
            write_stats(stats_path, controller)


def write_stats(path: Path, controller: Controller) -> None:
    """What a replica did, for the bench that ran it: its evaluations (one per judged
    experiment and round) and the CPU it spent."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    staging = path.with_suffix(".new")
    staging.write_text(json.dumps({
        "evaluations": controller.stats.evaluations,
        "decisions_applied": controller.stats.decisions_applied,
        "shards_held": controller.ownership.held,
        "shard_claims": controller.ownership.claims,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }))
    os.replace(staging, path)


if __name__ == "__main__":
    asyncio.run(_replica(sys.argv[1]))
