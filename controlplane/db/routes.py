"""Data access for the desired route of each service (models.ServiceRoute).

Synchronous functions given the session of the caller's transaction; they never
commit. On PostgreSQL a saved route also queues a NOTIFY on ROUTES_CHANNEL with the
service as payload: PostgreSQL delivers it when (and only if) the transaction
commits, which is what wakes the leader's reconciler on another replica
(db.listen).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from controlplane.db.models import Experiment, ServiceRoute
from controlplane.kernel.errors import CodecError, RevisionConflict, ValidationFailed
from controlplane.kernel.routes import BASELINE, CANARY, Route, RouteState, Sticky, parse_route
from controlplane.routing.build import RouteSource, build_route

ROUTES_CHANNEL = "canary_routes"


def _route_of(row: ServiceRoute) -> Route:
    return route_of_document(row.service, (row.revision, row.route))


def route_of_document(service: str, row: tuple[int, Any]) -> Route:
    """A desired route from its row's revision and document (pure); CodecError when
    the document does not read or names another revision."""
    revision, document = row
    try:
        route = parse_route(document)
    except ValidationFailed as exc:
        # written by this code only; unreadable means a hand edit or a bug: never publish it
        raise CodecError(f"the desired route of {service!r} is unreadable: {exc}") from exc
    if route.revision != revision:
        raise CodecError(
            f"the desired route of {service!r} says revision {route.revision}, "
            f"its row {revision}"
        )
    return route


def desired_revision(*, session: Session, service: str) -> int:
    """The revision of the service's desired route; 0 when it has none."""
    row = session.get(ServiceRoute, service)
    return row.revision if row is not None else 0


def desired_revisions(*, session: Session) -> dict[str, int]:
    """Every service's desired route revision: two narrow columns, no route parsed.
    What a poll compares to find the services whose route moved (SQLite has no NOTIFY)."""
    rows = session.execute(select(ServiceRoute.service, ServiceRoute.revision))
    return {service: int(revision) for service, revision in rows}


def desired_route(*, session: Session, service: str) -> Route | None:
    row = session.get(ServiceRoute, service)
    return _route_of(row) if row is not None else None


def desired_route_documents(
    *, session: Session, services: Collection[str] | None = None
) -> dict[str, tuple[int, Any]]:
    """The desired routes by service (every one, or those of `services`), unparsed:
    each one's revision and document, for the reconciler to parse once per document
    text (`route_of_document`)."""
    query = select(ServiceRoute.service, ServiceRoute.revision, ServiceRoute.route)
    if services is not None:
        if not services:
            return {}
        query = query.where(ServiceRoute.service.in_(sorted(services)))
    return {service: (int(revision), route) for service, revision, route in session.execute(query)}


def save_desired_route(
    *,
    session: Session,
    service: str,
    experiment_id: int,
    route: Route,
    now: datetime,
    expected_revision: int | None = None,
) -> None:
    """Store `route` as the service's desired route.

    Its revision must be above the stored one (revisions only grow). With
    `expected_revision`, the stored revision must still be that one (the caller
    decided on it); a concurrent change raises RevisionConflict either way.
    """
    row = session.get(ServiceRoute, service)
    current = row.revision if row is not None else 0
    if expected_revision is not None and current != expected_revision:
        raise RevisionConflict(
            f"the desired route of {service!r} moved (revision {expected_revision} → {current})"
        )
    if route.revision <= current:
        raise RevisionConflict(
            f"route revision {route.revision} of {service!r} is not above {current}"
        )
    document = route.model_dump(mode="json")
    if row is None:
        session.add(
            ServiceRoute(
                service=service,
                experiment_id=experiment_id,
                revision=route.revision,
                route=document,
                updated_at=now,
            )
        )
    else:
        row.experiment_id = experiment_id
        row.revision = route.revision
        row.route = document
        row.updated_at = now
    session.flush()
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_notify(:channel, :service)"),
            {"channel": ROUTES_CHANNEL, "service": service},
        )


def source_of(experiment: Experiment) -> RouteSource:
    """What the experiment's routes are built from."""
    return RouteSource(
        experiment=experiment.id,
        service=experiment.service,
        salt=experiment.salt,
        sticky=Sticky(header=experiment.sticky_header, cookie=experiment.sticky_cookie),
        baseline_upstream=experiment.upstream_of(BASELINE),
        canary_upstream=experiment.upstream_of(CANARY),
    )


def commit_route_of(
    *, session: Session, experiment: Experiment, canary_bp: int, state: RouteState,
    now: datetime,
) -> Route:
    """Make the experiment's route (`canary_bp`, `state`) its service's next desired
    route, one revision above the last, and note the revision in the experiment."""
    revision = max(desired_revision(session=session, service=experiment.service),
                   experiment.route_revision) + 1
    route = build_route(source_of(experiment), canary_bp=canary_bp, state=state,
                        revision=revision)
    save_desired_route(session=session, service=experiment.service,
                       experiment_id=experiment.id, route=route, now=now)
    experiment.route_revision = revision
    return route

