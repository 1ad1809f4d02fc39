"""Which of an nginx master's workers still accept connections (Linux /proc).

On a reload the master starts workers with the new config, then tells the old ones
to shut down; an old worker renames itself "worker process is shutting down" and
closes its listening sockets in one step. Until it has, it may still accept a new
connection and serve it with the old route, even though the new workers already
answer the status endpoint. So a reload is in force once the status endpoint
answers the new revision *and* none of the workers that served before the reload
still calls itself plain "worker process".

The master is the one named by the pid file, or else the parent of the worker
that answered the status endpoint (its `$pid`). Without /proc (not Linux), or
across PID namespaces, nothing is known: an empty set, and the router relies on the
status endpoint alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")
_SERVING: Final = b"nginx: worker process"
_MASTER: Final = b"nginx: master process"
_READ_MAX: Final = 4_096


def _read(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(_READ_MAX)
    except OSError:
        return None


def children(master: int, proc: Path = PROC) -> set[int]:
    """The master's child processes (its own task's `children` list, else a scan)."""
    listed = _read(proc / str(master) / "task" / str(master) / "children")
    if listed is not None:
        return {int(part) for part in listed.split() if part.isdigit()}
    found: set[int] = set()
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        stat = _read(entry / "stat")
        # pid (comm) state ppid …: comm may hold spaces and parentheses
        fields = stat.rpartition(b")")[2].split() if stat else []
        if len(fields) > 1 and fields[1].isdigit() and int(fields[1]) == master:
            found.add(int(entry.name))
    return found


def master_of(worker: int, proc: Path = PROC) -> int | None:
    """The nginx master of a worker pid (its parent, if that calls itself one)."""
    stat = _read(proc / str(worker) / "stat")
    fields = stat.rpartition(b")")[2].split() if stat else []
    if len(fields) < 2 or not fields[1].isdigit():
        return None
    parent = int(fields[1])
    title = _read(proc / str(parent) / "cmdline")
    if parent <= 1 or title is None or not title.startswith(_MASTER):
        return None
    return parent


def serving_workers(master: int, proc: Path = PROC) -> set[int]:
    """The master's workers that have not been told to shut down."""
    serving: set[int] = set()
    for pid in children(master, proc):
        title = _read(proc / str(pid) / "cmdline")
        if title is not None and title.rstrip(b"\0 ") == _SERVING:
            serving.add(pid)
    return serving


__all__ = ["children", "master_of", "serving_workers"]
