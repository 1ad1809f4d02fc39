"""The route a router should have in force: the service's key in etcd, followed.

`RouteFollower` is the agent's view of `<prefix>/routes/<service>`, kept by the
shared list-then-watch loop (kernel/informer.py) exactly as a sidecar's
`RouteWatcher` keeps its table: the last value etcd delivered is the desired route
(decision 0043), a malformed value is counted and ignored, a deleted key means no
route, and a store that cannot be reached changes nothing (fail-static).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from controlplane.kernel.backoff import BackoffPolicy
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.informer import PrefixInformer
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.routes import Route, parse_route

log = logging.getLogger("canary.routers.routes")


@dataclass
class FollowerStats:
    received: int = 0
    rejected_malformed: int = 0
    deleted: int = 0
    store_errors: int = 0
    connected: bool = False


class RouteFollower:
    """Holds the desired route and wakes whoever waits when it changes."""

    def __init__(
        self,
        kv: KeyValueStore,
        *,
        service: str,
        prefix: str = "/canary",
        policy: BackoffPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.service = service
        self.key = EtcdKeys(prefix).route(service)
        self.stats = FollowerStats()
        self._desired: Route | None = None
        self._generation = 0  # grows with every value put in `desired`
        self._changed = asyncio.Event()
        self.informer = PrefixInformer(
            kv,
            self.key,
            self,
            name=f"router-routes:{service}",
            # the key is a prefix of longer keys (`svc` of `svc-2`): keep only our own
            accept=lambda key: key == self.key,
            policy=policy or BackoffPolicy(initial=0.1, maximum=5.0),
            observer=self,
            sleep=sleep,
        )

    @property
    def desired(self) -> Route | None:
        return self._desired

    @property
    def generation(self) -> int:
        return self._generation

    def start(self) -> None:
        self.informer.start()

    async def stop(self) -> None:
        await self.informer.stop()

    async def wait_loaded(self, timeout: float) -> bool:
        return await self.informer.wait_synced(timeout)

    async def changed(self, after: int) -> int:
        """Wait until the generation is past `after`; returns the current one."""
        while self._generation <= after:
            await self._changed.wait()
        return self._generation

    # --- what the informer delivers ------------------------------------------

    def on_put(self, key: str, value: bytes, mod_revision: int) -> None:
        self.stats.received += 1
        try:
            route = parse_route(value)
        except (ValidationFailed, ValueError) as exc:
            self.stats.rejected_malformed += 1
            log.warning("route for %s rejected as malformed: %s", self.service, exc)
            return
        self._set(route)

    def on_delete(self, key: str) -> None:
        self.stats.deleted += 1
        self._set(None)

    def listed(self, *, relist: bool) -> None:
        self.stats.connected = True
        if self._generation == 0:  # the first listing found no route: none is desired
            self._set(None)

    def failed(self, error: Exception, *, retry_in: float) -> None:
        self.stats.store_errors += 1
        self.stats.connected = False

    def _set(self, route: Route | None) -> None:
        self._desired = route
        self._generation += 1
        self._changed.set()
        self._changed = asyncio.Event()


__all__ = ["FollowerStats", "RouteFollower"]
