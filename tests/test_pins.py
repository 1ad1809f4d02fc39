"""The pins (constraints.txt, decision 0054): the virtualenv the suite runs in is the
lock, every declared dependency is pinned inside its bounds, and every install
(Makefile, images) takes them; scripts/lock.py's closure on tables."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def _load_lock() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lock", ROOT / "scripts" / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lock"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


lock = _load_lock()
PINS = lock.parse((ROOT / "constraints.txt").read_text())


def test_the_virtualenv_the_suite_runs_in_is_the_lock() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lock.py"), "--check"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _declared() -> list[Requirement]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    texts = [*pyproject["project"]["dependencies"], *pyproject["build-system"]["requires"]]
    for extra in pyproject["project"]["optional-dependencies"].values():
        texts.extend(extra)
    sidecar = (ROOT / "deploy" / "images" / "sidecar-requirements.txt").read_text()
    texts.extend(line for line in sidecar.splitlines() if line and not line.startswith("#"))
    found = [Requirement(text) for text in texts]
    # the project's own extra, and wheel, which only pip's isolated build env installs
    return [r for r in found if r.name not in {"canary", "wheel"}]


@pytest.mark.parametrize("requirement", _declared(), ids=str)
def test_every_declared_dependency_is_pinned_inside_its_bounds(requirement: Requirement) -> None:
    if requirement.marker is not None and not requirement.marker.evaluate():
        pytest.skip(f"not for this platform: {requirement.marker}")
    pinned = PINS.get(canonicalize_name(requirement.name))
    assert pinned is not None, f"{requirement.name} is not in constraints.txt: run `make lock`"
    assert requirement.specifier.contains(pinned, prereleases=True), (requirement, pinned)


def _pip_installs(text: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", text)
    return [line for line in joined.splitlines() if re.search(r"pip install", line)]


def test_the_makefile_installs_at_the_pins_and_lints_them() -> None:
    makefile = (ROOT / "Makefile").read_text()
    installs = _pip_installs(makefile)
    # `make upgrade` alone ignores them, on purpose: it is how they move
    pinned = [line for line in installs if "--upgrade-strategy eager" not in line]
    assert len(pinned) == 2 and all("--constraint $(CONSTRAINTS)" in line for line in pinned)
    assert "CONSTRAINTS := constraints.txt" in makefile
    assert re.search(r"^lint: .*\n(\t.*\n)*\t\$\(PY\) scripts/lock.py --check$", makefile, re.M)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci.index("make lint") < ci.index("make test")


@pytest.mark.parametrize("name", ["control-plane.Dockerfile", "sidecar.Dockerfile"])
def test_the_images_install_at_the_pins(name: str) -> None:
    text = (ROOT / "deploy" / "images" / name).read_text()
    installs = [line for line in _pip_installs(text) if "--no-deps" not in line]
    assert installs and all("--constraint constraints.txt" in line for line in installs)
    assert re.search(r"^COPY constraints.txt ", text, re.M)


def _table(**dists: tuple[str, list[str]]) -> object:
    def installed(name: str) -> object:
        found = dists.get(name.replace("-", "_"))
        if found is None:
            return None
        return lock.Installed(found[0], tuple(Requirement(r) for r in found[1]))

    return installed


def test_the_closure_follows_requirements_extras_and_markers() -> None:
    installed = _table(
        app=("1.0", ["lib>=2", "winonly; sys_platform == 'win32'", "fast[speed]"]),
        lib=("2.3", ["tiny"]),
        tiny=("0.1", []),
        fast=("5.0", ["accel; extra == 'speed'", "docs; extra == 'docs'"]),
        accel=("1.1", []),
    )
    pins = lock.closure([Requirement("app")], installed)
    assert pins == {"app": "1.0", "lib": "2.3", "tiny": "0.1", "fast": "5.0", "accel": "1.1"}


def test_the_closure_refuses_a_needed_distribution_that_is_not_installed() -> None:
    installed = _table(app=("1.0", ["gone>=1"]))
    with pytest.raises(lock.LockError, match="gone>=1 is needed but not installed"):
        lock.closure([Requirement("app")], installed)


def test_a_lock_reads_back_as_written_and_refuses_a_loose_line() -> None:
    pins = {canonicalize_name("Zeta_Pkg"): "1.0", canonicalize_name("alpha"): "2.0.post1"}
    text = lock.render(pins)
    assert text.splitlines()[-2:] == ["alpha==2.0.post1", "zeta-pkg==1.0"]
    assert lock.parse(text) == pins
    for loose in ("alpha>=2", "alpha==2; python_version < '3.12'", "alpha==2,<3"):
        with pytest.raises(lock.LockError, match="not an exact pin"):
            lock.parse(loose)


def test_the_project_roots_expand_its_own_extra() -> None:
    names = {canonicalize_name(r.name) for r in lock.project_roots(ROOT / "pyproject.toml")}
    assert {"fastapi", "pytest", "playwright", "mypy", "ruff", "pip", "setuptools"} <= names
    assert "canary" not in names
