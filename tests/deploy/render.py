"""What deploy/ becomes once its tools have run: the chart rendered by `helm template`
with each values file, the sidecar and Service patches applied by `kubectl patch
--local`, the example injected by `canary inject`. The tools
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
# the defaults, the trial profile, then each file of the chart's ci/ folder
VALUES: dict[str, list[str]] = {
    "default": [],
    "trial": [str(CHART / "values-trial.yaml")],
    **{path.stem: [str(path)] for path in sorted((CHART / "ci").glob("*-values.yaml"))},
}
# the example's own application container: not ours to harden or probe
EXAMPLE_APP = "payment-api"


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
def _patched(kind: str, patch: str) -> str:
    example = documents((KUBERNETES / "sidecar-example.yaml").read_text())
    document = next(doc for doc in example if doc["kind"] == kind)
    return run(
        tool("kubectl"), "patch", "--local", "--output=yaml", "--filename=-",
        f"--patch-file={KUBERNETES / patch}", stdin=yaml.safe_dump(document),
    )  # fmt: skip


def patched_example() -> list[dict[str, Any]]:
    """sidecar-example.yaml patched by sidecar-patch.yaml and service-patch.yaml."""
    return [
        *documents(_patched("Deployment", "sidecar-patch.yaml")),
        *documents(_patched("Service", "service-patch.yaml")),
    ]


def injected_example() -> list[dict[str, Any]]:
    """sidecar-example.yaml through `canary inject` with its defaults."""
    from controlplane.injection import manifests
    from controlplane.injection.inject import Request, inject

    example = manifests.parse((KUBERNETES / "sidecar-example.yaml").read_text(), source="example")
    return [doc for doc in inject(example, Request()).documents if doc]


def pod_spec(document: dict[str, Any]) -> dict[str, Any] | None:
    if document.get("kind") in {"Deployment", "StatefulSet", "DaemonSet"}:
        spec: dict[str, Any] = document["spec"]["template"]["spec"]
        return spec
    return None


def containers(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = pod_spec(document) or {}
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])
