"""The layering, enforced: every module's imports, read from its syntax tree.

- the sidecar imports nothing of the API, the database or the controller, and
  neither do the traffic routers (routers/): a router never writes SQL or decides;
- the decision core imports no adapter (database, etcd, Redis, API, SQLAlchemy);
- the API imports no controller internals; the controller no API helpers and no
  helpers of the API's actions (experiments.actions);
- the API and the experiments package import no key-value store: they commit to SQL,
  and the leader's reconciler is etcd's one writer;
- only controlplane/db/ (and the migrations) import SQLAlchemy. The modules still
  listed in SQLALCHEMY_PENDING take sessions from db/ and are to move behind the
  store; the list may only shrink (a listed module that no longer imports it fails).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("controlplane", "sidecar", "routers")

SQLALCHEMY_PENDING: frozenset[str] = frozenset()


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports in functions count)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


MODULES = {
    module_name(path): imports_of(path)
    for package in PACKAGES
    for path in sorted((ROOT / package).rglob("*.py"))
}


def offending(name_prefix: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad: dict[str, list[str]] = {}
    for module, imported in MODULES.items():
        if module != name_prefix and not module.startswith(f"{name_prefix}."):
            continue
        hits = sorted(
            i for i in imported if any(i == f or i.startswith(f"{f}.") for f in forbidden)
        )
        if hits:
            bad[module] = hits
    return bad


def test_the_modules_were_found() -> None:
    assert "sidecar.routing" in MODULES and "controlplane.decision.rollout" in MODULES
    assert "controlplane.db.routes" in MODULES


def test_the_sidecar_imports_no_api_database_or_controller() -> None:
    assert offending("sidecar", (
        "controlplane.api", "controlplane.db", "controlplane.controller",
        "controlplane.experiments", "sqlalchemy", "fastapi",
    )) == {}


def test_the_routers_import_no_api_database_controller_or_decision() -> None:
    assert "routers.agent" in MODULES
    assert offending("routers", (
        "controlplane.api", "controlplane.db", "controlplane.controller",
        "controlplane.experiments", "controlplane.decision", "controlplane.collector",
        "sqlalchemy", "fastapi",
    )) == {}


def test_the_decision_core_imports_no_adapter() -> None:
    assert offending("controlplane.decision", (
        "controlplane.db", "controlplane.api", "controlplane.kernel.kv_etcd",
        "controlplane.kernel.streams_redis", "controlplane.controller", "sqlalchemy",
        "fastapi", "etcd3aio", "redis",
    )) == {}


def test_the_api_imports_no_controller_and_the_controller_no_api_or_actions() -> None:
    assert offending("controlplane.api", ("controlplane.controller",)) == {}
    assert offending("controlplane.controller", (
        "controlplane.api", "controlplane.experiments.actions",
    )) == {}


def test_the_api_and_its_actions_import_no_key_value_store() -> None:
    # the leader's reconciler is etcd's one writer: what the API commits goes to SQL
    kv_modules = (
        "controlplane.kernel.kv", "controlplane.kernel.kv_etcd", "controlplane.kernel.kv_memory",
        "controlplane.kernel.kv_factory", "etcd3aio",
    )
    assert offending("controlplane.api", kv_modules) == {}
    assert offending("controlplane.experiments", kv_modules) == {}


def test_only_the_database_layer_imports_sqlalchemy() -> None:
    users = set(offending("controlplane", ("sqlalchemy",))) | set(
        offending("sidecar", ("sqlalchemy",))
    )
    outside = {m for m in users if not m.startswith("controlplane.db")}
    assert outside - SQLALCHEMY_PENDING == set(), "a new SQLAlchemy user outside db/"
    assert SQLALCHEMY_PENDING - outside == set(), "moved behind db/: drop it from the list"


@pytest.mark.parametrize("source", [
    "import sqlalchemy\n",
    "from sqlalchemy.orm import Session\n",
    "def f():\n    from sqlalchemy import select\n",
])
def test_the_walk_sees_every_form_of_import(source: str, tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    assert any(i == "sqlalchemy" or i.startswith("sqlalchemy.") for i in imports_of(path))
