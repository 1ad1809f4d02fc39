"""A 3-member etcd cluster of the test's own, on free private ports.

Members are killed (SIGKILL) and started again on their own data directories, so a
restarted member rejoins the cluster it left. Which member serves a client's watch
is read from each member's /metrics (`etcd_debugging_mvcc_watcher_total`), so a
test can kill exactly the member its watch is on.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator

from controlplane.kernel.kv_etcd import EtcdKV
from tests.support.processes import ServiceProcess, etcd_binary, free_port

_WATCHERS = re.compile(rb"^etcd_debugging_mvcc_watcher_total (\S+)$", re.MULTILINE)
_IS_LEADER = re.compile(rb"^etcd_server_is_leader (\S+)$", re.MULTILINE)


class EtcdMember(ServiceProcess):
    def __init__(self, index: int, token: str, *, heartbeat_ms: int, election_ms: int) -> None:
        super().__init__(f"etcd-m{index}", free_port())
        self.member_name = f"m{index}"
        self.peer_port = free_port()
        self.token = token
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.initial_cluster = ""

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.port}"
        return [
            etcd_binary(),
            "--name", self.member_name,
            "--data-dir", str(self.workdir / "data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self.token,
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--logger", "zap",
            "--log-level", "warn",
        ]

    def metrics(self) -> bytes:
        with urllib.request.urlopen(f"http://{self.endpoint}/metrics", timeout=2) as reply:
            body: bytes = reply.read()
            return body

    def watchers(self) -> int:
        found = _WATCHERS.search(self.metrics())
        return int(float(found.group(1))) if found else 0

    def is_leader(self) -> bool:
        found = _IS_LEADER.search(self.metrics())
        return bool(found) and float(found.group(1)) == 1.0

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=2) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")
        except (OSError, ValueError):
            return False


class EtcdCluster:
    """`heartbeat_ms` and `election_ms` default to half etcd's (100 ms, 1 s): a new raft
    leader within about a second even on a loaded test machine, well inside the
    tests' 3 s leases."""

    def __init__(self, size: int = 3, *, heartbeat_ms: int = 50, election_ms: int = 500) -> None:
        token = f"canary-test-{uuid.uuid4().hex[:8]}"
        self.members = [
            EtcdMember(index, token, heartbeat_ms=heartbeat_ms, election_ms=election_ms)
            for index in range(size)
        ]
        initial = ",".join(f"{m.member_name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.initial_cluster = initial

    @property
    def endpoints(self) -> str:
        """Every member, as CANARY_ETCD takes them."""
        return ",".join(member.endpoint for member in self.members)

    @contextlib.asynccontextmanager
    async def client(self, *, timeout: float = 5.0) -> AsyncIterator[EtcdKV]:
        """The store over every member, closed on the way out."""
        store = EtcdKV(self.endpoints, timeout=timeout)
        try:
            yield store
        finally:
            await store.close()

    def start(self) -> None:
        # Members wait for each other to form the cluster: start all, then wait.
        for member in self.members:
            member.start()
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 20.0) -> None:
        """Every member is up and the cluster has a leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(m.running and m.healthy() for m in self.members):
                return
            time.sleep(0.05)
        raise TimeoutError(f"the etcd cluster is not healthy after {timeout} s")

    def heal(self) -> None:
        """Start again every member a test killed."""
        for member in self.members:
            if not member.running:
                member.start()
        self.wait_healthy()

    def kill(self, member: EtcdMember) -> None:
        member.stop(signal.SIGKILL)

    def follower(self) -> EtcdMember:
        """A running member that does not lead raft."""
        for member in self.members:
            if member.running and not member.is_leader():
                return member
        raise LookupError("no running etcd follower")

    def leader(self) -> EtcdMember:
        for member in self.members:
            if member.running and member.is_leader():
                return member
        raise LookupError("no etcd member leads")

    def watched_member(self, *, at_least: int = 1, timeout: float = 5.0) -> EtcdMember:
        """The one member serving at least `at_least` watchers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            serving = [m for m in self.members if m.running and m.watchers() >= at_least]
            if len(serving) == 1:
                return serving[0]
            time.sleep(0.05)
        raise LookupError(f"no single member serves {at_least} watcher(s) within {timeout} s")

    def close(self) -> None:
        for member in self.members:
            member.close()
