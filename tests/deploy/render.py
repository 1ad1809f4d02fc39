"""What deploy/ becomes once its tools have run: the chart rendered by `helm template`
with each values file, the sidecar patch applied by `kubectl patch --local`. The tools
come from the virtualenv (scripts/install-k8s-tools.sh) or PATH; without them the tests
skip, except in CI, where a missing tool is a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CHART = DEPLOY / "helm" / "canary"
KUBERNETES = DEPLOY / "kubernetes"
RELEASE, NAMESPACE = "canary", "canary"
# the defaults, then each file of the chart's ci/ folder
VALUES: dict[str, list[str]] = {
    "default": [],
    **{path.stem: [str(path)] for path in sorted((CHART / "ci").glob("*-values.yaml"))},
}


def tool(name: str) -> str:
    """The path of helm, kubectl, hadolint, docker-compose: beside the interpreter first."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing: run scripts/install-k8s-tools.sh (make install)")
        pytest.skip(f"needs {name} (scripts/install-k8s-tools.sh)", allow_module_level=True)
    return found


def run(*argv: str, stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stderr}"
    return done.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@cache
def _rendered(values: str, *extra: str) -> str:
    files = [arg for path in VALUES[values] for arg in ("--values", path)]
    return run(
        tool("helm"), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *files, *extra
    )


def chart(values: str = "default", *extra: str) -> list[dict[str, Any]]:
    """The chart's objects with one of VALUES (and more `--set` arguments)."""
    return documents(_rendered(values, *extra))


@cache
def _patched() -> str:
    example = documents((KUBERNETES / "sidecar-example.yaml").read_text())
    deployment = next(doc for doc in example if doc["kind"] == "Deployment")
    return run(
        tool("kubectl"), "patch", "--local", "--output=yaml", "--filename=-",
        f"--patch-file={KUBERNETES / 'sidecar-patch.yaml'}",
        stdin=yaml.safe_dump(deployment),
    )  # fmt: skip


def patched_example() -> list[dict[str, Any]]:
    """sidecar-example.yaml with its Deployment patched by sidecar-patch.yaml."""
    example = documents((KUBERNETES / "sidecar-example.yaml").read_text())
    patched = documents(_patched())
    return [*patched, *(doc for doc in example if doc["kind"] != "Deployment")]


def pod_spec(document: dict[str, Any]) -> dict[str, Any] | None:
    if document.get("kind") in {"Deployment", "StatefulSet", "DaemonSet"}:
        spec: dict[str, Any] = document["spec"]["template"]["spec"]
        return spec
    return None


def containers(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = pod_spec(document) or {}
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])
