"""The two images: Dockerfiles clean for hadolint, multi-stage, running as the user the
manifests expect; the sidecar image's dependencies a subset of the project's, and
enough for everything the sidecar imports (checked in a child interpreter that refuses
every other installed distribution)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.deploy.render import DEPLOY, chart, patched_example, pod_spec, run, tool

IMAGES = DEPLOY / "images"
DOCKERFILES = sorted(IMAGES.glob("*.Dockerfile"))
ROOT = DEPLOY.parent


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    found = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def test_there_is_one_image_per_process_kind() -> None:
    assert [path.name for path in DOCKERFILES] == ["control-plane.Dockerfile",
                                                   "sidecar.Dockerfile"]  # fmt: skip


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(path: Path) -> None:
    out = run(tool("hadolint"), "--no-color", "--failure-threshold=info", str(path))
    assert out.strip() == ""


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_is_multi_stage_and_runs_as_the_manifests_user(path: Path) -> None:
    steps = instructions(path)
    stages = [rest for keyword, rest in steps if keyword == "FROM"]
    assert len(stages) >= 2 and stages[0].endswith(" AS build")
    final = steps[max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM") :]
    (user,) = [rest for keyword, rest in final if keyword == "USER"]
    assert user == "10001:10001"
    # the run stage installs nothing: only what the build stage made is copied in
    assert not any(keyword == "RUN" and "pip" in rest for keyword, rest in final)
    assert any(keyword == "COPY" and rest.startswith("--from=build") for keyword, rest in final)
    users = set()
    for document in [*chart("default"), *patched_example()]:
        spec = pod_spec(document) or {}
        for container in spec.get("containers", []):
            merged = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
            if container.get("command", [])[:1] == ["canary"]:
                users.add((merged["runAsUser"], merged["runAsGroup"]))
    assert users == {(10001, 10001)}


def sidecar_requirements() -> list[Requirement]:
    lines = (IMAGES / "sidecar-requirements.txt").read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


def test_the_sidecar_requirements_are_the_projects_own() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {Requirement(text).name: str(Requirement(text)) for text in project["dependencies"]}
    for requirement in sidecar_requirements():
        assert str(requirement) == declared.get(requirement.name), requirement.name
    names = {requirement.name for requirement in sidecar_requirements()}
    assert not names & {"numpy", "scipy", "sqlalchemy", "alembic", "fastapi", "uvicorn"}


# In the child: refuse any top-level module of an installed distribution outside the
# sidecar's closure, then load what `canary sidecar` loads.
CHILD = r"""
import importlib, importlib.abc, importlib.metadata as md, pkgutil, sys
from packaging.requirements import Requirement

wanted = [Requirement(line) for line in sys.argv[1:]]
allowed, queue = set(), list(wanted)
while queue:
    req = queue.pop()
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    name = req.name.lower().replace("_", "-")
    extras = set(req.extras)
    try:
        dist = md.distribution(req.name)
    except md.PackageNotFoundError:
        continue
    key = (name, frozenset(extras))
    if key in allowed:
        continue
    allowed.add(key)
    for text in dist.requires or []:
        sub = Requirement(text)
        if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras | {""}):
            queue.append(sub)
names = {n for n, _ in allowed} | {"canary"}
owners = md.packages_distributions()
refused = {top for top, dists in owners.items()
           if not any(d.lower().replace("_", "-") in names for d in dists)}
refused -= {"controlplane", "sidecar", "migrations", "_distutils_hack", "pkg_resources",
            "setuptools", "_pytest", "pytest", "packaging"}

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in refused:
            raise ImportError(f"not in the sidecar image: {fullname}")
        return None

sys.meta_path.insert(0, Refuse())
for probe in ("numpy", "sqlalchemy", "fastapi"):
    try:
        importlib.import_module(probe)
    except ImportError:
        pass
    else:
        raise SystemExit(f"the guard let {probe} in")
import controlplane.cli.main, controlplane.cli.sidecar, controlplane.tracer
import controlplane.kernel.kv_etcd, controlplane.kernel.streams_redis
# what the sidecar command's body imports when it runs
import controlplane.kernel.admin_access, controlplane.kernel.logs
import controlplane.kernel.sample_keys, controlplane.kernel.settings
import controlplane.kernel.kv_factory, controlplane.kernel.streams_factory
import opentelemetry.exporter.otlp.proto.http.trace_exporter
import sidecar
for module in pkgutil.walk_packages(sidecar.__path__, "sidecar."):
    importlib.import_module(module.name)
from typer.testing import CliRunner
result = CliRunner().invoke(controlplane.cli.main.app, ["sidecar", "--help"])
assert result.exit_code == 0, result.output
print("ok")
"""


def test_the_sidecar_runs_on_its_requirements_alone() -> None:
    argv = [sys.executable, "-c", CHILD, *(str(r) for r in sidecar_requirements())]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_guard_refuses_what_the_requirements_leave_out() -> None:
    argv = [sys.executable, "-c", CHILD, "pydantic>=2.7"]  # far too little
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0 and "not in the sidecar image" in done.stderr
