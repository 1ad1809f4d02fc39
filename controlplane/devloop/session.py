"""One `canary dev` run on local backends: the children, the sample key joiners sign
with, the join file, and the commands to print (decision 0053)."""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from controlplane.devloop.backends import LocalBackends, missing_binaries
from controlplane.kernel.dev_join import DevJoin, write_join
from controlplane.kernel.sample_keys import SampleKeys, generate_sample_keys


class BackendChoice(StrEnum):
    AUTO = "auto"  # local when etcd and redis-server are here, else memory
    LOCAL = "local"
    MEMORY = "memory"


def resolve_choice(choice: BackendChoice, missing: list[str]) -> BackendChoice:
    """Which backends a run uses, from the flag and the binaries that are missing."""
    if choice is BackendChoice.AUTO:
        return BackendChoice.MEMORY if missing else BackendChoice.LOCAL
    return choice


@dataclass(frozen=True)
class DevSession:
    join: DevJoin
    join_file: Path
    sample_keys: SampleKeys


def _write_keys(path: Path, keys: SampleKeys) -> None:
    key = keys.current
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(f"{key.kid}:{key.secret.hex()}\n")


@contextlib.contextmanager
def local_session(
    *, join_file: Path, api: str, etcd_prefix: str, etcd_port: int = 0, redis_port: int = 0
) -> Iterator[DevSession]:
    """Start etcd and Redis, write the sample key and the join file; undo all at exit."""
    backends = LocalBackends(etcd_port=etcd_port, redis_port=redis_port)
    backends.start()
    try:
        keys = generate_sample_keys("dev")
        keys_file = backends.workdir / "sample-keys"
        _write_keys(keys_file, keys)
        join = DevJoin(etcd=backends.etcd_endpoint, etcd_prefix=etcd_prefix,
                       redis_url=backends.redis_url, sample_keys_file=str(keys_file), api=api)
        write_join(join_file, join)
        try:
            yield DevSession(join=join, join_file=join_file, sample_keys=keys)
        finally:
            join_file.unlink(missing_ok=True)
    finally:
        backends.stop()


def join_commands(join_file: Path) -> list[str]:
    """The exact commands that join this run, as `canary dev` prints them."""
    where = shlex.quote(str(join_file))
    return [
        f"canary sidecar --join {where} --service SERVICE --listen 127.0.0.1:8000 "
        "--admin 127.0.0.1:8001 --workers 1",
        f"canary router nginx --join {where} --service SERVICE --listen 127.0.0.1:8000 …",
    ]


def memory_note(missing: list[str]) -> str:
    why = f" (missing: {'; '.join(missing)})" if missing else ""
    return (
        "etcd and Redis are IN-PROCESS (memory://): no sidecar or router can join this "
        f"control plane{why}; run `canary dev --backends local` once etcd and redis-server "
        "are installed"
    )


__all__ = ["BackendChoice", "DevSession", "join_commands", "local_session", "memory_note",
           "missing_binaries", "resolve_choice"]
