"""`canary sidecar` as a process: serves, reports ready, stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import httpx
import pytest

from tests.sidecar import upstreams
from tests.support.processes import free_port


async def test_the_command_serves_and_exits_cleanly_on_sigterm() -> None:
    upstream = upstreams.Upstream("default")
    await upstream.start()
    port, admin = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "sidecar", "--service", "web",
         "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}",
         "--etcd", "memory://", "--redis", "memory://", "--default-upstream", upstream.url],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=3) as client:
            async with asyncio.timeout(15):
                while True:
                    try:
                        ready = await client.get(f"http://127.0.0.1:{admin}/readyz")
                        response = await client.get(f"http://127.0.0.1:{port}/echo")
                        break
                    except httpx.TransportError:  # not listening yet
                        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                        await asyncio.sleep(0.05)
        assert ready.status_code == 200
        assert response.status_code == 200
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
