"""How many CPUs this process may use: its affinity, and its cgroup's CPU quota.

A container limited to 2 CPUs on a 64-CPU node sees 64 in its affinity mask; its
cgroup says 2 (`cpu.max` "200000 100000" on cgroup v2, `cpu.cfs_quota_us` and
`cpu.cfs_period_us` on v1). The smaller figure, rounded up, is what `--workers`
defaults to. Parsing is pure; `available_cpus` reads the files.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path, PurePosixPath

CGROUP_ROOT = Path("/sys/fs/cgroup")


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 `cpu.max` ("QUOTA PERIOD" or "max PERIOD"): CPUs, or None for no limit."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _ratio(parts[0], parts[1])


def parse_cfs(quota: str, period: str) -> float | None:
    """cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us`: CPUs, or None (-1: no limit)."""
    return _ratio(quota.strip(), period.strip())


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    if q <= 0 or p <= 0:
        return None
    return q / p


def cgroup_paths(proc_self_cgroup: str) -> tuple[str | None, str | None]:
    """(the v2 path, the v1 `cpu` controller's path) from /proc/self/cgroup."""
    v2 = v1 = None
    for line in proc_self_cgroup.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        number, controllers, path = fields
        if number == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def cpus_from(affinity: int, quotas: list[float]) -> int:
    """The CPUs to plan for: the affinity, lowered to the tightest quota (rounded up)."""
    if quotas:
        return max(1, min(affinity, math.ceil(min(quotas))))
    return max(1, affinity)


def available_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
    try:
        v2, v1 = cgroup_paths(proc_cgroup.read_text())
    except OSError:
        return max(1, affinity)
    quotas: list[float] = []
    if v2 is not None and (root / "cgroup.controllers").exists():
        for directory in _up_from(root, v2):
            quotas += _read(partial(_v2_quota, directory))
    elif v1 is not None:
        mount = next((m for m in (root / "cpu", root / "cpu,cpuacct") if m.is_dir()), None)
        if mount is not None:
            for directory in _up_from(mount, v1):
                quotas += _read(partial(_v1_quota, directory))
    return cpus_from(affinity, quotas)


def _v2_quota(directory: Path) -> float | None:
    return parse_cpu_max((directory / "cpu.max").read_text())


def _v1_quota(directory: Path) -> float | None:
    quota = (directory / "cpu.cfs_quota_us").read_text()
    return parse_cfs(quota, (directory / "cpu.cfs_period_us").read_text())


def _up_from(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and its ancestors up to the mount point."""
    parts = PurePosixPath(path).parts[1:]  # without the leading "/"
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read(read: Callable[[], float | None]) -> list[float]:
    """The quota `read` finds, as a list of none or one; a file missing or unreadable
    is no limit."""
    try:
        value = read()
    except (OSError, ValueError):
        return []
    return [] if value is None else [value]
