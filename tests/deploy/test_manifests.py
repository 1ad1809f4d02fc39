"""What deploy/ ships must start: every `canary …` command line (the chart's, the
sidecar patch's, compose's, systemd's) using options the CLI has, every CANARY_*
variable one a process reads, and the compose secrets script making files the product
loads. The Kubernetes objects themselves are checked in test_chart.py."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from controlplane.cli.main import app
from controlplane.kernel import sample_keys
from controlplane.kernel.secrets import read_secret_file
from controlplane.kernel.settings import Settings
from controlplane.kernel.tls import client_context, server_context
from tests.deploy.render import DEPLOY, VALUES, chart, containers, injected_example, patched_example

# variables read outside Settings: the sample keys and the CLI's own
OTHER_VARIABLES = {
    sample_keys.FILE_ENV,
    sample_keys.KEYS_ENV,
    "CANARY_TOKEN",
    "CANARY_CONFIG",
    "CANARY_TOKEN_FILE",
    "CANARY_SIDECAR_MAX_CONNECTIONS",
    "CANARY_SIDECAR_TLS_CERT",
    "CANARY_SIDECAR_TLS_KEY",
}


def command_lines() -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of every canary invocation deploy/ writes down."""
    renderings = {f"chart {name}": chart(name) for name in VALUES}
    renderings["sidecar-patch.yaml"] = patched_example()
    renderings["canary inject"] = injected_example()
    for where, found in renderings.items():
        for document in found:
            for container in containers(document):
                command = container.get("command") or []
                if command[:1] == ["canary"]:
                    yield f"{where}:{container['name']}", command
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        words = [service.get("entrypoint"), service.get("command")]
        text = " ".join(w if isinstance(w, str) else " ".join(w or []) for w in words)
        for line in re.findall(r"\bcanary (?:serve|collector|sidecar|db|token)\b[^&'\n]*", text):
            yield f"compose:{name}", shlex.split(line)
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        for line in path.read_text().splitlines():
            if line.startswith(("ExecStart=", "ExecStartPre=")):
                argv = shlex.split(line.split("=", 1)[1])
                yield f"{path.name}", ["canary", *argv[1:]]


# typer may carry its own copy of click: ask for subcommands, not for a click class
def _subcommands(command: Any) -> dict[str, Any]:
    return getattr(command, "commands", {})


def _options_of(command: Any) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


@pytest.mark.parametrize(("where", "argv"), list(command_lines()))
def test_every_command_line_uses_options_the_cli_has(where: str, argv: list[str]) -> None:
    root = typer.main.get_command(app)
    command: Any = root
    known = _options_of(root)
    words = iter(argv[1:])
    for word in words:
        if word.startswith("-"):
            option = word.split("=", 1)[0]
            assert option in known, f"{where}: {' '.join(argv[:3])} has no option {option}"
            continue
        if word in _subcommands(command):
            command = _subcommands(command)[word]
            known = _options_of(command)
    assert command is not root, f"{where}: no canary command in {argv}"


def variables() -> Iterator[tuple[str, str]]:
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.suffix in {".yaml", ".service", ".example", ".sh"}:
            for name in re.findall(r"\bCANARY_[A-Z_]+\b", path.read_text()):
                yield path.name, name


@pytest.mark.parametrize(("where", "name"), sorted(set(variables())))
def test_every_variable_is_one_a_process_reads(where: str, name: str) -> None:
    settings = {f"CANARY_{field.upper()}" for field in Settings.model_fields}
    assert name in settings | OTHER_VARIABLES, f"{where}: nothing reads {name}"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_the_compose_secrets_are_what_the_product_loads(tmp_path: Path) -> None:
    out = tmp_path / "secrets"
    for _ in range(2):  # the second run keeps what the first made
        subprocess.run(
            ["bash", str(DEPLOY / "compose" / "secrets.sh"), str(out)],
            check=True, capture_output=True,
        )  # fmt: skip
    for name in ("api", "etcd", "redis"):
        server_context(cert_file=str(out / f"{name}.pem"), key_file=str(out / f"{name}-key.pem"))
    client_context(ca_file=str(out / "ca.pem"))
    keys = sample_keys.load_sample_keys(str(out / "sample_keys"))
    assert keys is not None
    for name in ("etcd_password", "redis_password", "admin_token"):
        assert len(read_secret_file(str(out / name), what=name)) >= 32
    assert (out.stat().st_mode & 0o077) == 0
