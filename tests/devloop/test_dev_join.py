"""`canary dev` on local backends, joined by `canary sidecar --join`: the printed command
works, the route reaches the sidecar, the CLI says the route is confirmed, the
sidecar's samples reach the embedded collector (signed with the key the join file
names). Real processes: `canary dev` starts its own etcd and redis-server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.devloop.backends import missing_binaries
from tests.sidecar import upstreams
from tests.support.processes import free_port

pytestmark = pytest.mark.skipif(bool(missing_binaries()), reason="etcd or redis-server missing")

CANARY = [sys.executable, "-m", "controlplane.cli.main"]
DEADLINE_SEC = 30.0


def _spawn(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([*CANARY, *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _wait_for(what: str, check: object, log: Path) -> None:
    deadline = time.monotonic() + DEADLINE_SEC
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.1)
    pytest.fail(f"{what} within {DEADLINE_SEC:g} s; log:\n{log.read_text()[-3000:]}")


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[tuple[str, Path, Path, str]]:
    """A `canary dev` on local backends: (API URL, join file, its log, admin token)."""
    port = free_port()
    join = tmp_path / "join.json"
    log = tmp_path / "dev.log"
    proc = _spawn(["dev", "--db-file", str(tmp_path / "canary.db"), "--listen",
                   f"127.0.0.1:{port}", "--backends", "local", "--join-file", str(join)], log)
    api = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return join.exists() and httpx.get(f"{api}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        _wait_for("canary dev did not serve", up, log)
        token = re.search(r"CANARY_TOKEN=(\S+)", log.read_text())
        assert token is not None, log.read_text()
        yield api, join, log, token.group(1)
    finally:
        assert _stop(proc) == 0, log.read_text()[-3000:]
    assert not join.exists()  # removed with the backends it names
    assert "Traceback" not in log.read_text()


def test_a_sidecar_joins_dev_with_the_printed_command(
    dev: tuple[str, Path, Path, str], tmp_path: Path
) -> None:
    api, join, dev_log, token = dev
    joined = json.loads(join.read_text())
    assert oct(join.stat().st_mode & 0o777) == "0o600"
    assert joined["api"] == api and joined["redis_url"].startswith("redis://127.0.0.1:")

    # the command `canary dev` printed, with SERVICE and the ports filled in
    printed = next(line.strip() for line in dev_log.read_text().splitlines()
                   if line.strip().startswith("canary sidecar --join"))
    port, admin = free_port(), free_port()
    args = shlex.split(printed)[1:]
    args[args.index("SERVICE")] = "shop"
    args[args.index("--listen") + 1] = f"127.0.0.1:{port}"
    args[args.index("--admin") + 1] = f"127.0.0.1:{admin}"
    assert args[args.index("--join") + 1] == str(join)

    baseline, canary = upstreams.Upstream("baseline"), upstreams.Upstream("canary")
    loop = asyncio.new_event_loop()
    loop.run_until_complete(baseline.start())
    loop.run_until_complete(canary.start())
    runner = _UpstreamThread(loop)
    sidecar_log = tmp_path / "sidecar.log"
    sidecar = _spawn(args, sidecar_log)
    env = {"CANARY_API": api, "CANARY_TOKEN": token}
    try:
        http = httpx.Client(base_url=api, headers={"authorization": f"Bearer {token}"},
                            timeout=5, trust_env=False)
        created = http.post("/v1/experiments", json={
            "name": "shop v2", "service": "shop",
            "variants": {"baseline": {"upstream": baseline.url},
                         "canary": {"upstream": canary.url}},
            "steps": [{"weight_pct": 50, "hold_sec": 3600}],
        })
        assert created.status_code == 201, created.text
        experiment = str(created.json()["id"])
        _wait_for("the sidecar did not answer /healthz",
                  lambda: _answers(f"http://127.0.0.1:{admin}/healthz"), sidecar_log)
        health = httpx.get(f"http://127.0.0.1:{admin}/healthz").text
        assert health == "ok\n"  # joined: no in-process warning

        started = subprocess.run([*CANARY, "exp", "start", experiment, "--confirm-wait", "15"],
                                 capture_output=True, text=True, timeout=60,
                                 env={**os.environ, **env})
        assert started.returncode == 0, started.stderr
        assert "running (canary 50%)" in started.stdout
        assert "route: confirmed by 1 of 1 data plane(s)" in started.stdout, started.stdout

        variants = set()
        for user in range(40):
            answer = httpx.get(f"http://127.0.0.1:{port}/echo",
                               headers={"x-user-id": str(user)}, timeout=5)
            assert answer.status_code == 200, answer.text
            variants.add(answer.headers["x-canary-variant"])
        assert variants == {"baseline", "canary"}

        def counted() -> bool:  # the embedded collector verified and counted the samples
            live = http.get(f"/v1/experiments/{experiment}").json()["live"]
            windows = live.get("snapshots") or {}
            return sum(int(w.get("count") or 0) for w in windows.values()) >= 40

        _wait_for("the samples did not reach the collector", counted, dev_log)
        detail = http.get(f"/v1/experiments/{experiment}").json()
        assert detail["route_confirmation"]["confirmed"] is True
        assert detail["route_confirmation"]["data_planes"] == 1
    finally:
        assert _stop(sidecar) == 0, sidecar_log.read_text()[-3000:]
        runner.stop(baseline, canary)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


class _UpstreamThread:
    """Runs the upstreams' event loop in a thread while the test drives processes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        import threading

        self.loop = loop
        self.thread = threading.Thread(target=loop.run_forever, daemon=True)
        self.thread.start()

    def stop(self, *servers: upstreams.Upstream) -> None:
        for server in servers:
            asyncio.run_coroutine_threadsafe(server.stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def test_a_sidecar_on_in_process_backends_says_so_loudly(tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    log = tmp_path / "sidecar.log"
    proc = _spawn(["sidecar", "--service", "shop", "--listen", f"127.0.0.1:{port}",
                   "--admin", f"127.0.0.1:{admin}", "--workers", "1",
                   "--etcd", "memory://", "--redis", "memory://"], log)
    try:
        _wait_for("the sidecar did not answer", lambda: _answers(
            f"http://127.0.0.1:{admin}/healthz"), log)
        health = httpx.get(f"http://127.0.0.1:{admin}/healthz").text
        assert health.startswith("ok\nWARNING: IN-PROCESS etcd and Redis (memory://)")
        assert "--join FILE" in health
    finally:
        _stop(proc)
    assert "IN-PROCESS etcd and Redis" in log.read_text()


def test_join_and_the_flags_it_sets_are_one_or_the_other(tmp_path: Path) -> None:
    result = subprocess.run(
        [*CANARY, "sidecar", "--service", "shop", "--listen", "127.0.0.1:0",
         "--join", str(tmp_path / "absent.json"), "--redis", "memory://"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "canary sidecar: --join sets --redis: give one or the other"
    )
    missing = subprocess.run(
        [*CANARY, "sidecar", "--service", "shop", "--listen", "127.0.0.1:0",
         "--join", str(tmp_path / "absent.json")],
        capture_output=True, text=True, timeout=60,
    )
    assert missing.returncode == 2
    assert "join file: cannot read" in missing.stderr and len(missing.stderr.splitlines()) == 1
