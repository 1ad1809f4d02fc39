"""Stopping the child processes a benchmark (or a test) started."""

from __future__ import annotations

import signal
import subprocess


def stop_child(proc: subprocess.Popen[bytes], grace_sec: float = 10.0) -> None:
    """SIGTERM a child that still runs (it drains as in production), SIGKILL it if it
    has not exited after `grace_sec`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_sec)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
