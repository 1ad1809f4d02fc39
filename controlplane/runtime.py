"""The open backends of one control-plane process, shared by its parts.

`canary dev` runs the API, the controller and the collector in one process on an
in-process KV store and stream bus: they only talk to each other if they share the
very same objects, so the process opens them once (`open_backends`) and hands the
`Backends` to every part. Background parts plug into the API's lifespan as
`BackgroundService`s (objects with start/stop) or as plain `async def run(backends)`
coroutines that run until cancelled.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from prometheus_client.registry import Collector

from controlplane.db.history import SqlHistoryStore
from controlplane.db.session import Database, make_engine
from controlplane.db.store import SqlExperimentStore
from controlplane.experiments.store import ExperimentStore
from controlplane.history.store import HistoryStore
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.keys import EtcdKeys, RedisKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.settings import Settings
from controlplane.kernel.streams import SampleStream, SnapshotBoard
from controlplane.routing.changes import RouteChanges

log = logging.getLogger(__name__)


@dataclass
class Backends:
    settings: Settings
    database: Database
    kv: KeyValueStore
    keys: EtcdKeys
    clock: Clock
    streams: SampleStream | None = None
    board: SnapshotBoard | None = None
    redis_keys: RedisKeys = field(default_factory=RedisKeys)
    # committed route changes, for the leader's reconciler in this process
    route_changes: RouteChanges = field(default_factory=RouteChanges)
    # close() releases only what open_backends opened itself
    _owned: tuple[str, ...] = ("database", "kv", "streams")
    # experiments, desired routes and events, on `database`
    store: ExperimentStore = field(init=False)
    # the plots' history, on `database`
    history: HistoryStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = SqlExperimentStore(self.database)
        self.history = SqlHistoryStore(self.database)

    async def close(self) -> None:
        """Close every owned backend, each even if another fails to close."""
        if "streams" in self._owned and self.streams is not None:
            await _quietly(self.streams.close(), "streams")
            if self.board is not None and (self.board is not self.streams):  # type: ignore[comparison-overlap]
                await _quietly(self.board.close(), "snapshot board")
        if "kv" in self._owned:
            await _quietly(self.kv.close(), "kv store")
        if "database" in self._owned:
            self.database.dispose()


async def _quietly(closing: Awaitable[None], what: str) -> None:
    try:
        await closing
    except Exception:
        log.exception("closing the %s failed", what)


async def open_kv_store(settings: Settings, *, clock: Clock | None = None) -> KeyValueStore:
    from controlplane.kernel.backend_access import etcd_access
    from controlplane.kernel.kv_factory import open_kv

    store = open_kv(settings.etcd, clock=clock, access=etcd_access(settings))
    if inspect.isawaitable(store):
        store = await store
    return store


async def open_backends(
    settings: Settings, *, clock: Clock | None = None, streams: bool = True
) -> Backends:
    """Open the database engine, the KV store and (if asked) the sample streams."""
    clock = clock or SystemClock()
    database = Database(make_engine(settings.database_url))
    try:
        kv = await open_kv_store(settings, clock=clock)
    except BaseException:
        database.dispose()
        raise
    backends = Backends(
        settings=settings,
        database=database,
        kv=kv,
        keys=EtcdKeys(settings.etcd_prefix),
        clock=clock,
        redis_keys=RedisKeys(settings.redis_namespace),
    )
    if streams:
        from controlplane.kernel.backend_access import redis_access
        from controlplane.kernel.streams_factory import open_streams

        try:
            backends.streams, backends.board = open_streams(
                settings.redis_url, namespace=settings.redis_namespace, clock=clock,
                access=redis_access(settings),
            )
        except BaseException:
            await backends.close()
            raise
    return backends


@runtime_checkable
class BackgroundService(Protocol):
    """A long-lived part of the process (controller, collector) the API lifespan runs."""

    async def start(self, backends: Backends) -> None:
        """Start work (spawn its own tasks) and return promptly."""
        ...

    async def stop(self) -> None:
        """Stop and release what it holds (leadership, buffers); called on shutdown."""
        ...


@runtime_checkable
class ExportsMetrics(Protocol):
    """A background part with counters of its own for the API's /metrics."""

    def metrics_collector(self) -> Collector: ...


@runtime_checkable
class ExportsText(Protocol):
    """A background part that writes series of its own in the text format (too many
    to build as metric families at every scrape; kernel/exposition.py)."""

    def metrics_text(self) -> str: ...


# Or simply a coroutine function that runs until it is cancelled.
BackgroundTask = Callable[[Backends], Awaitable[None]]
Background = BackgroundService | BackgroundTask
