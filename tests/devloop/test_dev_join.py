"""A data plane alone says so, and `--join` is one flag or the others (the join itself,
end to end, is tests/devloop/test_quickstart.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.processes import free_port

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


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


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


def test_dev_on_in_process_stores_says_nothing_can_join(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "dev.log"
    proc = _spawn(["dev", "--backends", "memory", "--listen", f"127.0.0.1:{port}",
                   "--db-file", str(tmp_path / "c.db")], log)
    try:
        _wait_for("canary dev did not serve", lambda: _answers(
            f"http://127.0.0.1:{port}/healthz"), log)
    finally:
        _stop(proc)
    text = log.read_text()
    assert "etcd and Redis are IN-PROCESS (memory://): no sidecar or router can join" in text
    assert "canary sidecar --join" not in text and not (tmp_path / "canary-dev.json").exists()


def test_an_unknown_backends_choice_is_a_usage_error() -> None:
    result = subprocess.run([*CANARY, "dev", "--backends", "cloud"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().endswith("--backends must be auto, local or memory, got 'cloud' "
                                          "(see 'canary dev --help')")


def _join_file(tmp_path: Path, etcd_port: int, redis_port: int) -> Path:
    from controlplane.kernel.dev_join import DevJoin, write_join

    path = tmp_path / "canary-dev.json"
    write_join(path, DevJoin(etcd=f"127.0.0.1:{etcd_port}", etcd_prefix="/canary",
                             redis_url=f"redis://127.0.0.1:{redis_port}/0",
                             sample_keys_file=str(tmp_path / "keys"),
                             api="http://127.0.0.1:8080"))  # fmt: skip
    return path


def test_a_join_file_left_by_a_control_plane_that_is_gone_is_one_line(tmp_path: Path) -> None:
    """`canary dev` killed leaves its join file; a sidecar joining it would retry a dead
    etcd forever, logging, and answer 503."""
    import socket

    from controlplane.cli.sidecar import joined_backends
    from controlplane.kernel.errors import ConfigError

    with socket.socket() as etcd, socket.socket() as redis:
        for listener in (etcd, redis):
            listener.bind(("127.0.0.1", 0))
            listener.listen()
        ports = etcd.getsockname()[1], redis.getsockname()[1]
        alive = _join_file(tmp_path, *ports)
        assert joined_backends(str(alive), etcd=None, etcd_prefix=None, redis=None,
                               sample_keys_file=None).etcd == f"127.0.0.1:{ports[0]}"
    gone = _join_file(tmp_path, *ports)  # the same ports, nothing listening any more
    with pytest.raises(ConfigError) as caught:
        joined_backends(str(gone), etcd=None, etcd_prefix=None, redis=None,
                        sample_keys_file=None)
    assert str(caught.value) == (
        f"join file {gone}: nothing answers at etcd 127.0.0.1:{ports[0]}: is `canary dev` "
        "still running? (one killed leaves its join file behind)"
    )


def test_the_quickstart_service_on_a_port_in_use_says_so_in_one_line() -> None:
    import socket

    script = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "quickstart_service.py"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, str(script), str(port), "1"],
                                capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert result.stderr == (f"quickstart_service.py: cannot listen on 127.0.0.1:{port}: "
                             "Address already in use\n")
