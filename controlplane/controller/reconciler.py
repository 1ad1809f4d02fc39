"""The leader makes every route in etcd equal to its service's desired route in SQL.

    read stored (etcd) → read desired (SQL) → plan_route (pure) → write, fenced → record

The database is the only truth (db.routes); nothing but this loop writes routes, and
only while its replica leads: every write is fenced by the leadership and a
compare-and-swap on the mod revision read, so a deposed leader or a concurrent
change never lands. It runs

- at once after a commit: an in-process wake-up (routing.changes) when the API or
  the controller committed in this process; PostgreSQL's NOTIFY (db.listen) when
  another replica did; on SQLite, which has neither across processes, a poll every
  `poll_sec` of the desired revisions alone (two columns, nothing parsed), and a pass
  over the services whose revision moved since this leader last reconciled them: a
  full pass every `poll_sec` cost a thousand routes parsed from etcd and SQL four
  times a second (decision 0033);
- a full pass when it takes the lead and every `full_pass_sec`, which repairs what no
  commit announced: a wiped key, an etcd restored from an old snapshot, a route
  written by hand. Each repair is a `route_reconciled` event naming what was found.
  A commit announced during a full pass has its routes written between the pass's
  parts (routes, window rules, each kind of config), not after the whole pass.

Every pass also makes the window rules in etcd (`windows/<experiment>`, what the
collectors need of an experiment's own rule) equal to those the experiments in SQL
call for; a full pass, and one woken by a committed config (`Wake.configs`), makes the
services' breaker rules and overload protections equal to their desired configs
(controller.configs): all with the same fence and compare-and-swap (value_plan). A
pass after a route commit leaves the configs alone: a thousand rules parsed on each
decision would cost more than the decision.

Nothing etcd holds can claim to be newer than what the leader writes: sidecars hold
the last route etcd delivered them, whatever its revision field says, so a route
written by hand is superseded by the leader's next write of the desired one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pydantic import TypeAdapter, ValidationError

from controlplane.controller.configs import ConfigReconciler, apply_change, read_values
from controlplane.controller.metrics import ControllerStats
from controlplane.controller.parsed_by_text import ParsedByText
from controlplane.controller.route_plan import (
    Found,
    RouteOp,
    RoutePlan,
    Stored,
    moved_services,
    plan_route,
)
from controlplane.controller.value_plan import plan_values
from controlplane.db import experiments as records
from controlplane.db import routes as desired_routes
from controlplane.db.listen import listen_for_routes, listens
from controlplane.db.service_configs import CONFIGS_NOTICE
from controlplane.db.window_rules import desired_window_rules
from controlplane.experiments.events import EventKind
from controlplane.kernel.backoff import Backoff, BackoffPolicy
from controlplane.kernel.clock import utc_now
from controlplane.kernel.errors import (
    BackendError,
    CanaryError,
    NotLeader,
    RevisionConflict,
    ValidationFailed,
)
from controlplane.kernel.keys import is_experiment_id
from controlplane.kernel.kv import Fence, KeyValue
from controlplane.kernel.routes import CANARY, Route, parse_route
from controlplane.kernel.tasks import cancel_and_wait
from controlplane.kernel.values import ServiceName
from controlplane.kernel.window_rules import WindowRule, parse_window_rule
from controlplane.runtime import Backends

log = logging.getLogger(__name__)

ROUTE_RECONCILED = EventKind.ROUTE_RECONCILED
LISTEN_AGAIN_BACKOFF = BackoffPolicy(initial=1.0, maximum=10.0)
# a pass over more services than this reads their routes with one prefix read: a get
# per service is a turn of the loop each, and the rounds of a thousand experiments
# judge one between two turns (a pass after a new term took half a minute)
ROUTE_GETS_MAX = 8
# route writes a pass has in flight at once
ROUTE_WRITES_AT_ONCE = 32


def fence_entry(fence: Fence) -> dict[str, Any]:
    """Which leadership term wrote, for an event's payload: the etcd create revision of
    the leader's election key, whose value names it."""
    return {"key": fence.key, "revision": fence.create_revision}


def route_fields(route: Route) -> dict[str, Any]:
    """A route as an event's payload names it."""
    return {
        "experiment": route.experiment,
        "revision": route.revision,
        "canary_weight_bp": route.weight_of(CANARY),
        "state": route.state.value,
    }


_SERVICE_NAME: TypeAdapter[str] = TypeAdapter(ServiceName)


def is_service_name(name: str) -> bool:
    """Whether `name` can be a service (a key under the routes prefix, a notice)."""
    try:
        _SERVICE_NAME.validate_python(name)
    except ValidationError:
        return False
    return True


def _readable_route(_key: str, raw: bytes) -> Route | None:
    """The route a key in etcd holds; None when it does not read."""
    try:
        return parse_route(raw)
    except ValidationFailed:
        return None


def _window_bytes(rule: WindowRule) -> bytes:
    return rule.to_json().encode()


@dataclass
class RouteReconciler:
    full_pass_sec: float = 5.0
    # without LISTEN/NOTIFY (SQLite), how often to look for other processes' commits
    poll_sec: float = 0.25
    # after a lost race or a listener failure, look again this soon
    retry_sec: float = 0.05
    stats: ControllerStats = field(default_factory=ControllerStats)
    # per service, the revision this leader last wrote or found in sync
    _last_written: dict[str, int] = field(default_factory=dict)
    # per service, the desired revision the last pass over it read (what a poll compares)
    _reconciled: dict[str, int] = field(default_factory=dict)
    configs: ConfigReconciler = field(default_factory=ConfigReconciler)
    # a commit announced during a full pass has its routes written between the pass's
    # parts; False: after the whole pass, as before (the benchmark's same-run reference)
    ahead_of_full_pass: bool = True
    # wake-ups a full pass took between its parts (`_woken_meanwhile`), ever
    _wakes_taken: int = 0
    # the routes read from etcd and from SQL, parsed once per text (parsed_by_text.py)
    _stored_routes: ParsedByText[str, bytes, Route | None] = field(
        default_factory=lambda: ParsedByText(_readable_route)
    )
    _desired_routes: ParsedByText[str, tuple[int, Any], Route] = field(
        default_factory=lambda: ParsedByText(desired_routes.route_of_document)
    )

    # ------------------------------------------------------------------ the loop

    async def run(self, backends: Backends, fence: Fence | None) -> None:
        """Reconcile until cancelled; raises NotLeader or BackendError to step down."""
        self._last_written.clear()  # a new term trusts nothing it remembers
        self._reconciled.clear()
        self.configs.new_term()
        listener = (
            asyncio.create_task(self._listen(backends))
            if listens(backends.database.engine.url)
            else None
        )
        loop = asyncio.get_running_loop()
        try:
            again = await self.reconcile(backends, fence)
            next_full = loop.time() + self.full_pass_sec
            while True:
                idle = self.full_pass_sec if listener is not None else self.poll_sec
                timeout = max(min(idle, next_full - loop.time()), 0.0)
                if again:
                    timeout = min(timeout, self.retry_sec)
                wake = await backends.route_changes.wait(timeout)
                full = wake.full or loop.time() >= next_full
                if full or (not wake.services and not wake.configs
                            and (again or listener is not None)):
                    again = await self.reconcile(backends, fence)
                    next_full = loop.time() + self.full_pass_sec
                elif wake.services or wake.configs:
                    again = await self.reconcile(backends, fence, services=wake.services,
                                                 configs=wake.configs)
                else:
                    again = await self._poll(backends, fence)
        finally:
            if listener is not None:
                with contextlib.suppress(Exception):
                    await cancel_and_wait(listener)

    async def _listen(self, backends: Backends) -> None:
        """Forward PostgreSQL's notices; after a lost connection, listen again (a full
        pass follows every LISTEN)."""
        changes = backends.route_changes
        backoff = Backoff(LISTEN_AGAIN_BACKOFF)

        def listening() -> None:
            backoff.reset()
            changes.notify_all()

        def accept(payload: str) -> bool:
            if is_service_name(payload) or payload == CONFIGS_NOTICE:
                return True
            self.stats.route_notices_dropped += 1
            return False

        def on_change(payload: str) -> None:
            if payload == CONFIGS_NOTICE:
                changes.notify_configs()
            else:
                changes.notify(payload)

        while True:
            try:
                await listen_for_routes(backends.database.engine.url, on_change,
                                        accept=accept, on_listening=listening)
            except BackendError as exc:
                log.warning("%s; listening again shortly (full passes meanwhile)", exc)
            await asyncio.sleep(backoff.next_delay())

    async def _poll(self, backends: Backends, fence: Fence | None) -> bool:
        """Without NOTIFY: reconcile the services whose desired revision moved."""
        self.stats.revision_polls += 1
        revisions = await backends.database.read(desired_routes.desired_revisions)
        moved = moved_services(self._reconciled, revisions)
        if not moved:
            return False
        return await self.reconcile(backends, fence, services=moved, configs=False)

    # ------------------------------------------------------------------ one pass

    async def reconcile(
        self, backends: Backends, fence: Fence | None, services: Collection[str] | None = None,
        *, configs: bool = True,
    ) -> bool:
        """One pass over every service's route (or those of `services`), the window
        rules, and with `configs` the breaker rules and overload configs; True when one
        must be looked at again soon (a lost race).

        A full pass (no `services`) takes seconds at a thousand services on a leader
        busy with its rounds: a route committed meanwhile is written between its parts
        (`_woken_meanwhile`), not after them."""
        again = await self._reconcile_routes(backends, fence, services)
        full = services is None and self.ahead_of_full_pass
        if full:
            again = await self._woken_meanwhile(backends, fence) or again
        again = await self.reconcile_windows(backends, fence) or again
        if configs:
            self.configs.stats = self.stats  # one set of counters (the runner replaces them)
            taken_before = self._wakes_taken
            before_each = partial(self._woken_meanwhile, backends, fence) if full else None
            again = await self.configs.reconcile(backends, fence, before_each) or again
            if self._wakes_taken != taken_before:
                # those commits may start or end an experiment: its window rule too
                again = await self.reconcile_windows(backends, fence) or again
        self.stats.reconcile_passes += 1  # once the pass is over
        return again

    async def _woken_meanwhile(self, backends: Backends, fence: Fence | None) -> bool:
        """The routes of the services whose commit was announced since the pass began
        (a trip's among them), reconciled now; True after a lost race."""
        services = backends.route_changes.take_services()
        if not services:
            return False
        self._wakes_taken += 1
        self.stats.routes_ahead_of_full_pass += len(services)
        return await self._reconcile_routes(backends, fence, services)

    async def _reconcile_routes(
        self, backends: Backends, fence: Fence | None, services: Collection[str] | None
    ) -> bool:
        """The routes of `services` (None: of every service) made what SQL says; True
        after a lost race."""
        stored = await self._read_stored(backends, services)
        documents = await backends.database.read(
            desired_routes.desired_route_documents, services=services
        )
        desired = {
            service: self._desired_routes.get(service, row) for service, row in documents.items()
        }
        if services is None:
            self._desired_routes.keep(documents)
            self._reconciled = {service: route.revision for service, route in desired.items()}
        else:
            for service in services:
                route = desired.get(service)
                if route is None:
                    self._reconciled.pop(service, None)
                else:
                    self._reconciled[service] = route.revision
        failed: list[tuple[str, BaseException]] = []
        writes: list[tuple[str, RoutePlan, Stored | None]] = []
        for service in sorted(set(stored) | set(desired) | set(services or ())):
            try:
                plan = self._plan(service, desired.get(service), stored.get(service))
            except (CanaryError, ValueError) as exc:
                failed.append((service, exc))
                continue
            if plan is not None:
                writes.append((service, plan, stored.get(service)))
        # the writes a few dozen at once: an await each would be a turn of the loop each,
        # which a thousand experiments' rounds share (a new leader over a thousand
        # routes etcd never held)
        for start in range(0, len(writes), ROUTE_WRITES_AT_ONCE):
            chunk = writes[start : start + ROUTE_WRITES_AT_ONCE]
            outcomes = await asyncio.gather(
                *(self._publish(backends, fence, s, plan, held) for s, plan, held in chunk),
                return_exceptions=True,
            )
            failed += [(s, outcome) for (s, _, _), outcome in zip(chunk, outcomes, strict=True)
                       if isinstance(outcome, BaseException)]
            _raise_lost(failed)  # no further chunk once the lead or a backend is lost
        return self._settle(failed)

    async def reconcile_windows(self, backends: Backends, fence: Fence | None) -> bool:
        """Make every window rule in etcd what SQL calls for; True after a lost race."""
        stored = await read_values(
            backends.kv, backends.keys.windows_prefix, is_experiment_id,
            lambda _, raw: parse_window_rule(raw),
        )
        desired = await backends.database.read(desired_window_rules)
        again = False
        for change in plan_values(desired, stored):
            try:
                await apply_change(backends.kv, backends.keys.window(change.name), change,
                                 _window_bytes, fence)
            except RevisionConflict as exc:
                self.stats.conflicts += 1
                log.info("window rule of experiment %s changed under the reconciler: %s",
                         change.name, exc)
                again = True
                continue
            if change.write is None:
                self.stats.window_rules_deleted += 1
            else:
                self.stats.window_rules_published += 1
        return again

    async def _read_stored(
        self, backends: Backends, services: Collection[str] | None
    ) -> dict[str, Stored]:
        if services is not None and len(services) <= ROUTE_GETS_MAX:
            found: dict[str, Stored] = {}
            for service in services:
                value = await backends.kv.get(backends.keys.route(service))
                if value is not None:
                    found[service] = self._stored(value)
            return found
        prefix = backends.keys.routes_prefix
        values, _ = await backends.kv.get_prefix(prefix)
        wanted = None if services is None else set(services)
        found = {
            name: self._stored(value)
            for value in values
            if (name := value.key[len(prefix):]) and (wanted is None or name in wanted)
            and is_service_name(name)
        }
        if services is None:
            self._stored_routes.keep({value.key for value in values})
        return found

    def _stored(self, value: KeyValue) -> Stored:
        """The key's route and mod revision, its route parsed once per text."""
        return Stored(self._stored_routes.get(value.key, value.value), value.mod_revision)

    def _plan(self, service: str, desired: Route | None, stored: Stored | None) -> RoutePlan | None:
        """What to write for `service`; None when etcd holds what SQL says."""
        plan = plan_route(desired, stored, last_written=self._last_written.get(service))
        if plan.op is RouteOp.NOTHING:
            if plan.found is Found.IN_SYNC and desired is not None:
                self._last_written[service] = desired.revision
            return None
        return plan

    def _settle(self, failed: list[tuple[str, BaseException]]) -> bool:
        """Count and log the services a pass could not reconcile; True when one lost a
        race (look again soon). A lost lead or a backend's failure is raised, after
        the writes begun with it have ended."""
        _raise_lost(failed)
        again = False
        for service, exc in failed:
            self._reconciled.pop(service, None)  # the next poll looks again
            if isinstance(exc, RevisionConflict):
                self.stats.conflicts += 1
                log.info("route of %r changed under the reconciler: %s", service, exc)
                again = True
            elif isinstance(exc, (CanaryError, ValueError)):
                self.stats.errors += 1
                log.warning("route of %r not reconciled: %s", service, exc)
            else:
                raise exc
        return again

    async def _publish(
        self, backends: Backends, fence: Fence | None, service: str, plan: RoutePlan,
        stored: Stored | None,
    ) -> None:
        assert plan.route is not None
        await backends.kv.compare_and_swap(
            backends.keys.route(service),
            plan.route.to_json().encode(),
            expected_mod_revision=stored.mod_revision if stored is not None else 0,
            fence=fence,
        )
        self._last_written[service] = plan.route.revision
        self.stats.routes_published += 1
        if plan.repair:
            self.stats.routes_reconciled += 1
            log.warning("service %r: %s", service, _reason(plan, stored))
            await self._record(backends, service, plan, stored, fence)

    async def _record(
        self, backends: Backends, service: str, plan: RoutePlan, stored: Stored | None,
        fence: Fence | None,
    ) -> None:
        now = utc_now(backends.clock)
        async with backends.database.transaction() as tx:
            await tx.run(_record_event, **self._event(service, plan, stored, fence, now))

    def _event(
        self, service: str, plan: RoutePlan, stored: Stored | None, fence: Fence | None, now: Any
    ) -> dict[str, Any]:
        assert plan.route is not None
        payload: dict[str, Any] = {
            "found": plan.found.value,
            "stored": (
                None if stored is None
                else "unreadable" if stored.route is None
                else route_fields(stored.route)
            ),
            "published": route_fields(plan.route),
            "route_revision": plan.route.revision,
        }
        if fence is not None:
            payload["leader_fence"] = fence_entry(fence)
        experiment = plan.route.experiment if plan.op is not RouteOp.NEUTRALISE else None
        return {
            "service": service,
            "experiment_id": experiment if isinstance(experiment, int) else None,
            "at": now,
            "reason": _reason(plan, stored),
            "payload": payload,
        }


def _raise_lost(failed: list[tuple[str, BaseException]]) -> None:
    """A lost lead first, then a backend's failure, if a write met one."""
    for kind in (NotLeader, BackendError):
        for _, exc in failed:
            if isinstance(exc, kind):
                raise exc


def _record_event(*, session: Any, **event: Any) -> None:
    records.record_event(session=session, actor="controller", kind=ROUTE_RECONCILED, **event)


def _describe(route: Route) -> str:
    return (f"experiment {route.experiment} revision {route.revision} "
            f"(canary {route.weight_of(CANARY)} bp, {route.state.value})")


def _reason(plan: RoutePlan, stored: Stored | None) -> str:
    assert plan.route is not None
    held = (
        "no route" if stored is None
        else "an unreadable route" if stored.route is None
        else f"the route of {_describe(stored.route)}"
    )
    what = {
        Found.MISSING: "the desired route was missing",
        Found.OLDER: "an older route than the desired one",
        Found.NEWER: "a route newer than the desired one, which the database never had",
        Found.FOREIGN: "a route at the desired revision with other content",
        Found.UNREADABLE: "a value that is no route",
        Found.UNOWNED: "a route sending canary traffic, for a service the database has "
                       "no route for",
    }.get(plan.found, plan.found.value)
    return f"etcd held {held}: {what}; published {_describe(plan.route)}"
