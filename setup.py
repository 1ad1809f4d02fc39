"""Compiles the proxy's per-request modules with mypyc; the rest is in pyproject.toml.

`sidecar/compiled.py` lists the modules and, at import time, decides whether their
compiled form runs (decision 0034). The build writes `sidecar/proxy/compiled.json`,
the hashes of the sources it compiled, only once every extension is built.

- no mypyc, or a failed compile: a warning, and the package is pure Python (it works
  the same, with more CPU per request), unless CANARY_REQUIRE_COMPILED=1 (the image
  build sets it), which makes that an error;
- CANARY_PURE_PYTHON=1 at build time: nothing is compiled.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path) -> ModuleType:
    # by path: importing the `sidecar` package would decide its build already
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


compiled = _load("_canary_compiled", HERE / "sidecar" / "compiled.py")
REQUIRED = os.environ.get("CANARY_REQUIRE_COMPILED", "") == "1"


def _warn(message: str) -> None:
    if REQUIRED:
        raise SystemExit(f"canary: {message} (CANARY_REQUIRE_COMPILED=1)")
    print(f"canary: WARNING: {message}; the proxy runs as pure Python", file=sys.stderr)


class BuildWithManifest(build_ext):
    """build_ext, then the manifest beside the extensions (in the tree when in place)."""

    def run(self) -> None:
        target = (
            compiled.MANIFEST
            if self.inplace
            else (Path(self.build_lib) / compiled.MANIFEST.relative_to(compiled.ROOT))
        )
        target.unlink(missing_ok=True)  # until this build has succeeded
        # extensions of an earlier build with other modules (never loaded, see
        # sidecar/compiled.py, but not to be shipped either)
        tree = HERE if self.inplace else Path(self.build_lib)
        for stale in (tree / "sidecar").rglob("*.so"):
            stale.unlink()
        sources = {m: compiled.source_path(m, HERE).read_bytes() for m in compiled.MODULES}
        try:
            super().run()
        except Exception as exc:  # setuptools' CompileError, LinkError, ...
            if REQUIRED or not self.extensions:
                raise
            _warn(f"compiling the proxy's modules failed: {exc}")
            return
        if not self.extensions:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(compiled.manifest(sources, _compiler()), indent=1) + "\n")


def _compiler() -> str:
    from mypy.version import __version__

    return f"mypyc {__version__}"


def _extensions() -> list[Any]:
    if os.environ.get(compiled.PURE_ENV, "") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not installed")
        return []
    paths = [str(compiled.source_path(m, HERE).relative_to(HERE)) for m in compiled.MODULES]
    # pip builds in an environment of its own, without the project's dependencies:
    # their types are Any there, which the strict checks (`make lint`'s job, not the
    # compiler's) would refuse
    relaxed = [
        "--allow-subclassing-any",
        "--allow-untyped-decorators",
        "--no-warn-return-any",
        "--no-warn-unused-ignores",
    ]
    return list(mypycify([*relaxed, *paths], opt_level="3", group_name=compiled.GROUP))


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildWithManifest})
