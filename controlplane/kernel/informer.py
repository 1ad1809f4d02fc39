"""List, then watch: one prefix of the store kept in step for a consumer.

The model is client-go's reflector. `PrefixInformer` reads the prefix, hands its
consumer every key (the snapshot), then watches from the revision it read at and
delivers each put and delete. When the watch is lost for good (the store compacted
the revisions it would resume from, refused it, or ended it) or the read fails, it
waits out the shared backoff policy (kernel/backoff.py) and reads the prefix
again; the consumer then gets only the *difference* against what it was last told:
changed keys as puts, and keys deleted meanwhile as deletes (`diff_listing`).
Nothing is delivered while the store is away, so a consumer keeps whatever it holds
(fail-static).

The adapters already resume a watch across a dropped connection without losing an
event (kv_etcd.py); the informer is what handles everything they cannot resume
from. See docs/decisions/0015-shared-watch-loop.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from controlplane.kernel.backoff import Backoff, BackoffPolicy
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.kv import EventKind, KeyValue, KeyValueStore, RevisionCompacted
from controlplane.kernel.tasks import cancel_and_wait

log = logging.getLogger("canary.informer")


# --- the difference a relist delivers ---------------------------------------------


@dataclass(frozen=True)
class Stored:
    """What the informer last told its consumer about one key."""

    value: bytes
    mod_revision: int


@dataclass(frozen=True)
class ListingDiff:
    puts: list[KeyValue]
    deletes: list[str]


def diff_listing(known: Mapping[str, Stored], listed: Iterable[KeyValue]) -> ListingDiff:
    """What changed between the keys a consumer knows and a fresh listing.

    A key is put again only when its revision or bytes differ, so a relist does not
    replay (or count again) what the consumer already has; a known key missing from
    the listing was deleted meanwhile.
    """
    puts: list[KeyValue] = []
    present: set[str] = set()
    for item in listed:
        present.add(item.key)
        old = known.get(item.key)
        if old is None or old.mod_revision != item.mod_revision or old.value != item.value:
            puts.append(item)
    deletes = sorted(key for key in known if key not in present)
    return ListingDiff(puts, deletes)


# --- the consumer side ------------------------------------------------------------


class PrefixHandler(Protocol):
    """What a consumer does with the keys. Never called while the store is away."""

    def on_put(self, key: str, value: bytes, mod_revision: int) -> None: ...

    def on_delete(self, key: str) -> None: ...


class InformerObserver(Protocol):
    """Metrics hooks: a consumer counts these under its own names."""

    def listed(self, *, relist: bool) -> None:
        """A read of the prefix succeeded (relist: not the first one)."""
        ...

    def failed(self, error: Exception, *, retry_in: float) -> None:
        """The read or the watch failed; the next read comes after retry_in seconds."""
        ...


class _NoObserver:
    def listed(self, *, relist: bool) -> None:
        pass

    def failed(self, error: Exception, *, retry_in: float) -> None:
        pass


@dataclass
class InformerStats:
    lists: int = 0  # successful reads of the prefix, the first one included
    relists: int = 0  # reads after the first one
    compactions: int = 0  # watches that could not resume: history compacted
    watch_errors: int = 0  # failed reads and watches, compactions included
    watch_ended: int = 0  # watches the store ended without an error
    events: int = 0  # watch events delivered
    handler_errors: int = 0  # consumer callbacks that raised (the informer goes on)
    connected: bool = False


# --- the loop ---------------------------------------------------------------------


class PrefixInformer:
    """Keeps a consumer in step with every key under a prefix of the store."""

    def __init__(
        self,
        kv: KeyValueStore,
        prefix: str,
        handler: PrefixHandler,
        *,
        name: str,
        accept: Callable[[str], bool] | None = None,
        policy: BackoffPolicy | None = None,
        observer: InformerObserver | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._kv = kv
        self.prefix = prefix
        self._handler = handler
        self.name = name
        # a prefix also matches longer keys (`svc` of `svc-2`): the consumer says which
        # keys are its own, and the others are neither kept nor delivered
        self._accept = accept or (lambda key: True)
        self.backoff = Backoff(policy or BackoffPolicy(), draw=draw)
        self._observer: InformerObserver = observer or _NoObserver()
        self._clock: Clock = clock or SystemClock()
        self._sleep = sleep
        self._known: dict[str, Stored] = {}
        self.revision = 0  # the store revision the consumer is in step with
        self.stats = InformerStats()
        self.synced = asyncio.Event()
        self._listed_at: float | None = None  # when this session's read succeeded
        self._task: asyncio.Task[None] | None = None

    @property
    def known(self) -> Mapping[str, Stored]:
        return self._known

    # --- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"informer:{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def wait_synced(self, timeout: float | None = None) -> bool:
        """Wait until the first read was delivered; False if timeout passes first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.synced.wait()
        return self.synced.is_set()

    async def run(self) -> None:
        """List and watch until cancelled; no error of the store ends it."""
        while True:
            self._listed_at = None
            error: Exception
            try:
                await self._list_and_watch()
                self.stats.watch_ended += 1
                error = ConnectionResetError("the store ended the watch")
            except RevisionCompacted as exc:
                self.stats.compactions += 1
                error = exc
            except Exception as exc:  # fail-static: whatever the store does, go on
                error = exc
            self.stats.connected = False
            self.stats.watch_errors += 1
            listed_at = self._listed_at
            up_for = None if listed_at is None else self._clock.monotonic() - listed_at
            delay = self.backoff.after_session(up_for)
            log.warning(
                "%s: watch of %s lost (%s); keeping what is known, reading again in %.2f s",
                self.name,
                self.prefix,
                error,
                delay,
            )
            self._observer.failed(error, retry_in=delay)
            await self._sleep(delay)

    async def _list_and_watch(self) -> None:
        items, revision = await self._kv.get_prefix(self.prefix)
        relist = self.stats.lists > 0
        self.stats.lists += 1
        if relist:
            self.stats.relists += 1
        self.stats.connected = True
        changes = diff_listing(self._known, (kv for kv in items if self._accept(kv.key)))
        for key in changes.deletes:
            self._delete(key)
        for item in changes.puts:
            self._put(item.key, item.value, item.mod_revision)
        self.revision = revision
        self._listed_at = self._clock.monotonic()
        self._observer.listed(relist=relist)
        self.synced.set()
        # the store's start_revision is exclusive: this resumes right after the read
        async for event in self._kv.watch_prefix(self.prefix, start_revision=revision):
            if event.mod_revision <= revision:
                # already covered by the read; not `<= self.revision`: the keys of one
                # transaction or one lease revoked share a revision, and all are news
                continue
            self.revision = event.mod_revision
            if not self._accept(event.key):
                continue
            self.stats.events += 1
            if event.kind is EventKind.DELETE:
                self._delete(event.key)
            elif event.value is not None:
                self._put(event.key, event.value, event.mod_revision)
            # the first event proves the watch works: failures in a row are over
            self.backoff.reset()

    def _put(self, key: str, value: bytes, mod_revision: int) -> None:
        self._known[key] = Stored(value, mod_revision)
        try:
            self._handler.on_put(key, value, mod_revision)
        except Exception:
            self.stats.handler_errors += 1
            log.exception("%s: applying %s failed; going on", self.name, key)

    def _delete(self, key: str) -> None:
        if self._known.pop(key, None) is None:
            return  # never delivered: nothing for the consumer to drop
        try:
            self._handler.on_delete(key)
        except Exception:
            self.stats.handler_errors += 1
            log.exception("%s: removing %s failed; going on", self.name, key)
