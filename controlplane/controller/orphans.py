"""A route no committed transaction wrote, on a service where no experiment is active.

A start publishes the first step's route between the row's flush and the commit
(experiments.actions). If that commit fails, etcd keeps a route that sends canary
traffic for an experiment whose row is still a draft. No experiment of the service is
active, so `reconcile` (which walks the active rows) never looks at the service, and
the sidecars would keep feeding a canary that no breaker watches. So each round the
leader also reads every route and, for a service with no active experiment, asks
whether a committed transaction wrote the route it holds. It did not when the route

- names a row of the service (a draft, or a finished experiment) that knows a lower
  `route_revision` (a draft knows none): a write whose transaction rolled back;
- names no row of the service (a draft deleted, or moved to another service, after
  its failed start) and sends the canary traffic: without an active experiment, no
  committed route does.

Such a route goes back to what the database says the service's traffic is:

- the route of the service's last finished experiment that published one (the highest
  `route_revision` among promoted, rolled back and aborted rows), as that row
  describes it (`route_state_of`): promoted, everything to the released canary;
  rolled back or aborted, everything to the baseline;
- else a baseline-only route (canary 0 bp, `rolled_back`) built from the named draft
  (or, without one, from the stored route itself). The route contract (architecture
  §4) has no state for "no experiment", and deleting the key would leave a sidecar
  without a default upstream answering 503: the baseline is what the service is
  meant to serve.

The row the restored route names learns its revision, so the next round finds route
and database in line, and `route_reconciled` is recorded on the row the stored route
named (a service event when it names none of the service's), in one transaction:

    orphans? (pure) → lock the named row (flush) → orphan? again → publish, fenced
    → note the revision → record → commit
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from controlplane.controller.apply import fence_entry
from controlplane.controller.reconcile import ROUTE_RECONCILED, route_fields, stored_route
from controlplane.db import experiments as records
from controlplane.db.models import ACTIVE_STATES, Experiment
from controlplane.experiments.actions import route_source, utc_now
from controlplane.experiments.lifecycle import route_state_of
from controlplane.kernel.errors import RevisionConflict, ValidationFailed
from controlplane.kernel.kv import Fence, KeyValue
from controlplane.kernel.routes import BASELINE, CANARY, Route, RouteState, parse_route
from controlplane.kernel.values import in_sql_range
from controlplane.routing.publish import RouteSource, publish_route
from controlplane.runtime import Backends

# ------------------------------------------------------------------------- pure


@dataclass(frozen=True)
class NamedRow:
    """The row a stored route names, as the database has it."""

    experiment: int
    service: str
    state: str
    route_revision: int
    version: int


@dataclass(frozen=True)
class OrphanRoute:
    """A service's stored route that no committed transaction wrote."""

    service: str
    stored: Route
    # the row the route names, if the database has it (of this service or another)
    named: NamedRow | None

    @property
    def owner(self) -> NamedRow | None:
        """The named row if it is one of this service's (a draft or a finished one)."""
        if self.named is None or self.named.service != self.service:
            return None
        return self.named


@dataclass(frozen=True)
class FinishedRoute:
    """The route a finished experiment's row describes."""

    experiment: int
    experiment_state: str
    route_revision: int
    canary_bp: int
    state: RouteState


@dataclass(frozen=True)
class Restore:
    """The route an orphan gives way to.

    `experiment`: the row it is built from and whose revision it becomes (None: built
    from the stored route, for a route that names none of the service's rows).
    `finished`: the last finished experiment's route, else a baseline-only one.
    """

    experiment: int | None
    canary_bp: int
    state: RouteState
    finished: FinishedRoute | None


def experiment_id_of(route: Route) -> int | None:
    """The experiment row id a route names; None for a name no row can have."""
    if isinstance(route.experiment, int):
        return route.experiment
    if not (route.experiment.isascii() and route.experiment.isdigit()):
        return None
    number = int(route.experiment)
    return number if in_sql_range(number) else None  # a larger number names no row


def routes_by_service(values: Iterable[KeyValue], prefix: str) -> dict[str, Route]:
    """The readable routes under `prefix`, by service. An unreadable one is not
    repaired here: the sidecars reject it and keep the route in force."""
    routes: dict[str, Route] = {}
    for value in values:
        service = value.key[len(prefix) :]
        if not service or "/" in service:
            continue
        try:
            routes[service] = parse_route(value.value)
        except ValidationFailed:
            continue
    return routes


def experiments_to_look_up(routes: Mapping[str, Route], active_services: Set[str]) -> set[int]:
    """The rows to read: those named by the routes of services with no active experiment."""
    named = (experiment_id_of(r) for s, r in routes.items() if s not in active_services)
    return {experiment for experiment in named if experiment is not None}


def orphan_route(
    service: str, stored: Route | None, *, active: bool, named: NamedRow | None
) -> OrphanRoute | None:
    """The service's route if no committed transaction wrote it, else None.

    `active`: the service has a running or paused experiment (whose row owns the
    route: controller.reconcile). `named`: the row the route names, if any.
    """
    if active or stored is None:
        return None
    if named is not None and named.service == service:
        # an active row here started after the round's read: reconcile's, next round
        if named.state in ACTIVE_STATES or stored.revision <= named.route_revision:
            return None
    elif stored.weight_of(CANARY) == 0:
        return None  # it names no row of the service, but sends the canary nothing
    return OrphanRoute(service, stored, named)


def orphan_routes(
    routes: Mapping[str, Route],
    *,
    active_services: Set[str],
    rows: Mapping[int, NamedRow],
) -> list[OrphanRoute]:
    """The services whose route no committed transaction wrote, in service order."""
    orphans: list[OrphanRoute] = []
    for service, route in sorted(routes.items()):
        experiment = experiment_id_of(route)
        named = rows.get(experiment) if experiment is not None else None
        orphan = orphan_route(service, route, active=service in active_services, named=named)
        if orphan is not None:
            orphans.append(orphan)
    return orphans


def restore_of(orphan: OrphanRoute, finished: FinishedRoute | None) -> Restore:
    """What the service's route goes back to: the last finished experiment's, if one
    published a route, else a baseline-only route of the draft (or of the stored route)."""
    if finished is not None:
        return Restore(finished.experiment, finished.canary_bp, finished.state, finished)
    owner = orphan.owner
    return Restore(owner.experiment if owner is not None else None, 0, RouteState.ROLLED_BACK, None)


# ------------------------------------------------------------------------- reads


def named_row(experiment: Experiment) -> NamedRow:
    return NamedRow(
        experiment=experiment.id,
        service=experiment.service,
        state=experiment.state,
        route_revision=experiment.route_revision,
        version=experiment.version,
    )


def finished_route(experiment: Experiment) -> FinishedRoute:
    state = route_state_of(experiment.state, experiment.breaker_state)
    assert state is not None, "a finished experiment describes a route"
    return FinishedRoute(
        experiment=experiment.id,
        experiment_state=experiment.state,
        route_revision=experiment.route_revision,
        canary_bp=experiment.canary_weight_bp,
        state=state,
    )


def _named_rows(*, session: Session, experiment_ids: set[int]) -> dict[int, NamedRow]:
    rows = records.route_marks(session=session, experiment_ids=experiment_ids)
    return {row[0]: NamedRow(*row) for row in rows}


async def find_orphan_routes(backends: Backends, *, active_services: Set[str]) -> list[OrphanRoute]:
    """One prefix read of the routes; SQL only when a service has no active experiment."""
    prefix = backends.keys.routes_prefix
    values, _ = await backends.kv.get_prefix(prefix)
    routes = routes_by_service(values, prefix)
    if all(service in active_services for service in routes):
        return []
    ids = experiments_to_look_up(routes, active_services)
    rows = await backends.database.read(_named_rows, experiment_ids=ids) if ids else {}
    return orphan_routes(routes, active_services=active_services, rows=rows)


# ------------------------------------------------------------------------- repair


@dataclass
class _Service:
    """The service as the repair transaction sees it, the named row locked."""

    named: Experiment | None
    finished: Experiment | None


def _lock(*, session: Session, orphan: OrphanRoute, at: datetime) -> _Service:
    """Lock the named row of the service (version check, flush), then read the rest.

    A start publishes its route after flushing the row and commits after: the flush
    here waits for such a transaction to end, then fails (RevisionConflict) if it
    committed. So an orphan still seen after it is a start that rolled back, never one
    about to commit. A route that names no row of the service has no start in flight.
    """
    owner = orphan.owner
    named: Experiment | None = None
    if owner is not None:
        named = session.get(Experiment, owner.experiment)
        if named is None:
            raise RevisionConflict(f"experiment {owner.experiment} was deleted meanwhile")
        if named.version != owner.version:
            raise RevisionConflict(
                f"experiment {owner.experiment} changed (version {owner.version} → {named.version})"
            )
        named.updated_at = at
        session.flush()
    else:
        experiment = experiment_id_of(orphan.stored)
        if experiment is not None:
            named = session.get(Experiment, experiment)
    active = records.active_experiment(session=session, service=orphan.service)
    if active is not None:
        raise RevisionConflict(
            f"experiment {active.id} of {orphan.service!r} is active now: it owns the route"
        )
    finished = records.last_finished_route(session=session, service=orphan.service)
    return _Service(named, finished)


def _owner_id(orphan: OrphanRoute) -> int | None:
    owner = orphan.owner
    return owner.experiment if owner is not None else None


def _source(stored: Route, service: str) -> RouteSource:
    """A route source from a stored route, for a route that names no row of the service."""
    upstreams = {v.name: v.upstream for v in stored.variants}
    if BASELINE not in upstreams:
        raise ValidationFailed(
            f"the route of {service!r} names no experiment of it and has no baseline: "
            "nothing to restore it to"
        )
    return RouteSource(
        experiment=stored.experiment,
        service=service,
        salt=stored.salt,
        sticky=stored.sticky,
        baseline_upstream=upstreams[BASELINE],
        canary_upstream=upstreams.get(CANARY, upstreams[BASELINE]),
    )


def _why(orphan: OrphanRoute) -> str:
    stored, named = orphan.stored, orphan.named
    head = (
        f"route revision {stored.revision} in etcd (canary {stored.weight_of(CANARY)} bp, "
        f"{stored.state.value}) names experiment {stored.experiment}"
    )
    if named is None:
        return (
            f"{head}, which the database does not have (a draft deleted after its failed "
            "start, or a route not written by this control plane)"
        )
    if named.service != orphan.service:
        return f"{head}, which now belongs to service {named.service!r}"
    if named.state == "draft":
        return f"{head}, a draft: its start never committed"
    return (
        f"{head}, {named.state}, which knew revision {named.route_revision}: "
        "that write never committed"
    )


def _what(restore: Restore, route: Route, service: str) -> str:
    if restore.finished is not None:
        return (
            f"restored the route of experiment {restore.finished.experiment} "
            f"({restore.finished.experiment_state}, canary {route.weight_of(CANARY)} bp, "
            f"{route.state.value}) as revision {route.revision}"
        )
    return (
        f"no experiment of {service!r} ever committed a route: published a baseline-only "
        f"route (canary 0 bp, {route.state.value}) as revision {route.revision}"
    )


def _note_and_record(
    *,
    session: Session,
    orphan: OrphanRoute,
    restore: Restore,
    row: Experiment | None,
    route: Route,
    fence: Fence | None,
    at: datetime,
) -> None:
    if row is not None:
        row.route_revision = route.revision
    owner = orphan.owner
    named = orphan.named
    payload: dict[str, Any] = {
        "stored": route_fields(orphan.stored),
        "restored": {
            **route_fields(route),
            "from": "finished_experiment" if restore.finished is not None else "baseline_only",
        },
        "named_row": (
            None
            if named is None
            else {
                "service": named.service,
                "state": named.state,
                "route_revision": named.route_revision,
            }
        ),
        "route_revision": route.revision,
    }
    if fence is not None:
        payload["leader_fence"] = fence_entry(fence)
    records.record_event(
        session=session,
        experiment_id=owner.experiment if owner is not None else None,
        service=orphan.service,
        at=at,
        actor="controller",
        kind=ROUTE_RECONCILED,
        reason=(
            f"{_why(orphan)}, and no experiment of {orphan.service!r} is active; "
            f"{_what(restore, route, orphan.service)}"
        ),
        payload=payload,
    )


async def restore_route(backends: Backends, *, orphan: OrphanRoute, fence: Fence | None) -> Route:
    """Put the service's route back to what the database says, as the round found it.

    RevisionConflict when the service moved on meanwhile (a start committed, the
    route changed): the next round decides again.
    """
    key = backends.keys.route(orphan.service)
    at = utc_now(backends.clock)
    async with backends.database.transaction() as tx:
        service = await tx.run(_lock, orphan=orphan, at=at)
        stored = await stored_route(backends.kv, key)
        named = named_row(service.named) if service.named is not None else None
        again = orphan_route(orphan.service, stored, active=False, named=named)
        if again is None or stored != orphan.stored or _owner_id(again) != _owner_id(orphan):
            raise RevisionConflict(f"the route of {orphan.service!r} changed meanwhile")
        finished = service.finished
        restore = restore_of(orphan, finished_route(finished) if finished else None)
        row = finished if finished is not None else (service.named if orphan.owner else None)
        route = await publish_route(
            backends.kv,
            backends.keys,
            experiment=route_source(row)
            if row is not None
            else _source(again.stored, orphan.service),
            canary_bp=restore.canary_bp,
            state=restore.state,
            fence=fence,
        )
        await tx.run(
            _note_and_record,
            orphan=orphan,
            restore=restore,
            row=row,
            route=route,
            fence=fence,
            at=at,
        )
    return route
