"""JSON logs: one object per line, from the formatter and from the real commands."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from controlplane.kernel.logs import JsonFormatter
from tests.support.processes import free_port

KEYS = {"time", "level", "logger", "message"}


def test_a_record_is_one_json_line_with_its_exception() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter({"worker": 3}))
    logger = logging.getLogger("canary.test.logs")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.warning('two\nlines, "quoted", %s and ünïcode', "an argument")
        try:
            raise ValueError("broken")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == 'two\nlines, "quoted", an argument and ünïcode'
    assert (first["level"], first["logger"], first["worker"]) == ("WARNING", "canary.test.logs", 3)
    assert first["time"].endswith("Z") and "exception" not in first
    assert second["level"] == "ERROR"
    assert "Traceback" in second["exception"] and "ValueError: broken" in second["exception"]


def parse_lines(output: str) -> list[dict[str, object]]:
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines, "the process logged nothing"
    entries = [json.loads(line) for line in lines]  # each line is one object
    for entry in entries:
        assert entry.keys() >= KEYS, entry
    return entries


async def run_until_ready(command: list[str], ready_url: str) -> str:
    """Start `command`, wait until `ready_url` answers 200, SIGTERM it, return stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=3) as client:
            async with asyncio.timeout(30):
                while True:
                    try:
                        if (await client.get(ready_url)).status_code == 200:
                            break
                    except httpx.TransportError:  # not listening yet
                        pass
                    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                    await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, None, 20)
        # uvicorn re-raises the signal once it has shut down cleanly
        assert proc.returncode in (0, -signal.SIGTERM), err
        return err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_the_sidecar_and_its_workers_log_json_lines() -> None:
    port, admin = free_port(), free_port()
    err = await run_until_ready(
        [
            "sidecar",
            "--service",
            "web",
            "--listen",
            f"127.0.0.1:{port}",
            "--admin",
            f"127.0.0.1:{admin}",
            "--etcd",
            "memory://",
            "--redis",
            "memory://",
            "--default-upstream",
            "http://127.0.0.1:9",
            "--workers",
            "2",
            "--log-format",
            "json",
        ],
        f"http://127.0.0.1:{admin}/readyz",
    )
    entries = parse_lines(err)
    assert {entry.get("worker") for entry in entries} >= {0, 1}
    assert any("sidecar for web" in str(entry["message"]) for entry in entries)


async def test_the_dev_control_plane_logs_json_lines_uvicorns_included(tmp_path: Path) -> None:
    port = free_port()
    err = await run_until_ready(
        [
            "dev",
            "--listen",
            f"127.0.0.1:{port}",
            "--db-file",
            str(tmp_path / "c.db"),
            "--log-format",
            "json",
        ],
        f"http://127.0.0.1:{port}/healthz",
    )
    # the admin token is printed for people, on its own lines: everything else is JSON
    logged = "\n".join(
        line
        for line in err.splitlines()
        if "admin token" not in line and "CANARY_TOKEN" not in line
    )
    entries = parse_lines(logged)
    assert any(str(entry["logger"]).startswith("uvicorn") for entry in entries)
    # the polls of /healthz above left no access line: those are opt-in (CANARY_ACCESS_LOG)
    assert not [e for e in entries if e["logger"] == "uvicorn.access"]
    # the dashboard's address is announced as a log entry too, not as a bare line
    assert any(f"dashboard: http://127.0.0.1:{port}/ui/" in str(e["message"]) for e in entries)


def test_an_unknown_log_format_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "collector", "--log-format", "yaml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "log_format" in result.stderr


@pytest.mark.parametrize("command", ["dev", "serve", "collector", "sidecar"])
def test_every_long_running_command_offers_the_flag(command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin"},
    )
    assert "--log-format" in result.stdout


def test_a_structured_record_spreads_its_fields_and_says_its_sentence() -> None:
    record = logging.LogRecord("canary.decisions", logging.INFO, __file__, 1,
                               "event=tripped experiment=7 | tripped …", None, None)
    record.structured = {
        "event": "tripped", "experiment": 7, "summary": "tripped (trip 1 of 3): …",
        "level": "not a level", "values": {"latency": {"observed": 0.4}},
    }  # fmt: skip
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "tripped (trip 1 of 3): …"
    assert (entry["event"], entry["experiment"]) == ("tripped", 7)
    assert entry["values"] == {"latency": {"observed": 0.4}}
    assert entry["level"] == "INFO"  # a field never hides the line's own keys
