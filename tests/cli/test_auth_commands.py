"""`canary token …` on the database, `canary serve` refusing to start without
authentication, and the CLI's one line for 401/403."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from controlplane.auth.roles import Role
from controlplane.cli.main import app, main
from controlplane.db import migrate
from tests.support.auth import TOKENS, bearer

runner = CliRunner()


@pytest.fixture
def database(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'canary.db'}"
    migrate.upgrade(url)
    return url


def test_serve_without_authentication_exits_1_with_one_line(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["serve", "--database-url", database, "--listen", "127.0.0.1:0"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("canary serve: no authentication configured")


def test_token_create_list_revoke_on_the_database(database: str, api_url: str) -> None:
    made = runner.invoke(app, ["token", "create", "--name", "ci", "--role", "operator",
                               "--database-url", database])  # fmt: skip
    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    assert token.startswith("cnry_") and "shown only this once" in made.stderr

    listed = runner.invoke(app, ["token", "list", "--database-url", database])
    assert "ci" in listed.stdout and "operator" in listed.stdout and token not in listed.stdout
    line = next(row for row in listed.stdout.splitlines() if " ci " in row)
    assert re.search(r" created \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ by ", line), line
    assert "+00:00" not in line and "used never, live" in line

    again = runner.invoke(app, ["token", "create", "--name", "ci", "--role", "admin",
                                "--database-url", database])  # fmt: skip
    assert again.exit_code == 1 and "revoke it first" in again.stderr

    revoked = runner.invoke(app, ["token", "revoke", "ci", "--database-url", database])
    assert revoked.exit_code == 0 and "revoked" in revoked.stdout
    assert "ci" not in runner.invoke(app, ["token", "list", "--database-url", database]).stdout

    bad_role = runner.invoke(app, ["token", "create", "--name", "x", "--role", "root",
                                   "--database-url", database])  # fmt: skip
    assert bad_role.exit_code == 2 and "unknown role" in bad_role.stderr


def test_a_role_too_low_is_one_line_naming_the_role_and_exit_1(
    api_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANARY_TOKEN", TOKENS[Role.VIEWER])
    result = runner.invoke(app, ["exp", "abort", "1", "--api", api_url])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs the operator role" in lines[0]


def test_no_token_is_one_line_saying_where_to_put_one(
    api_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CANARY_TOKEN")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "absent"))
    result = runner.invoke(app, ["exp", "list", "--api", api_url])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs the viewer role" in lines[0] and "CANARY_TOKEN" in lines[0]


def test_the_token_comes_from_the_token_file_or_the_config_file(
    api_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CANARY_TOKEN")
    token_file = tmp_path / "token"
    token_file.write_text(bearer()["Authorization"].split()[1] + "\n")
    token_file.chmod(0o600)
    listed = runner.invoke(app, ["--token-file", str(token_file), "exp", "list", "--api", api_url])
    assert listed.exit_code == 0, listed.output
    monkeypatch.setenv("CANARY_TOKEN_FILE", str(token_file))
    assert runner.invoke(app, ["exp", "list", "--api", api_url]).exit_code == 0
    token_file.write_text("two\nlines\n")
    broken = runner.invoke(app, ["exp", "list", "--api", api_url])
    assert broken.exit_code == 2 and "one token on one line" in broken.stderr
    assert httpx.get(f"{api_url}/healthz").status_code == 200  # health needs no token
