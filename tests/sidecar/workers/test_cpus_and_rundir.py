"""The CPUs `--workers` defaults to, and where the workers' admin sockets go."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.kernel.errors import ConfigError
from sidecar.workers.cpus import (
    available_cpus,
    cgroup_paths,
    cpus_from,
    parse_cfs,
    parse_cpu_max,
)
from sidecar.workers.rundir import candidates, make_socket_dir


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("max 100000\n", None), ("200000 100000\n", 2.0), ("150000 100000", 1.5),
     ("0 100000", None), ("garbage", None), ("", None), ("x 100000", None)],
)  # fmt: skip
def test_cgroup_v2_cpu_max(text: str, cpus: float | None) -> None:
    assert parse_cpu_max(text) == cpus


@pytest.mark.parametrize(
    ("quota", "period", "cpus"),
    [("-1\n", "100000\n", None), ("50000", "100000", 0.5), ("400000", "100000", 4.0),
     ("1", "0", None)],
)  # fmt: skip
def test_cgroup_v1_cfs(quota: str, period: str, cpus: float | None) -> None:
    assert parse_cfs(quota, period) == cpus


def test_cgroup_paths_of_both_versions() -> None:
    hybrid = "4:memory:/x\n2:cpu,cpuacct:/pod/c1\n0::/pod/c1\n"
    assert cgroup_paths(hybrid) == ("/pod/c1", "/pod/c1")
    assert cgroup_paths("0::/\n") == ("/", None)
    assert cgroup_paths("1:cpuacct:/a\n") == (None, None)


@pytest.mark.parametrize(
    ("affinity", "quotas", "cpus"),
    [(64, [], 64), (64, [2.0], 2), (64, [1.5], 2), (64, [0.2], 1), (2, [8.0], 2),
     (64, [4.0, 3.0], 3)],
)  # fmt: skip
def test_the_tightest_quota_rounded_up_lowers_the_affinity(
    affinity: int, quotas: list[float], cpus: int
) -> None:
    assert cpus_from(affinity, quotas) == cpus


def test_a_v2_quota_on_an_ancestor_counts(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "kubepods" / "pod1").mkdir(parents=True)
    (tmp_path / "kubepods" / "cpu.max").write_text("100000 100000\n")
    (tmp_path / "kubepods" / "pod1" / "cpu.max").write_text("max 100000\n")
    proc = tmp_path / "self-cgroup"
    proc.write_text("0::/kubepods/pod1\n")
    assert available_cpus(tmp_path, proc) == 1


def test_a_v1_quota_counts(tmp_path: Path) -> None:
    group = tmp_path / "cpu" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text("100000\n")
    (group / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "self-cgroup"
    proc.write_text("3:cpu:/docker/abc\n")
    assert available_cpus(tmp_path, proc) == 1


def test_without_a_quota_the_affinity_decides(tmp_path: Path) -> None:
    proc = tmp_path / "self-cgroup"
    proc.write_text("0::/\n")
    assert available_cpus(tmp_path, proc) == len(os.sched_getaffinity(0))


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a path short enough for sockets (pytest's tmp_path is not)."""
    made = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield made
    shutil.rmtree(made)


def test_the_socket_directory_is_private_and_prefers_the_runtime_directory(
    short_dir: Path,
) -> None:
    env = {"RUNTIME_DIRECTORY": f"{short_dir}:/elsewhere", "TMPDIR": "/tmp"}
    made = make_socket_dir(env)
    assert made.parent == short_dir
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_places_are_tried_in_order_without_repeats() -> None:
    env = {"XDG_RUNTIME_DIR": "/run/user/7", "TMPDIR": "/tmp"}
    assert candidates(env) == ["/run/user/7", "/tmp", "/var/tmp", "/dev/shm"]


def test_unwritable_or_too_long_places_are_skipped(short_dir: Path) -> None:
    deep = short_dir / ("d" * 90)
    deep.mkdir()
    env = {"RUNTIME_DIRECTORY": str(short_dir / "absent"), "XDG_RUNTIME_DIR": str(deep)}
    made = make_socket_dir(env)
    try:
        assert made.parent == Path("/tmp")
        assert list(deep.iterdir()) == []  # the long one was made, found too long, removed
    finally:
        made.rmdir()


def test_no_usable_place_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sidecar.workers.rundir.candidates", lambda env: ["/nonexistent-a"])
    with pytest.raises(ConfigError, match="set TMPDIR"):
        make_socket_dir({})
