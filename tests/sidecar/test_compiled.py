"""The proxy's two builds: compiled modules only when they are complete and match their
sources, pure Python otherwise or when asked, and the proxy's tests passing in both.

The suite itself runs in whichever build the tree holds (`make install` compiles);
the last test runs a set of proxy tests in the other one, pure Python, in a child."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar import compiled

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {module: f"# {module}\n".encode() for module in compiled.MODULES}
BUILT = compiled.manifest(SOURCES, "mypyc test")


def test_a_complete_build_of_these_sources_runs_compiled() -> None:
    use, why = compiled.decide(
        forced_pure=False, recorded=BUILT, sources=SOURCES, extensions=list(SOURCES)
    )
    assert use and why == "compiled (mypyc test)"


def test_the_environment_forces_pure_python() -> None:
    use, why = compiled.decide(
        forced_pure=True, recorded=BUILT, sources=SOURCES, extensions=list(SOURCES)
    )
    assert not use and compiled.PURE_ENV in why


@pytest.mark.parametrize("recorded", [None, [], {"modules": "x"}, {"compiler": "mypyc"}])
def test_no_readable_manifest_means_pure_python(recorded: object) -> None:
    use, why = compiled.decide(
        forced_pure=False, recorded=recorded, sources=SOURCES, extensions=list(SOURCES)
    )
    assert not use and "no build manifest" in why


def test_one_edited_source_means_pure_python_for_all() -> None:
    edited = {**SOURCES, "sidecar.proxy.headers": SOURCES["sidecar.proxy.headers"] + b"x = 1\n"}
    use, why = compiled.decide(
        forced_pure=False, recorded=BUILT, sources=edited, extensions=list(SOURCES)
    )
    assert not use and "sidecar.proxy.headers is stale" in why


def test_an_unreadable_source_or_a_missing_extension_means_pure_python() -> None:
    unreadable = {**SOURCES, "sidecar.proxy.client": None}
    assert not compiled.decide(
        forced_pure=False, recorded=BUILT, sources=unreadable, extensions=list(SOURCES)
    )[0]
    missing = [module for module in SOURCES if module != "sidecar.proxy.exchange"]
    use, why = compiled.decide(
        forced_pure=False, recorded=BUILT, sources=SOURCES, extensions=missing
    )
    assert not use and "no extension for sidecar.proxy.exchange" in why


def test_the_finder_imports_from_sources_all_but_the_compiled_in_use() -> None:
    package = importlib.import_module("sidecar.proxy")
    pure = compiled._PureSource(())
    spec = pure.find_spec("sidecar.proxy.exchange", package.__path__)
    assert spec is not None and spec.origin is not None and spec.origin.endswith("exchange.py")
    with_compiled = compiled._PureSource(compiled.MODULES)
    assert with_compiled.find_spec("sidecar.proxy.exchange", package.__path__) is None
    # a module outside the build (an extension left over would never load)
    spec = with_compiled.find_spec("sidecar.proxy.options", package.__path__)
    assert spec is not None and spec.origin is not None and spec.origin.endswith("options.py")
    assert with_compiled.find_spec("sidecar.proxy.h2", package.__path__) is None  # a package
    assert with_compiled.find_spec("controlplane.kernel.codec", package.__path__) is None


def test_the_modules_loaded_are_the_build_chosen() -> None:
    use, _ = compiled.select()
    if os.environ.get(compiled.PURE_ENV) == "1":
        assert not use
    for name in compiled.MODULES:
        origin = importlib.import_module(name).__spec__.origin
        assert origin is not None and origin.endswith(".py") is (not use), (name, origin)


SMOKE = [
    "tests/sidecar/test_compiled.py::test_the_modules_loaded_are_the_build_chosen",
    "tests/sidecar/test_proxy_passthrough.py",
    "tests/sidecar/test_smuggling.py",
    "tests/sidecar/test_proxy_uvloop.py",
    "tests/sidecar/test_head_cache.py",
]


def test_the_proxy_tests_pass_in_pure_python_too() -> None:
    if not compiled.select()[0]:
        pytest.skip("this tree is not compiled: the whole suite runs as pure Python")
    env = {**os.environ, compiled.PURE_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SMOKE],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0 and " passed" in done.stdout, (done.stdout + done.stderr)[-3000:]


@pytest.mark.parametrize(
    "content",
    [b"[" * 100_000, b" " * (compiled.MAX_MANIFEST_BYTES + 1), b"\xff\xfe", b"{"],
    ids=["nested", "oversized", "not-utf8", "truncated"],
)
def test_a_damaged_manifest_reads_as_none(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "compiled.json"
    path.write_bytes(content)
    assert compiled._recorded(path) is None  # then pure Python, never a failed import


def test_a_group_library_that_does_not_load_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "GROUP", "sidecar.proxy._no_such_build")
    failure = compiled._group_loads()
    assert failure is not None and failure.startswith("ModuleNotFoundError")
