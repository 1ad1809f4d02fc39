"""`canary sidecar` as a process: serves, reports ready, stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.sidecar import upstreams
from tests.support.processes import free_port


@pytest.mark.parametrize("workers", [1, 2])
async def test_the_command_serves_and_exits_cleanly_on_sigterm(workers: int) -> None:
    upstream = upstreams.Upstream("default")
    await upstream.start()
    port, admin = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "sidecar", "--service", "web",
         "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}",
         "--etcd", "memory://", "--redis", "memory://", "--default-upstream", upstream.url,
         "--workers", str(workers)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=3) as client:
            async with asyncio.timeout(15):
                while True:
                    try:
                        ready = await client.get(f"http://127.0.0.1:{admin}/readyz")
                        if ready.status_code == 200:  # every worker listens
                            break
                    except httpx.TransportError:  # the admin endpoint is not up yet
                        pass
                    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                    await asyncio.sleep(0.05)
            response = await client.get(f"http://127.0.0.1:{port}/echo")
        assert response.status_code == 200
        # one worker: the command is the proxy itself; more: a supervisor and its workers
        assert len(children(proc.pid)) == (0 if workers == 1 else workers)
        assert response.headers["x-canary-variant"] == "default"
        proc.send_signal(signal.SIGTERM)
        returncode = await asyncio.to_thread(proc.wait, 15)
        output = proc.stdout.read().decode() if proc.stdout else ""
        assert returncode == 0, output
        assert "Traceback" not in output, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        await upstream.stop()


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def sidecar_command(
    *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "sidecar", "--service", "web",
         "--etcd", "memory://", "--redis", "memory://", *flags],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("value", ["0", "-1", "100000", "two", ""])
def test_a_bad_workers_value_exits_2_with_one_line(value: str) -> None:
    result = sidecar_command("--listen", f"127.0.0.1:{free_port()}", "--workers", value)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "--workers" in result.stderr


def test_a_bad_workers_value_from_the_environment_is_refused_alike() -> None:
    result = sidecar_command(
        "--listen", f"127.0.0.1:{free_port()}", env={"CANARY_SIDECAR_WORKERS": "0"}
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "--workers must be between 1 and" in result.stderr


def test_a_port_in_use_is_one_line_before_any_worker_starts() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = sidecar_command("--listen", f"127.0.0.1:{port}", "--workers", "2")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"canary sidecar: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_a_port_in_use_is_one_line_with_one_worker_too() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = sidecar_command("--listen", f"127.0.0.1:{port}", "--workers", "1")
    assert result.returncode == 2, result.stderr
    # the startup log may come first; the error is one line, with no traceback
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("canary sidecar: cannot listen: ")
    assert str(port) in last and "address already in use" in last.lower()


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (
            ["--max-connections", "100", "--max-tunnels", "101"],
            "--max-tunnels must be between 1 and 100 (--max-connections), got 101",
        ),
        (["--max-tunnels", "0"], "--max-tunnels must be between 1 and"),
        (
            ["--tunnel-idle-timeout", "0"],
            "--tunnel-idle-timeout must be a positive number of seconds, got 0.0",
        ),
    ],
)
def test_bad_tunnel_flags_are_a_one_line_error(flags: list[str], error: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "sidecar", "--service", "web",
         "--listen", "127.0.0.1:0", *flags],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"canary sidecar: {error}"), line


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--max-connections-per-client", "-1"], "--max-connections-per-client must be 0"),
        (["--client-ipv6-prefix", "16"], "--client-ipv6-prefix must be between 32 and 128"),
        (["--max-headers", "0"], "--max-headers must be between 1 and 10000, got 0"),
        (["--tls-handshake-timeout", "0"], "--tls-handshake-timeout must be a positive"),
    ],
)
def test_bad_client_limit_flags_are_a_one_line_error(flags: list[str], error: str) -> None:
    result = sidecar_command("--listen", "127.0.0.1:0", *flags)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"canary sidecar: {error}"), line
