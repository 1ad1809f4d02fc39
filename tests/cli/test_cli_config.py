"""The CLI's config file (TOML: api, token_file, ca_file), its precedence below flags
and the environment, its strictness, and shell completion."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controlplane.cli.main import app
from controlplane.client.config import CliConfig, load_config, parse_config
from controlplane.kernel.errors import ConfigError
from tests.support.auth import ADMIN_TOKEN

runner = CliRunner()


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "xdg" / "canary" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_config_gives_the_api_and_the_token_file(
    api_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CANARY_TOKEN")
    token = tmp_path / "xdg" / "canary" / "admin.token"
    token.parent.mkdir(parents=True)
    token.write_text(ADMIN_TOKEN + "\n")
    token.chmod(0o600)
    write_config(tmp_path, f'api = "{api_url}"\ntoken_file = "admin.token"  # beside it\n')
    listed = runner.invoke(app, ["exp", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    # the environment and the flag come first
    monkeypatch.setenv("CANARY_API", "http://127.0.0.1:1")
    assert runner.invoke(app, ["exp", "list"]).exit_code == 2  # unreachable
    assert runner.invoke(app, ["exp", "list", "--api", api_url]).exit_code == 0


@pytest.mark.parametrize(("text", "says"), [
    ('api = "http://x"\ntoken = "cnry_abc"\n', "unknown keys ['token']"),
    ("api = 8080\n", "api must be a non-empty string"),
    ('api = "ftp://x"\n', "api must be an http:// or https:// URL"),
    ("api = [\n", "not TOML"),
    ('ca_file = ""\n', "ca_file must be a non-empty string"),
    ("cnry_" + "a" * 43 + "\n", "CANARY_CONFIG now names the CLI's config file (TOML); point "
     "CANARY_TOKEN_FILE at the token file"),
])
def test_a_bad_config_is_one_line_for_commands_that_use_it(
    api_url: str, tmp_path: Path, text: str, says: str
) -> None:
    write_config(tmp_path, text)
    result = runner.invoke(app, ["exp", "list", "--api", api_url])
    assert result.exit_code == 2
    assert says in result.stderr and result.stderr.count("\n") == 1
    # commands that never talk to the API do not read it
    assert runner.invoke(app, ["judge", "--help"]).exit_code == 0


def test_canary_config_names_the_file_and_it_must_exist(tmp_path: Path) -> None:
    env = {"CANARY_CONFIG": str(tmp_path / "nope.toml")}
    with pytest.raises(ConfigError, match=r"cannot read the config file .*nope\.toml"):
        load_config(env)
    assert load_config({"XDG_CONFIG_HOME": str(tmp_path)}) == CliConfig()
    named = tmp_path / "team.toml"
    named.write_text('api = "https://canary.example"\nca_file = "/etc/ca.pem"\n')
    assert load_config({"CANARY_CONFIG": str(named)}) == CliConfig(
        api="https://canary.example", ca_file="/etc/ca.pem")


def test_relative_paths_are_taken_from_the_config_folder(tmp_path: Path) -> None:
    config = parse_config('token_file = "t"\nca_file = "ca.pem"\n', source="f", base=tmp_path)
    assert config.token_file == tmp_path / "t" and config.ca_file == str(tmp_path / "ca.pem")


def test_shell_completion_completes_commands() -> None:
    env = {**os.environ, "_CANARY_COMPLETE": "complete_bash", "COMP_WORDS": "canary exp wa",
           "COMP_CWORD": "2", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", "from controlplane.cli.main import run; run()"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["wait", "watch"]
    # the script `canary --install-completion` installs (the shell named, not detected)
    script = subprocess.run(
        [sys.executable, "-c", "from controlplane.cli.main import run; run()"],
        capture_output=True, text=True, timeout=60,
        env={**env, "_CANARY_COMPLETE": "source_bash"},
    )
    assert script.returncode == 0 and "_CANARY_COMPLETE=complete_bash" in script.stdout
    assert "--install-completion" in runner.invoke(app, ["--help"]).stdout
