"""A real Redis primary, its replica and three sentinels the tests own, on private ports.

Sentinels notice a dead primary after DOWN_AFTER_MS and promote the replica; two of
the three must agree (quorum 2), as in a production deployment.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import RedisProcess, ServiceProcess, free_port
from tests.support.redis_cluster import redis_cli

SERVICE = "canary-test"
DOWN_AFTER_MS = 1000


class ReplicaProcess(RedisProcess):
    def __init__(self, primary_port: int) -> None:
        super().__init__()
        self.primary_port = primary_port

    def command(self) -> list[str]:
        return [*super().command(), "--replicaof", "127.0.0.1", str(self.primary_port)]


class SentinelProcess(ServiceProcess):
    def __init__(self, primary_port: int) -> None:
        super().__init__("redis-sentinel", free_port())
        self.primary_port = primary_port

    def command(self) -> list[str]:
        config = Path(self.workdir) / "sentinel.conf"
        if not config.exists():  # sentinel rewrites its file: keep what it learnt
            config.write_text(
                f"port {self.port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
        return [shutil.which("redis-server") or "redis-server", str(config), "--sentinel"]


@dataclass
class SentinelSet:
    primary: RedisProcess
    replica: ReplicaProcess
    sentinels: list[SentinelProcess]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def primary_port(self) -> int:
        """The port the sentinels name as the primary now."""
        reply = redis_cli(
            self.sentinels[0].port, "sentinel", "get-master-addr-by-name", SERVICE
        ).split()
        return int(reply[1])

    def wait_primary(self, port: int, *, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.primary_port() == port:
                    return
            except (subprocess.SubprocessError, IndexError, ValueError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the sentinels did not name {port} the primary within {timeout} s")

    def wait_replica_linked(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "master_link_status:up" in redis_cli(self.replica.port, "info", "replication"):
                return
            time.sleep(0.1)
        raise TimeoutError("the replica did not finish its first sync")

    def close(self) -> None:
        for process in (*self.sentinels, self.replica, self.primary):
            process.close()


def start_sentinel_set() -> SentinelSet:
    primary = RedisProcess()
    primary.start()
    replica = ReplicaProcess(primary.port)
    sentinels = [SentinelProcess(primary.port) for _ in range(3)]
    found = SentinelSet(primary, replica, sentinels)
    try:
        replica.start()
        for sentinel in sentinels:
            sentinel.start()
        found.wait_replica_linked()
        found.wait_primary(primary.port)
    except BaseException:
        found.close()
        raise
    return found
