"""The configuration store: etcd v3 in production, in-process memory by default.

One narrow interface, two implementations (kv_etcd, kv_memory) with the same
semantics, chosen by `open_kv(url)`. Revisions are the store's global revision, as
in etcd: every write makes it grow, and a watch resumes after the last one it saw.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from controlplane.kernel.errors import Conflict


class RevisionCompacted(Conflict):
    """A watch asked for history the store no longer keeps (etcd compaction).

    The watcher cannot resume: read the prefix again and watch from that revision.
    """

    def __init__(self, requested: int, compacted: int) -> None:
        self.requested = requested
        self.compacted = compacted
        super().__init__(
            f"cannot watch after revision {requested}: history up to revision "
            f"{compacted} is compacted; read again and watch from the new revision"
        )


class EventKind(StrEnum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int


@dataclass(frozen=True)
class WatchEvent:
    kind: EventKind
    key: str
    value: bytes | None
    mod_revision: int


@dataclass(frozen=True)
class Fence:
    """Proof of leadership: the leader's own key and the revision it was created at.

    A write fenced by it succeeds only while that key still exists at that revision,
    so a deposed leader whose lease expired can never write.
    """

    key: str
    create_revision: int


class Leadership(Protocol):
    """One candidate in an election."""

    async def campaign(self) -> Fence:
        """Block until this candidate leads; return the fence for its writes."""
        ...

    async def resign(self) -> None: ...

    @property
    def is_leader(self) -> bool: ...

    async def lost(self) -> None:
        """Return when leadership is lost (lease expired or store unreachable)."""
        ...


class LeaseSession(Protocol):
    """A lease this process keeps alive, and the keys it creates under it.

    The keys live exactly as long as the lease: when it is revoked, or runs out
    because this process stopped renewing it, etcd deletes them all at once. Each
    key's create revision is the fence of the writes it guards.
    """

    async def open(self) -> None:
        """Grant the lease and keep it alive; BackendUnavailable if the store is away."""
        ...

    @property
    def alive(self) -> bool:
        """Opened, and neither revoked nor run out (judged on this side, never later
        than the store judges it)."""
        ...

    async def lost(self) -> None:
        """Return when the lease is gone (revoked, expired or the store unreachable)."""
        ...

    async def create(self, key: str, value: bytes) -> Fence | None:
        """Create `key` under the lease if no key of that name exists: its fence, or
        None when it exists. NotLeader once the lease is gone."""
        ...

    async def close(self) -> None:
        """Revoke the lease (its keys go with it) and stop renewing it."""
        ...


class KeyValueStore(Protocol):
    async def get(self, key: str) -> KeyValue | None: ...

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """All keys under prefix and the store revision they were read at."""
        ...

    async def put(self, key: str, value: bytes, *, fence: Fence | None = None) -> int:
        """Write; return the new revision. With a fence: NotLeader if it no longer holds."""
        ...

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, fence: Fence | None = None
    ) -> int:
        """Write only if key's mod revision is expected (0: key must not exist).

        Returns the new revision; raises RevisionConflict, or NotLeader for a stale fence.
        """
        ...

    async def delete(self, key: str, *, fence: Fence | None = None) -> bool:
        """Delete; whether it existed. With a fence: NotLeader if it no longer holds."""
        ...

    def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Events under prefix after start_revision (0: from now), in revision order.

        Survives a lost connection: it resumes after the last revision it yielded,
        so no event is missed or repeated.
        """
        ...

    def leadership(self, name: str, *, identity: str, ttl: int) -> Leadership: ...

    def lease_session(self, *, ttl: int) -> LeaseSession:
        """A lease of `ttl` seconds for keys that live as long as this process does."""
        ...

    async def ping(self) -> None:
        """Raise BackendUnavailable if the store does not answer."""
        ...

    async def close(self) -> None: ...
