"""`canary serve` stops on the first SIGINT/SIGTERM wherever its startup is: a real
process, a backend that accepts connections and never answers.

The 20 s bound detects a hang (it once waited 10 minutes); it asserts no speed.
A stopped process says so and ends as the signal would: SIGINT exit 130, SIGTERM
killed by SIGTERM (what systemd and the kubelet take as a clean stop).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.db import migrate
from tests.cli.conftest import free_port
from tests.support.auth import install_test_tokens

HANG_BOUND_SEC = 20.0
START_BOUND_SEC = 60.0
EXPECTED_CODE = {signal.SIGINT: 130, signal.SIGTERM: -signal.SIGTERM}


class Blackhole:
    """A listening socket that accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.connected = threading.Event()
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self._held.append(conn)
            self.connected.set()

    def close(self) -> None:
        # closing alone leaves the thread blocked in accept() until join's timeout:
        # shutting the listener down wakes it
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(5)
        assert not self._thread.is_alive(), "the blackhole's thread did not end"
        for conn in self._held:
            conn.close()


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    hole = Blackhole()
    try:
        yield hole
    finally:
        hole.close()


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('stop') / 'canary.db'}"
    migrate.upgrade(url)
    install_test_tokens(url)
    return url


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)


def serve(log: Path, *args: str) -> subprocess.Popen[bytes]:
    return start([sys.executable, "-m", "controlplane.cli.main", "serve", *args], log)


def stopped_by(proc: subprocess.Popen[bytes], sig: signal.Signals, log: Path) -> str:
    """Send `sig`; the process's output once it has exited (a failure if it hangs)."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout=HANG_BOUND_SEC)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"still running {HANG_BOUND_SEC:g} s after {sig.name}:\n{log.read_text()}")
    out = log.read_text()
    assert proc.returncode == EXPECTED_CODE[sig], out
    assert "Traceback" not in out
    return out


def wait_for(what: str, ready: threading.Event, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_BOUND_SEC
    while not ready.wait(0.05):
        assert proc.poll() is None, f"exited before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"never reached {what}:\n{log.read_text()}"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_database_does_not_answer_ends_the_startup(
    sig: signal.Signals, blackhole: Blackhole, tmp_path: Path
) -> None:
    """Before the event loop: the migrations check waits on a database that accepted
    the connection and says nothing (its connect timeout: 10 minutes)."""
    log = tmp_path / "serve.log"
    url = f"postgresql+psycopg://canary:x@127.0.0.1:{blackhole.port}/canary?connect_timeout=600"
    proc = serve(log, "--database-url", url, "--listen", f"127.0.0.1:{free_port()}")
    try:
        wait_for("the database", blackhole.connected, proc, log)
        out = stopped_by(proc, sig, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"canary serve: stopped by {sig.name}" in out, out


# The API's startup (its lifespan) as `canary serve` runs it, with a background part
# whose start never returns (a backend that never answers)
NEVER_STARTS = textwrap.dedent(
    """
    import asyncio, sys

    import typer

    from controlplane.cli.server import run_api
    from controlplane.cli.stopping import stopping_on_signals
    from controlplane.kernel.settings import Settings

    class NeverStarts:
        async def start(self, backends):
            print("starting", flush=True)
            await asyncio.Event().wait()

        async def stop(self):
            pass

    settings = Settings(database_url=sys.argv[1], listen=sys.argv[2], etcd="memory://",
                        redis_url="memory://")
    try:
        with stopping_on_signals("serve"):
            run_api(settings, services=[NeverStarts()])
    except typer.Exit as done:
        sys.exit(done.exit_code)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_during_the_api_startup_cancels_it(
    sig: signal.Signals, database: str, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    proc = start([sys.executable, "-c", NEVER_STARTS, database, f"127.0.0.1:{free_port()}"], log)
    try:
        deadline = time.monotonic() + START_BOUND_SEC
        while "starting" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        out = stopped_by(proc, sig, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"{sig.name} during startup: cancelling it" in out, out
    assert f"canary serve: stopped by {sig.name}" in out, out
    assert "Uvicorn running" not in out  # nothing was served


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_serving_with_etcd_unanswering_drains_and_exits(
    sig: signal.Signals, database: str, blackhole: Blackhole, tmp_path: Path
) -> None:
    """The controller campaigns on an etcd that never answers; the API serves."""
    log = tmp_path / "serve.log"
    port = free_port()
    proc = serve(log, "--database-url", database, "--listen", f"127.0.0.1:{port}",
                 "--etcd", f"127.0.0.1:{blackhole.port}", "--redis", "memory://")  # fmt: skip
    try:
        wait_for("etcd", blackhole.connected, proc, log)
        deadline = time.monotonic() + START_BOUND_SEC
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        out = stopped_by(proc, sig, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Shutting down" in out and f"canary serve: stopped by {sig.name}" in out, out
