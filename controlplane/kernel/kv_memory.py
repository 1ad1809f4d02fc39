"""The in-process configuration store: etcd's semantics without etcd.

Used by `canary dev`, `canary demo` and tests. Every component of one process that
should see the same keys must share one `MemoryKV` instance.

Semantics kept identical to etcd, because callers are written against etcd:
- one global revision, starting at 1; every write (or lease revocation that deletes
  keys) advances it by one, a delete of a missing key does not;
- watches replay a bounded history, so `watch_prefix(p, start_revision=R)` works for
  any R the history still covers and raises RevisionCompacted for older ones;
- leases expire on the injected clock and take their keys with them in one revision;
  a keepalive that comes after the expiry does not revive the lease. So a test that
  advances a FakeClock past a leader's TTL deposes it, exactly as a stalled process
  is deposed by etcd. Components that hold a leadership while a test advances the
  clock by more than the TTL need a larger TTL.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.errors import BackendUnavailable, NotLeader, RevisionConflict
from controlplane.kernel.kv import (
    EventKind,
    Fence,
    KeyValue,
    Leadership,
    LeaseSession,
    RevisionCompacted,
    WatchEvent,
)

DEFAULT_HISTORY = 10_000
# Real seconds between keepalives and expiry checks. Expiry itself is judged on the
# injected clock; this only bounds how late a loss is noticed when nothing else
# touches the store.
_MAX_TICK_SECONDS = 0.25


@dataclass
class _Lease:
    id: int
    ttl: float
    expires_at: float
    keys: set[str] = field(default_factory=set)
    revoked: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryKV:
    def __init__(self, *, clock: Clock | None = None, history: int = DEFAULT_HISTORY) -> None:
        if history < 1:
            raise ValueError("history must keep at least one event")
        self._clock: Clock = clock or SystemClock()
        self._history_limit = history
        self._revision = 1
        self._data: dict[str, KeyValue] = {}
        self._lease_of: dict[str, int] = {}
        self._leases: dict[int, _Lease] = {}
        self._next_lease_id = 1
        self._history: list[WatchEvent] = []
        self._compacted = 0
        self._changed = asyncio.Event()
        self._closed = False
        self._keepalives: set[asyncio.Task[None]] = set()

    @property
    def revision(self) -> int:
        return self._revision

    async def get(self, key: str) -> KeyValue | None:
        self._check_open()
        self._reap()
        return self._data.get(key)

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        self._check_open()
        self._reap()
        items = sorted(
            (kv for key, kv in self._data.items() if key.startswith(prefix)),
            key=lambda kv: kv.key,
        )
        return items, self._revision

    async def put(self, key: str, value: bytes, *, fence: Fence | None = None) -> int:
        self._check_open()
        self._reap()
        self._check_fence(fence)
        return self._commit_put(key, value, lease_id=0)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, fence: Fence | None = None
    ) -> int:
        self._check_open()
        self._reap()
        self._check_fence(fence)
        current = self._data.get(key)
        actual = current.mod_revision if current is not None else 0
        if actual != expected_mod_revision:
            raise RevisionConflict(
                f"{key} is at revision {actual}, expected {expected_mod_revision}"
            )
        return self._commit_put(key, value, lease_id=0)

    async def delete(self, key: str, *, fence: Fence | None = None) -> bool:
        self._check_open()
        self._reap()
        self._check_fence(fence)
        if key not in self._data:
            return False
        self._commit_deletes([key])
        return True

    def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        # "From now" is fixed here, at the call, not at the first iteration, so that
        # nothing written between the two is lost.
        after = start_revision if start_revision > 0 else self._revision
        return self._watch(prefix, after)

    def leadership(self, name: str, *, identity: str, ttl: int) -> Leadership:
        if ttl <= 0:
            raise ValueError("a leadership TTL must be positive")
        return MemoryLeadership(self, name, identity=identity, ttl=ttl)

    def lease_session(self, *, ttl: int) -> LeaseSession:
        if ttl <= 0:
            raise ValueError("a lease TTL must be positive")
        return MemoryLeaseSession(self, ttl=ttl)

    async def ping(self) -> None:
        self._check_open()

    async def close(self) -> None:
        self._closed = True
        self._wake()
        for task in list(self._keepalives):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, prefix: str, after: int) -> AsyncIterator[WatchEvent]:
        scanned = after
        while not self._closed:
            self._reap()
            if scanned < self._compacted:
                raise RevisionCompacted(scanned, self._compacted)
            changed = self._changed
            start = bisect.bisect_right(self._history, scanned, key=lambda e: e.mod_revision)
            batch = [e for e in self._history[start:] if e.key.startswith(prefix)]
            scanned = max(scanned, self._revision)
            for event in batch:
                yield event
            # `changed` was taken before the scan: writes made while the batch was
            # being consumed have already set it, so none is waited past.
            if not self._closed:
                await changed.wait()

    # -- writes: every one goes through _commit so revisions and history agree --

    def _commit_put(self, key: str, value: bytes, *, lease_id: int) -> int:
        self._revision += 1
        rev = self._revision
        old = self._data.get(key)
        create = old.create_revision if old is not None else rev
        self._data[key] = KeyValue(key=key, value=value, mod_revision=rev, create_revision=create)
        self._attach(key, lease_id)
        self._record(WatchEvent(kind=EventKind.PUT, key=key, value=value, mod_revision=rev))
        self._wake()
        return rev

    def _commit_deletes(self, keys: list[str]) -> int:
        self._revision += 1
        rev = self._revision
        for key in keys:
            del self._data[key]
            self._attach(key, 0)
            self._record(WatchEvent(kind=EventKind.DELETE, key=key, value=None, mod_revision=rev))
        self._wake()
        return rev

    def _attach(self, key: str, lease_id: int) -> None:
        previous = self._lease_of.pop(key, 0)
        if previous and previous in self._leases:
            self._leases[previous].keys.discard(key)
        if lease_id:
            self._lease_of[key] = lease_id
            self._leases[lease_id].keys.add(key)

    def _record(self, event: WatchEvent) -> None:
        self._history.append(event)
        # Trimming in halves keeps appends amortised O(1) instead of shifting a list
        # on every write.
        if len(self._history) >= 2 * self._history_limit:
            drop = len(self._history) - self._history_limit
            self._compacted = self._history[drop - 1].mod_revision
            del self._history[:drop]

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailable("the in-process store is closed")

    def _check_fence(self, fence: Fence | None) -> None:
        if fence is None:
            return
        holder = self._data.get(fence.key)
        if holder is None or holder.create_revision != fence.create_revision:
            raise NotLeader(f"leadership {fence.key} at revision {fence.create_revision} is gone")

    # -- leases --

    def _grant(self, ttl: float) -> _Lease:
        lease = _Lease(
            id=self._next_lease_id, ttl=ttl, expires_at=self._clock.monotonic() + ttl
        )
        self._next_lease_id += 1
        self._leases[lease.id] = lease
        return lease

    def _keep_alive(self, lease: _Lease) -> bool:
        self._reap()
        if lease.id not in self._leases:
            return False
        lease.expires_at = self._clock.monotonic() + lease.ttl
        return True

    def _revoke(self, lease: _Lease) -> None:
        if self._leases.pop(lease.id, None) is None:
            return
        keys = sorted(k for k in lease.keys if k in self._data)
        if keys:
            self._commit_deletes(keys)
        lease.revoked.set()

    def _reap(self) -> None:
        now = self._clock.monotonic()
        for lease in [lease for lease in self._leases.values() if lease.expires_at <= now]:
            self._revoke(lease)

    def _try_lead(self, key: str, identity: str, ttl: float) -> tuple[_Lease, Fence] | None:
        self._check_open()
        self._reap()
        if key in self._data:
            return None
        lease = self._grant(ttl)
        rev = self._commit_put(key, identity.encode(), lease_id=lease.id)
        return lease, Fence(key=key, create_revision=rev)


class MemoryLeadership:
    """One candidate: the first to create the election key leads while its lease lives."""

    def __init__(self, kv: MemoryKV, name: str, *, identity: str, ttl: int) -> None:
        self._kv = kv
        self._name = name
        self._identity = identity
        self._ttl = ttl
        self._tick = min(ttl / 3, _MAX_TICK_SECONDS)
        self._lease: _Lease | None = None
        self._fence: Fence | None = None
        self._keepalive: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        if self._lease is None:
            return False
        self._kv._reap()
        return not self._lease.revoked.is_set()

    async def campaign(self) -> Fence:
        if self._fence is not None and self.is_leader:
            return self._fence
        await self._stop_keepalive()
        while True:
            won = self._kv._try_lead(self._name, self._identity, self._ttl)
            if won is not None:
                self._lease, self._fence = won
                self._keepalive = asyncio.create_task(
                    self._keep_alive(won[0]), name=f"lease-keepalive-{self._name}"
                )
                self._kv._keepalives.add(self._keepalive)
                self._keepalive.add_done_callback(self._kv._keepalives.discard)
                return won[1]
            changed = self._kv._changed
            # The holder's lease may expire with nobody touching the store; the
            # timeout makes this candidate look again.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self._tick)

    async def resign(self) -> None:
        await self._stop_keepalive()
        if self._lease is not None:
            self._kv._revoke(self._lease)
            self._lease.revoked.set()

    async def lost(self) -> None:
        lease = self._lease
        if lease is None:
            return
        self._kv._reap()
        await lease.revoked.wait()

    async def _keep_alive(self, lease: _Lease) -> None:
        while self._kv._keep_alive(lease):
            await asyncio.sleep(self._tick)

    async def _stop_keepalive(self) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class MemoryLeaseSession:
    """A lease kept alive by a task, and the keys created under it."""

    def __init__(self, kv: MemoryKV, *, ttl: int) -> None:
        self._kv = kv
        self._ttl = ttl
        self._tick = min(ttl / 3, _MAX_TICK_SECONDS)
        self._lease: _Lease | None = None
        self._keepalive: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self._kv._check_open()
        self._kv._reap()
        lease = self._kv._grant(self._ttl)
        self._lease = lease
        self._keepalive = asyncio.create_task(self._keep_alive(lease), name="lease-session")
        self._kv._keepalives.add(self._keepalive)
        self._keepalive.add_done_callback(self._kv._keepalives.discard)

    @property
    def alive(self) -> bool:
        if self._lease is None:
            return False
        self._kv._reap()
        return not self._lease.revoked.is_set()

    async def lost(self) -> None:
        lease = self._lease
        if lease is None:
            return
        self._kv._reap()
        await lease.revoked.wait()

    async def create(self, key: str, value: bytes) -> Fence | None:
        self._kv._check_open()
        if not self.alive:
            raise NotLeader("the lease is gone: no key can be created under it")
        assert self._lease is not None
        if key in self._kv._data:
            return None
        revision = self._kv._commit_put(key, value, lease_id=self._lease.id)
        return Fence(key=key, create_revision=revision)

    async def close(self) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._lease is not None:
            self._kv._revoke(self._lease)
            self._lease.revoked.set()

    async def _keep_alive(self, lease: _Lease) -> None:
        try:
            while self._kv._keep_alive(lease):
                await asyncio.sleep(self._tick)
        finally:
            self._kv._reap()
