"""The README's quickstart, run as written: the lines between its markers, in bash, in a
copy of deploy/examples/. Only the ports change (free ones, so that runs in parallel
never collide) and `make install` is the test environment itself; the token line takes
the token `canary dev` printed, as its comment says."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.devloop.backends import missing_binaries
from tests.support.processes import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    bool(missing_binaries()) or shutil.which("curl") is None,
    reason="the quickstart needs etcd, redis-server and curl",
)


def quickstart_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- quickstart:", 1)[1].split("<!-- /quickstart -->", 1)[0]
    body = block.split("```sh\n", 1)[1].split("```", 1)[0]
    # a comment starts at "  # " (no command here has one of its own)
    return [line.split("  # ", 1)[0].strip() for line in body.splitlines() if line.strip()]


def test_the_quickstart_has_fewer_than_ten_commands() -> None:
    lines = quickstart_lines()
    assert len(lines) < 10
    assert lines[0] == "make install && . .venv/bin/activate"
    assert lines[1] == "canary dev" and lines[2] == "export CANARY_TOKEN=cnry_…"


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _wait(what: str, check: object, logs: Path, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.1)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in logs.glob("*.log"))
    pytest.fail(f"{what} within {timeout:g} s\n{tails}")


class Shell:
    """Runs quickstart lines in one folder, with `canary` of this checkout on PATH."""

    def __init__(self, cwd: Path, ports: dict[str, str]) -> None:
        self.cwd = cwd
        self.ports = ports
        bin_dir = str(Path(sys.executable).parent)
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONPATH": str(REPO)}
        self.background: list[tuple[subprocess.Popen[bytes], Path]] = []

    def line(self, command: str) -> str:
        for old, new in self.ports.items():
            command = command.replace(old, new)
        return command

    def start(self, command: str, name: str) -> subprocess.Popen[bytes]:
        log = self.cwd / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(["bash", "-c", self.line(command).removesuffix("&").strip()],
                                    cwd=self.cwd, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.background.append((proc, log))
        return proc

    def run(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", self.line(command)], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def stop(self) -> list[int]:
        codes = []
        for proc, _ in reversed(self.background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            codes.append(proc.returncode)
        return codes


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    ports = {"9001": str(free_port()), "9002": str(free_port()),
             "127.0.0.1:8000": f"127.0.0.1:{free_port()}",
             "127.0.0.1:8001": f"127.0.0.1:{free_port()}"}
    examples = tmp_path / "deploy" / "examples"
    examples.mkdir(parents=True)
    for name in ("quickstart.yaml", "quickstart_service.py"):
        text = (REPO / "deploy" / "examples" / name).read_text()
        for old, new in ports.items():
            text = text.replace(old, new)
        (examples / name).write_text(text)
    runner = Shell(tmp_path, ports)
    api_port = free_port()
    runner.env |= {"CANARY_LISTEN": f"127.0.0.1:{api_port}",
                   "CANARY_API": f"http://127.0.0.1:{api_port}"}
    try:
        yield runner
    finally:
        runner.stop()


def test_the_quickstart_runs_as_written_to_a_trip_and_rollback(shell: Shell) -> None:
    (_install, dev, token_line, services, sidecar, create, start, traffic,
     watch) = quickstart_lines()
    shell.start(dev, "dev")
    dev_log = shell.cwd / "dev.log"
    api_port = int(shell.env["CANARY_LISTEN"].rpartition(":")[2])
    _wait("canary dev did not serve with its join file written",
          lambda: (shell.cwd / "canary-dev.json").exists() and _answers(api_port), shell.cwd)
    token = re.search(r"export CANARY_TOKEN=(\S+)", dev_log.read_text())
    assert token is not None and token_line.startswith("export CANARY_TOKEN=")
    shell.env["CANARY_TOKEN"] = token.group(1)

    join = shell.cwd / "canary-dev.json"
    assert join.stat().st_mode & 0o777 == 0o600  # it names the sample key's file
    # the README's sidecar line is the one `canary dev` printed, for the service `shop`
    printed = next(line.strip() for line in dev_log.read_text().splitlines()
                   if line.strip().startswith("canary sidecar --join"))
    assert printed.replace(str(join), join.name).replace("SERVICE", "shop") == \
        sidecar.removesuffix("&").strip()

    shell.start(services, "services")
    shell.start(sidecar, "sidecar")
    sidecar_port = int(shell.ports["127.0.0.1:8000"].rpartition(":")[2])
    admin_port = int(shell.ports["127.0.0.1:8001"].rpartition(":")[2])
    _wait("the sidecar did not listen", lambda: _answers(sidecar_port), shell.cwd)
    _wait("the sidecar's admin did not listen", lambda: _answers(admin_port), shell.cwd)
    health = subprocess.run(["curl", "-s", f"http://127.0.0.1:{admin_port}/healthz"],
                            capture_output=True, text=True, timeout=10).stdout
    assert health == "ok\n"  # joined: no in-process warning

    created = shell.run(create)
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("created experiment 1 (shop v2, shop, draft)")
    started = shell.run(start)
    assert started.returncode == 0, started.stderr
    assert "route: confirmed by 1 of 1 data plane(s)" in started.stdout, started.stdout

    shell.start(traffic, "traffic")
    watched = shell.run(watch, timeout=150)
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout.strip().splitlines()[-1] == "experiment 1 rolled_back", watched.stdout
    assert "breaker: open" in watched.stdout or "trip" in watched.stdout
    # the embedded collector verified the joined sidecar's signed samples and judged
    # version 2's window: its P95 over the 200 ms bound, on at least min_samples
    judged = [(int(p95), int(n)) for p95, n in
              re.findall(r"canary: P95 (\d+) ms · failed \S+ · n=(\d+)", watched.stdout)]
    assert any(p95 > 200 and n >= 20 for p95, n in judged), watched.stdout
    codes = shell.stop()
    assert "Traceback" not in dev_log.read_text()
    assert codes[-1] == 0 and not join.exists()  # `canary dev` stopped cleanly, file gone
