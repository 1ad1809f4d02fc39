"""Another revision of the code, unpacked to run beside this one in the same benchmark
(`git archive` of `controlplane` and `sidecar`; put first on PYTHONPATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def unpack_revision(tmp: Path, rev: str) -> tuple[Path, str] | str:
    """(the tree unpacked under `tmp`, its short commit id), or why it is not at hand."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        return "not a git checkout"
    archive = tmp / "before.tar"
    with archive.open("wb") as out:
        done = subprocess.run(
            [git, "-C", str(ROOT), "archive", "--format=tar", rev, "controlplane", "sidecar"],
            stdout=out, stderr=subprocess.PIPE, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        return f"git archive {rev} failed: {done.stderr.decode(errors='replace').strip()}"
    tree = tmp / "before"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    commit = subprocess.run(
        [git, "-C", str(ROOT), "rev-parse", "--short", rev],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    return tree, commit


def ratios(now: dict[str, Any], other: dict[str, Any]) -> dict[str, float]:
    """now / other for each figure both have (other's not 0)."""
    return {key: round(now[key] / other[key], 3) for key in now if other.get(key)}


def measure_before(result: dict[str, Any], measure: Callable[[Path], dict[str, Any]]) -> None:
    """With `CANARY_BENCH_BEFORE=<git revision>`: that revision's figures by
    `measure(tree)` in result["before"], and result["now"] over them."""
    rev = os.environ.get("CANARY_BENCH_BEFORE")
    if not rev:
        return
    with tempfile.TemporaryDirectory(prefix="canary-bench-") as tmp:
        unpacked = unpack_revision(Path(tmp), rev)
        if isinstance(unpacked, str):
            result["before"] = None
            result["notes"] = [f"no before: {unpacked}"]
            return
        tree, result["before_commit"] = unpacked
        before = measure(tree)
    result["before"] = before
    result["now_over_before"] = ratios(result["now"], before)
