"""Which build of the proxy's per-request modules runs: compiled or pure Python.

The modules in `MODULES` are plain typed Python, and `setup.py` also compiles them
with mypyc into extension modules beside their sources (decision 0034): the same
code with a fraction of the interpreter's work per request. Python would import an
extension before its source whenever both are there, so this module decides first:

- the compiled ones run only if every module of `MODULES` has its extension and the
  manifest the build wrote (`MANIFEST`) holds the hash of each module's source as it
  is now: an edited source, a half-finished build or a build of another revision
  means pure Python for all of them, never a mix (compiled modules call each other
  natively and would keep using each other's old code);
- `CANARY_PURE_PYTHON=1` forces pure Python (tests run the proxy both ways with it).

It is imported by `sidecar/__init__.py`, before any of those modules, and is itself
never compiled. It reads the sources once at start-up (about 100 KB). Any other
`sidecar` module is always imported from its source.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

# the per-request path of an HTTP/1.1 exchange, and nothing else: no HTTP/2, no
# tunnels, no start-up code; `sidecar.choice` for the choice and sample types that
# path reads per request (decision 0036). Compiled as one group (one shared library).
MODULES: tuple[str, ...] = (
    "sidecar.choice",
    "sidecar.proxy.client",
    "sidecar.proxy.conformance",
    "sidecar.proxy.corking",
    "sidecar.proxy.exchange",
    "sidecar.proxy.head_cache",
    "sidecar.proxy.headers",
    "sidecar.proxy.metrics",
    "sidecar.proxy.pausing",
    "sidecar.proxy.samples",
    "sidecar.proxy.server",
    "sidecar.proxy.trailers",
    "sidecar.proxy.upgrades",
    "sidecar.proxy.upstream",
)
# the shared library mypyc builds for the group, inside the package (a top-level
# module would not be importable from an editable install)
GROUP = "sidecar.proxy._compiled"
PURE_ENV = "CANARY_PURE_PYTHON"
ROOT = Path(__file__).resolve().parent.parent  # the directory holding `sidecar/`
MANIFEST = ROOT / "sidecar" / "proxy" / "compiled.json"


def source_path(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_hash(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()


def manifest(sources: Mapping[str, bytes], compiler: str) -> dict[str, object]:
    """What a build writes to `MANIFEST`: the hash of each module's source it compiled."""
    return {
        "compiler": compiler,
        "modules": {module: source_hash(source) for module, source in sorted(sources.items())},
    }


def decide(
    *,
    forced_pure: bool,
    recorded: object,
    sources: Mapping[str, bytes | None],
    extensions: Sequence[str],
) -> tuple[bool, str]:
    """(use the compiled modules, why). `recorded`: the manifest as read (None if
    absent); `sources`: each module's source now (None if unreadable);
    `extensions`: the modules whose extension file is present."""
    if forced_pure:
        return False, f"{PURE_ENV}=1"
    if not isinstance(recorded, dict) or not isinstance(recorded.get("modules"), dict):
        return False, "not compiled (no build manifest)"
    hashes = recorded["modules"]
    for module, source in sources.items():
        if module not in extensions:
            return False, f"not compiled: no extension for {module}"
        if source is None or hashes.get(module) != source_hash(source):
            return False, f"the compiled {module} is stale (its source changed since the build)"
    return True, f"compiled ({recorded.get('compiler', 'unknown compiler')})"


def _extension_present(module: str, root: Path) -> bool:
    stem = source_path(module, root).with_suffix("")
    return any(
        stem.with_name(stem.name + suffix).is_file()
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


# a build's manifest is a few hundred bytes; anything far larger is not one
MAX_MANIFEST_BYTES = 64 * 1024


def _recorded(path: Path) -> object:
    """The manifest as parsed, or None: absent, too large, or not JSON (a damaged
    file must leave the proxy in pure Python, never stop the sidecar's import)."""
    raw = _read(path)
    if raw is None or len(raw) > MAX_MANIFEST_BYTES:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _group_loads() -> str | None:
    """None if the group's shared library (which every compiled module imports)
    loads; else why not. It holds only the compiled code: importing it runs none of
    the modules."""
    try:
        importlib.import_module(GROUP + "__mypyc")
    except Exception as exc:  # ImportError, or a library built for another Python
        return f"{type(exc).__name__}: {exc}"
    return None


class _PureSource(importlib.abc.MetaPathFinder):
    """Imports `sidecar` modules from their `.py` files, extension or not, except
    those in `compiled` (the build in use): an extension left over from another
    build never loads."""

    def __init__(self, compiled: Sequence[str]) -> None:
        self._compiled = frozenset(compiled)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("sidecar.") or fullname in self._compiled or not path:
            return None
        name = fullname.rpartition(".")[2] + ".py"
        for entry in path:
            source = os.path.join(entry, name)
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None  # a package, or not ours: the usual finders


# what `select()` chose, and why (the sidecar logs it, benchmarks record it)
IN_USE: tuple[bool, str] = (False, "not decided yet")
_decided = False


def select() -> tuple[bool, str]:
    """Decide once per process; installs the pure-Python finder when needed."""
    global IN_USE, _decided
    if _decided:
        return IN_USE
    _decided = True
    IN_USE = decide(
        forced_pure=os.environ.get(PURE_ENV, "") == "1",
        recorded=_recorded(MANIFEST),
        sources={module: _read(source_path(module)) for module in MODULES},
        extensions=[module for module in MODULES if _extension_present(module, ROOT)],
    )
    if IN_USE[0]:
        failure = _group_loads()
        if failure is not None:
            IN_USE = (False, f"not compiled: the compiled library does not load ({failure})")
    sys.meta_path.insert(0, _PureSource(MODULES if IN_USE[0] else ()))
    return IN_USE
