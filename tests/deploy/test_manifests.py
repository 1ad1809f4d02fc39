"""What deploy/ ships must start: Kubernetes manifests valid against the API schema,
every `canary …` command line using options the CLI has, every CANARY_* variable one
a process reads, and the compose secrets script making files the product loads."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from controlplane.cli.main import app
from controlplane.kernel import sample_keys
from controlplane.kernel.secrets import read_secret_file
from controlplane.kernel.settings import Settings
from controlplane.kernel.tls import client_context, server_context

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.30"
# variables read outside Settings: the sample keys and the CLI's own
OTHER_VARIABLES = {
    sample_keys.FILE_ENV,
    sample_keys.KEYS_ENV,
    "CANARY_TOKEN",
    "CANARY_CONFIG",
    "CANARY_SIDECAR_MAX_CONNECTIONS",
    "CANARY_SIDECAR_TLS_CERT",
    "CANARY_SIDECAR_TLS_KEY",
}


def k8s_documents() -> Iterator[Any]:
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield pytest.param(document, id=f"{path.name}:{document['kind']}")


@pytest.mark.parametrize("document", list(k8s_documents()))
def test_kubernetes_manifests_are_valid(document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def command_lines() -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of every canary invocation deploy/ writes down."""
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            for container in _containers(document):
                command = container.get("command") or []
                if command[:1] == ["canary"]:
                    yield f"{path.name}:{container['name']}", command
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        command = service.get("command")
        text = command if isinstance(command, str) else " ".join(command or [])
        for line in re.findall(r"\bcanary (?:serve|collector|sidecar|db|token)\b[^&'\n]*", text):
            yield f"compose:{name}", shlex.split(line)
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        for line in path.read_text().splitlines():
            if line.startswith(("ExecStart=", "ExecStartPre=")):
                argv = shlex.split(line.split("=", 1)[1])
                yield f"{path.name}", ["canary", *argv[1:]]


def _containers(document: Any) -> list[dict[str, Any]]:
    spec = (document or {}).get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


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
