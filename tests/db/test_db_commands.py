"""`canary db upgrade|current|downgrade` from any directory, URL given by flag or env."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controlplane.cli.main import app
from controlplane.db import migrate


def test_db_commands_walk_the_revisions(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no alembic.ini anywhere near
    runner = CliRunner()
    flag = ["--database-url", sqlite_url]

    current = runner.invoke(app, ["db", "current", *flag])
    assert current.exit_code == 0, current.output
    assert current.output.startswith("base") and "behind" in current.output

    upgraded = runner.invoke(app, ["db", "upgrade", *flag])
    assert upgraded.exit_code == 0, upgraded.output
    assert f"revision {migrate.head(sqlite_url)}" in upgraded.output

    monkeypatch.setenv("CANARY_DATABASE_URL", sqlite_url)
    assert "up to date" in runner.invoke(app, ["db", "current"]).output

    downgraded = runner.invoke(app, ["db", "downgrade", "base"])
    assert downgraded.exit_code == 0, downgraded.output
    assert "base" in downgraded.output
    assert os.listdir(elsewhere) == []  # nothing written into the cwd
