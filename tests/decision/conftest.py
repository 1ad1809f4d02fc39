"""One quick `canary bench decision` run for the session, read by every test that
checks its report.

The quick run simulates a few hundred rollouts (a minute of one core); two tests
running it each would pay twice for the same deterministic report (every run draws
from its own seed). Under pytest-xdist the first worker to need it runs it and
leaves the report as JSON beside the workers' temporary folders (under a lock);
any other worker reads that file.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pytest

from controlplane.benchmarks.decision import run


def _quick_report() -> dict[str, Any]:
    result = run(quick=True, progress=False)
    # the saved report is JSON: no NaN or infinity may reach it (raises otherwise)
    text = json.dumps(result, allow_nan=False)
    report: dict[str, Any] = json.loads(text)
    return report


@pytest.fixture(scope="session")
def quick_decision_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The report of `run(quick=True)`, as the JSON `canary bench decision` saves."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return _quick_report()
    # the session's folder, shared by its workers (each has its own folder inside)
    shared: Path = tmp_path_factory.getbasetemp().parent / "decision-quick-report.json"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if shared.is_file():
            cached: dict[str, Any] = json.loads(shared.read_text())
            return cached
        report = _quick_report()
        shared.write_text(json.dumps(report, allow_nan=False))
        return report
