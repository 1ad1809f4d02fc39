"""Another revision of the code, unpacked to run beside this one in the same benchmark
(`git archive` of `controlplane` and `sidecar`; put first on PYTHONPATH)."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

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
