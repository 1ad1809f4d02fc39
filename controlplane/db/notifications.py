"""Data access for webhook subscriptions and the outbox of their deliveries.

Synchronous functions given the caller's session; they never commit. Three callers:

- `enqueue_for_event`, from db.experiments.record_event: the outbox rows of an event
  go into the event's own transaction (a rolled-back event is never announced, a
  committed one always is);
- the API (subscriptions, the delivery listing);
- the dispatcher (notify.dispatcher): `claim_due` leases the deliveries it may send
  now, `record_attempt` writes what came of one, `release_claims` gives back the
  leases of a dispatcher that stops.

A delivery is due when it is pending, its next attempt time has come, nobody holds a
live lease on it, and no earlier delivery of the same subscription and stream
(experiment) is still pending: that is what keeps each experiment's notifications in
order. Leasing is a conditional UPDATE, so on PostgreSQL and on SQLite alike two
dispatchers never hold the same row; a dispatcher that dies leaves a lease that runs
out, and the row is sent again (at least once).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, bindparam, delete, func, insert, or_, select, update
from sqlalchemy.orm import Session

from controlplane.db.models import Event, Experiment, NotificationDelivery, NotificationSubscription
from controlplane.kernel.errors import Conflict, NotFound
from controlplane.kernel.values import in_sql_range
from controlplane.notify.kinds import NOTIFIABLE_KINDS, wants
from controlplane.notify.records import (
    AnnouncedEvent,
    ClaimedDelivery,
    DeliveryRecord,
    DeliveryStatus,
    Format,
    SubscriptionRecord,
    SubscriptionSpec,
)

# fan-out is bounded: every event may cost one row per subscription
MAX_SUBSCRIPTIONS = 200
ERROR_MAX = 500


def subscription_record(row: NotificationSubscription) -> SubscriptionRecord:
    return SubscriptionRecord(
        id=row.id, name=row.name, url=row.url, service=row.service,
        kinds=tuple(row.kinds), format=Format(row.format), enabled=row.enabled,
        created_at=row.created_at, created_by=row.created_by, updated_at=row.updated_at,
    )  # fmt: skip


def stream_of(event: Event) -> str:
    """The order a subscriber sees: per experiment, else per service."""
    if event.experiment_id is not None:
        return f"experiment:{event.experiment_id}"
    return f"service:{event.service}"


# --- the outbox, written with the event ------------------------------------------


# built once: an event write pays for executing it, not for composing it again
_WANTING = (
    select(NotificationSubscription.id, NotificationSubscription.kinds)
    .where(
        NotificationSubscription.enabled.is_(True),
        or_(
            NotificationSubscription.service.is_(None),
            NotificationSubscription.service == bindparam("service"),
        ),
    )
    .order_by(NotificationSubscription.id)
)
_QUEUE = insert(NotificationDelivery)


def enqueue_for_event(*, session: Session, event: Event) -> int:
    """Queue the event for every enabled subscription that wants it; how many."""
    if event.kind not in NOTIFIABLE_KINDS:
        return 0
    wanting = [
        subscription_id
        for subscription_id, kinds in session.execute(_WANTING, {"service": event.service})
        if wants(kinds, event.kind)
    ]
    if not wanting:
        return 0
    common = {
        "event_id": event.id,
        "experiment_id": event.experiment_id,
        "service": event.service,
        "kind": event.kind,
        "stream": stream_of(event),
        "status": DeliveryStatus.PENDING.value,
        "attempts": 0,
        "created_at": event.at,
        "next_attempt_at": event.at,
    }
    session.execute(_QUEUE, [{"subscription_id": sid, **common} for sid in wanting])
    return len(wanting)


# --- subscriptions ----------------------------------------------------------------


def _get(session: Session, subscription_id: int) -> NotificationSubscription:
    row = (
        session.get(NotificationSubscription, subscription_id)
        if in_sql_range(subscription_id)
        else None
    )
    if row is None:
        raise NotFound(f"no subscription {subscription_id}")
    return row


def _name_taken(session: Session, name: str, excluding: int | None) -> bool:
    query = select(NotificationSubscription.id).where(NotificationSubscription.name == name)
    if excluding is not None:
        query = query.where(NotificationSubscription.id != excluding)
    return session.scalar(query) is not None


def create_subscription(
    *, session: Session, spec: SubscriptionSpec, secret: str, created_by: str, now: datetime
) -> SubscriptionRecord:
    count = session.scalar(select(func.count()).select_from(NotificationSubscription)) or 0
    if count >= MAX_SUBSCRIPTIONS:
        raise Conflict(f"at most {MAX_SUBSCRIPTIONS} subscriptions; delete one first")
    if _name_taken(session, spec.name, None):
        raise Conflict(f"a subscription is already named {spec.name!r}")
    row = NotificationSubscription(
        name=spec.name, url=spec.url, service=spec.service, kinds=list(spec.kinds),
        format=spec.format.value, secret=secret, enabled=spec.enabled, created_at=now,
        created_by=created_by, updated_at=now,
    )  # fmt: skip
    session.add(row)
    session.flush()
    return subscription_record(row)


def get_subscription(*, session: Session, subscription_id: int) -> SubscriptionRecord:
    return subscription_record(_get(session, subscription_id))


def subscription_secret(
    *, session: Session, subscription_id: int
) -> tuple[SubscriptionRecord, str]:
    row = _get(session, subscription_id)
    return subscription_record(row), row.secret


def list_subscriptions(
    *, session: Session, limit: int, offset: int
) -> tuple[list[SubscriptionRecord], int]:
    total = session.scalar(select(func.count()).select_from(NotificationSubscription)) or 0
    rows = session.scalars(
        select(NotificationSubscription)
        .order_by(NotificationSubscription.id)
        .limit(limit)
        .offset(offset)
    ).all()
    return [subscription_record(r) for r in rows], total


def update_subscription(
    *,
    session: Session,
    subscription_id: int,
    spec: SubscriptionSpec,
    now: datetime,
    secret: str | None = None,
) -> SubscriptionRecord:
    """Replace the subscription's spec (and its secret, when one is given). Deliveries
    already queued keep going to it as it is now."""
    row = _get(session, subscription_id)
    if _name_taken(session, spec.name, row.id):
        raise Conflict(f"a subscription is already named {spec.name!r}")
    row.name, row.url, row.service = spec.name, spec.url, spec.service
    row.kinds, row.format, row.enabled = list(spec.kinds), spec.format.value, spec.enabled
    if secret is not None:
        row.secret = secret
    row.updated_at = now
    session.flush()
    return subscription_record(row)


def delete_subscription(*, session: Session, subscription_id: int) -> None:
    """Delete it with its deliveries, pending ones included."""
    row = _get(session, subscription_id)
    session.execute(
        delete(NotificationDelivery).where(NotificationDelivery.subscription_id == row.id)
    )
    session.delete(row)
    session.flush()


# --- the delivery listing -----------------------------------------------------------


def _delivery_record(row: NotificationDelivery, name: str) -> DeliveryRecord:
    return DeliveryRecord(
        id=row.id, subscription_id=row.subscription_id, subscription_name=name,
        event_id=row.event_id, experiment_id=row.experiment_id, service=row.service,
        kind=row.kind, status=DeliveryStatus(row.status), attempts=row.attempts,
        created_at=row.created_at, next_attempt_at=row.next_attempt_at,
        last_attempt_at=row.last_attempt_at, delivered_at=row.delivered_at,
        last_status=row.last_status, last_error=row.last_error,
    )  # fmt: skip


def list_deliveries(
    *,
    session: Session,
    experiment_id: int | None = None,
    subscription_id: int | None = None,
    status: DeliveryStatus | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[DeliveryRecord], int]:
    """A page of deliveries, newest first, and the total matching the filters."""
    query = select(NotificationDelivery, NotificationSubscription.name).join(
        NotificationSubscription,
        NotificationSubscription.id == NotificationDelivery.subscription_id,
    )
    if experiment_id is not None:
        query = query.where(NotificationDelivery.experiment_id == experiment_id)
    if subscription_id is not None:
        query = query.where(NotificationDelivery.subscription_id == subscription_id)
    if status is not None:
        query = query.where(NotificationDelivery.status == status.value)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.execute(
        query.order_by(NotificationDelivery.id.desc()).limit(limit).offset(offset)
    ).all()
    return [_delivery_record(row, name) for row, name in rows], total


# --- the dispatcher's side ----------------------------------------------------------


def _announced(event: Event, experiment_name: str | None) -> AnnouncedEvent:
    return AnnouncedEvent(
        event_id=event.id, kind=event.kind, service=event.service,
        experiment_id=event.experiment_id, experiment_name=experiment_name, at=event.at,
        actor=event.actor, from_state=event.from_state, to_state=event.to_state,
        reason=event.reason, payload=dict(event.payload),
    )  # fmt: skip


def claim_due(
    *, session: Session, holder: str, now: datetime, lease_until: datetime, limit: int
) -> list[ClaimedDelivery]:
    """Lease up to `limit` due deliveries to `holder`, oldest first."""
    # the head of each (subscription, stream): its oldest pending row; only heads may go
    heads = (
        select(func.min(NotificationDelivery.id))
        .where(NotificationDelivery.status == DeliveryStatus.PENDING.value)
        .group_by(NotificationDelivery.subscription_id, NotificationDelivery.stream)
    )
    free = or_(
        NotificationDelivery.claimed_until.is_(None), NotificationDelivery.claimed_until <= now
    )
    candidates = session.scalars(
        select(NotificationDelivery.id)
        .where(
            NotificationDelivery.id.in_(heads),
            NotificationDelivery.next_attempt_at <= now,
            free,
        )
        .order_by(NotificationDelivery.id)
        .limit(limit)
    ).all()
    claimed: list[ClaimedDelivery] = []
    for delivery_id in candidates:
        # the same conditions again, atomically: of two dispatchers, one wins the row
        won = session.execute(
            update(NotificationDelivery)
            .where(
                and_(
                    NotificationDelivery.id == delivery_id,
                    NotificationDelivery.status == DeliveryStatus.PENDING.value,
                    free,
                )
            )
            .values(claimed_by=holder, claimed_until=lease_until)
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
        if won != 1:
            continue
        row = session.get(NotificationDelivery, delivery_id)
        assert row is not None
        subscription = session.get(NotificationSubscription, row.subscription_id)
        event = session.get(Event, row.event_id)
        if subscription is None or event is None:
            continue
        name = (
            session.scalar(select(Experiment.name).where(Experiment.id == event.experiment_id))
            if event.experiment_id is not None
            else None
        )
        claimed.append(ClaimedDelivery(
            delivery_id=row.id, attempts=row.attempts, created_at=row.created_at,
            url=subscription.url, secret=subscription.secret,
            format=Format(subscription.format), event=_announced(event, name),
        ))  # fmt: skip
    session.flush()
    return claimed


def record_attempt(
    *,
    session: Session,
    delivery_id: int,
    holder: str,
    at: datetime,
    status: DeliveryStatus,
    http_status: int | None,
    error: str | None,
    next_attempt_at: datetime | None,
) -> bool:
    """Write one attempt's outcome and give the lease back; False when `holder` no
    longer holds the row (its lease ran out and another dispatcher took it)."""
    changed = session.execute(
        update(NotificationDelivery)
        .where(
            NotificationDelivery.id == delivery_id,
            NotificationDelivery.claimed_by == holder,
            NotificationDelivery.status == DeliveryStatus.PENDING.value,
        )
        .values(
            status=status.value,
            attempts=NotificationDelivery.attempts + 1,
            last_attempt_at=at,
            delivered_at=at if status is DeliveryStatus.DELIVERED else None,
            next_attempt_at=next_attempt_at if status is DeliveryStatus.PENDING else None,
            last_status=http_status,
            last_error=error[:ERROR_MAX] if error else None,
            claimed_by=None,
            claimed_until=None,
        )
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    return bool(changed == 1)


def release_claims(*, session: Session, holder: str) -> int:
    """Give back every lease `holder` still has (a dispatcher that stops)."""
    released = session.execute(
        update(NotificationDelivery)
        .where(NotificationDelivery.claimed_by == holder)
        .values(claimed_by=None, claimed_until=None)
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    return int(released)


def pending_count(*, session: Session) -> int:
    return (
        session.scalar(
            select(func.count())
            .select_from(NotificationDelivery)
            .where(NotificationDelivery.status == DeliveryStatus.PENDING.value)
        )
        or 0
    )
