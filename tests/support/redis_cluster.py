"""A real Redis Cluster the tests own: 3 primaries and 3 replicas on private ports.

Each node is a redis-server child process (cluster-enabled, no persistence) in its
own temporary directory; `redis-cli --cluster create` assigns the slots and pairs
the replicas. A small `cluster-node-timeout` lets a replica take over within about
a second of its primary's death, which the fault tests rely on.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

from tests.support.processes import RedisProcess, ServiceProcess, wait_port

NODE_TIMEOUT_MS = 1000
BUS_OFFSET = 10_000  # Redis Cluster's bus port is the client port + 10000


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def cluster_port() -> int:
    """A free port whose cluster bus port is free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port + BUS_OFFSET < 65536 and _port_free(port + BUS_OFFSET):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def redis_cli(port: int, *args: str, timeout: float = 10.0) -> str:
    done = subprocess.run(
        [shutil.which("redis-cli") or "redis-cli", "-p", str(port), *args],
        capture_output=True, check=True, timeout=timeout, text=True,
    )  # fmt: skip
    return done.stdout


class ClusterNodeProcess(RedisProcess):
    def __init__(self) -> None:
        ServiceProcess.__init__(self, "redis-cluster", cluster_port())

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # a replica promoted after its primary died must not wait for a data check
            "--cluster-replica-validity-factor", "0",
        ]  # fmt: skip

    def info(self, section: str) -> dict[str, str]:
        text = redis_cli(self.port, "cluster", "info") if section == "cluster" else redis_cli(
            self.port, "info", section
        )
        pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
        return {name.strip(): value.strip() for name, value in pairs}


@dataclass
class RedisCluster:
    nodes: list[ClusterNodeProcess]

    @property
    def url(self) -> str:
        """Seeds for the client: every node, so any one of them can be dead."""
        seeds = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"redis+cluster://{seeds}"

    def alive(self) -> list[ClusterNodeProcess]:
        return [node for node in self.nodes if node.proc is not None]

    def primary_of(self, key: str) -> ClusterNodeProcess:
        """The node serving `key`'s slot now."""
        probe = self.alive()[0]
        slot = int(redis_cli(probe.port, "cluster", "keyslot", key).strip())
        for line in redis_cli(probe.port, "cluster", "nodes").splitlines():
            parts = line.split()
            if "master" not in parts[2] or "fail" in parts[2]:
                continue
            for span in parts[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
                    return next(node for node in self.nodes if node.port == port)
        raise LookupError(f"no live primary serves slot {slot}")

    def kill(self, node: ClusterNodeProcess) -> None:
        node.stop(signal.SIGKILL)

    def restart(self, node: ClusterNodeProcess) -> None:
        """Back as it was (its nodes.conf kept): it rejoins, as a replica if replaced."""
        node.start()

    def wait_ok(self, *, timeout: float = 30.0) -> None:
        """Every live node says cluster_state:ok and sees every slot served."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if all(
                    info.get("cluster_state") == "ok" and info.get("cluster_slots_ok") == "16384"
                    for info in (node.info("cluster") for node in self.alive())
                ):
                    return
            except subprocess.SubprocessError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the Redis Cluster was not ok within {timeout} s")

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def start_cluster(primaries: int = 3, replicas_each: int = 1) -> RedisCluster:
    nodes = [ClusterNodeProcess() for _ in range(primaries * (1 + replicas_each))]
    cluster = RedisCluster(nodes)
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            wait_port(node.port)
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        subprocess.run(
            [shutil.which("redis-cli") or "redis-cli", "--cluster", "create", *addresses,
             "--cluster-replicas", str(replicas_each), "--cluster-yes"],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        cluster.wait_ok()
        _wait_replicas_linked(cluster, primaries * replicas_each)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _wait_replicas_linked(cluster: RedisCluster, expected: int, timeout: float = 30.0) -> None:
    """Every replica has finished its first sync, so a failover has data to promote."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        linked = 0
        for node in cluster.alive():
            info = node.info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") == "up":
                linked += 1
        if linked >= expected:
            return
        time.sleep(0.1)
    raise TimeoutError("the replicas did not finish their first sync")
