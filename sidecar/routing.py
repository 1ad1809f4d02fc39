"""The route in force and how it is kept fresh (architecture §4, §9).

`RouteTable` is the proxy's `Chooser`: it holds the route in force (compiled once per
route: upstreams parsed, bucket ranges laid out) and an optional default upstream,
and assigns each request to a variant.

`RouteWatcher` keeps the table in step with `<prefix>/routes/<service>` through the
shared list-then-watch loop (controlplane/kernel/informer.py): it reads the key, then
watches it from that revision, and reads it again after a watch it cannot resume. It
is fail-static: when the store cannot be reached the route in force stays and the
informer reads again with backoff; a malformed route is rejected and counted and the
route in force stays; a deleted key (also one deleted while the store was away) falls
back to the default upstream (or 503).

Which route is newer is etcd's to say: the informer delivers the key's values in the
order etcd wrote them (its mod revisions), and the last one delivered is the one in
force, whatever its `revision` field says. A number inside the value, which anyone
who writes the key can set, cannot hold a route in force against the leader's next
write (decision 0043).
"""

from __future__ import annotations

import asyncio
import logging
import random
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from controlplane.kernel.backoff import BackoffPolicy
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.informer import PrefixInformer
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.routes import BASELINE, Route, parse_route
from sidecar.assignment import BUCKETS, BucketLayout, bucket_and_hash
from sidecar.choice import Choice, NoRoute, Upstream

log = logging.getLogger("canary.sidecar.routes")

FORCE_HEADER = "x-canary-force"
DEFAULT_VARIANT = "default"


def cookie_value(cookie_header: str | None, name: str) -> str | None:
    """The value of one cookie in a Cookie header, without SimpleCookie's strictness.

    Browsers send `a=1; b=2`; a malformed pair elsewhere in the header must not hide
    the sticky cookie, so pairs are split leniently.
    """
    if not cookie_header:
        return None
    for pair in cookie_header.split(";"):
        key, sep, value = pair.partition("=")
        if sep and key.strip() == name:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            return value or None
    return None


@dataclass(frozen=True, slots=True)
class _CompiledRoute:
    """A route compiled for the request path: nothing is parsed per request."""

    route: Route
    experiment: str
    salt: str
    header: str | None
    cookie: str | None
    layout: BucketLayout
    bounds: tuple[int, ...]  # layout.bounds, one attribute lookup closer
    # one Choice per layout slot, with unit_hash 0, reused for requests without a unit
    slots: tuple[Choice, ...]
    by_name: Mapping[str, Choice]

    @classmethod
    def compile(cls, route: Route) -> _CompiledRoute:
        experiment = str(route.experiment)
        by_name: dict[str, Choice] = {}
        for variant in route.variants:
            # ValueError here makes the whole route malformed, before it is in force
            upstream = Upstream.parse(variant.upstream)
            by_name[variant.name] = Choice(experiment, variant.name, upstream, 0)
        layout = BucketLayout.from_weights(
            [(v.name, v.weight) for v in route.variants], baseline=BASELINE
        )
        return cls(
            route=route,
            experiment=experiment,
            salt=route.salt,
            header=route.sticky.header.lower() if route.sticky.header else None,
            cookie=route.sticky.cookie,
            layout=layout,
            bounds=layout.bounds,
            slots=tuple(by_name[name] for name in layout.names),
            by_name=by_name,
        )


class RouteTable:
    """Chooses a variant and its upstream for each request (the proxy's `Chooser`)."""

    def __init__(
        self,
        *,
        default_upstream: Upstream | None = None,
        force_enabled: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        self._default = (
            Choice(None, DEFAULT_VARIANT, default_upstream, 0) if default_upstream else None
        )
        self._force_enabled = force_enabled
        # random() is one C call; randrange() runs Python code per request
        self._random = (rng or random.Random()).random
        self._compiled: _CompiledRoute | None = None

    @property
    def route(self) -> Route | None:
        compiled = self._compiled
        return compiled.route if compiled else None

    @property
    def default_upstream(self) -> Upstream | None:
        return self._default.upstream if self._default else None

    @property
    def ready(self) -> bool:
        """A request can be routed: a route or a default upstream is in force."""
        return self._compiled is not None or self._default is not None

    def apply(self, route: Route | None) -> None:
        """Put a route in force (None: back to the default upstream or 503).

        Raises ValueError when a variant's upstream URL does not parse; the route in
        force then stays.
        """
        self._compiled = _CompiledRoute.compile(route) if route is not None else None

    def choose(self, headers: Mapping[str, str]) -> Choice:
        compiled = self._compiled
        if compiled is None:
            if self._default is None:
                raise NoRoute("no route in force and no default upstream")
            return self._default
        unit = headers.get(compiled.header) if compiled.header else None
        if not unit and compiled.cookie:
            unit = cookie_value(headers.get("cookie"), compiled.cookie)
        if self._force_enabled:
            forced = headers.get(FORCE_HEADER)
            if forced:
                choice = compiled.by_name.get(forced)
                if choice is not None:
                    if unit:
                        _, hashed = bucket_and_hash(compiled.salt, unit)
                        return Choice(choice.experiment, choice.variant, choice.upstream, hashed)
                    return choice
        if not unit:
            return compiled.slots[bisect_right(compiled.bounds, int(self._random() * BUCKETS))]
        bucket, hashed = bucket_and_hash(compiled.salt, unit)
        choice = compiled.slots[bisect_right(compiled.bounds, bucket)]
        return Choice(choice.experiment, choice.variant, choice.upstream, hashed)


@dataclass
class WatcherStats:
    applied: int = 0
    rejected_malformed: int = 0
    deleted: int = 0
    store_errors: int = 0
    connected: bool = False

    @property
    def rejected(self) -> int:
        return self.rejected_malformed


class RouteWatcher:
    """Keeps a RouteTable in step with the service's route key in the store."""

    def __init__(
        self,
        kv: KeyValueStore,
        table: RouteTable,
        *,
        service: str,
        prefix: str = "/canary",
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._table = table
        self.service = service
        self.key = EtcdKeys(prefix).route(service)
        self.stats = WatcherStats()
        # replaced on every change, so a waiter never misses one
        self._changed = asyncio.Event()
        # the key is a prefix of longer keys (`svc` of `svc-2`): keep only our own
        self.informer = PrefixInformer(
            kv,
            self.key,
            self,
            name=f"route-watcher:{service}",
            accept=lambda key: key == self.key,
            policy=BackoffPolicy(initial=backoff_initial, maximum=backoff_max),
            observer=self,
            sleep=sleep,
        )

    @property
    def table(self) -> RouteTable:
        return self._table

    @property
    def revision(self) -> int | None:
        """The `revision` field of the route in force, None without one."""
        route = self._table.route
        return route.revision if route else None

    # --- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        self.informer.start()

    async def wait_loaded(self, timeout: float) -> bool:
        """Wait until the first read of the key answered (the store may be down)."""
        return await self.informer.wait_synced(timeout)

    async def wait_for(self, predicate: Callable[[Route | None], bool], timeout: float) -> bool:
        """Wait until the route in force satisfies predicate; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate(self._table.route):
                    await self._changed.wait()
        except TimeoutError:
            return predicate(self._table.route)
        return True

    async def stop(self) -> None:
        await self.informer.stop()

    # --- what the informer delivers (PrefixHandler, InformerObserver) ---------

    def on_put(self, key: str, value: bytes, mod_revision: int) -> None:
        self.apply_value(value)

    def on_delete(self, key: str) -> None:
        self.apply_value(None)

    def listed(self, *, relist: bool) -> None:
        self.stats.connected = True

    def failed(self, error: Exception, *, retry_in: float) -> None:
        # fail-static: the route in force stays whatever the store does
        self.stats.store_errors += 1
        self.stats.connected = False

    # --- applying values ----------------------------------------------------

    def apply_value(self, value: bytes | None) -> bool:
        """Apply one value of the key (None: deleted). Returns True when put in force."""
        if value is None:
            if self._table.route is not None:
                log.info("route for %s deleted: default upstream or 503", self.service)
                self.stats.deleted += 1
            self._table.apply(None)
            self._notify()
            return True
        try:
            route = parse_route(value)
            self._table.apply(route)
        except (ValidationFailed, ValueError) as exc:
            self.stats.rejected_malformed += 1
            log.warning("route for %s rejected as malformed: %s", self.service, exc)
            return False
        self.stats.applied += 1
        log.info(
            "route for %s in force: experiment %s revision %d %s",
            self.service,
            route.experiment,
            route.revision,
            {v.name: v.weight for v in route.variants},
        )
        self._notify()
        return True

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
