"""Data access for each service's stable version and release history
(models.StableVersion, models.Release; experiments.releases decides what they say).

Synchronous functions given the session of the caller's transaction; they never commit.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.db.models import Release, StableVersion
from controlplane.experiments.releases import (
    ReleaseChange,
    ReleaseKind,
    ReleaseRecord,
    StableRecord,
    Version,
)


def _stable_record(row: StableVersion) -> StableRecord:
    return StableRecord(
        service=row.service,
        current=Version(row.upstream, row.label),
        experiment_id=row.experiment_id,
        since=row.since,
        version=row.version,
    )


def _release_record(row: Release) -> ReleaseRecord:
    before = (
        Version(row.from_upstream, row.from_label) if row.from_upstream is not None else None
    )
    return ReleaseRecord(
        id=row.id,
        service=row.service,
        at=row.at,
        kind=ReleaseKind(row.kind),
        experiment_id=row.experiment_id,
        before=before,
        after=Version(row.to_upstream, row.to_label),
        actor=row.actor,
        reason=row.reason,
    )


def stable_version(*, session: Session, service: str) -> StableRecord | None:
    row = session.get(StableVersion, service)
    return _stable_record(row) if row is not None else None


def record_release(
    *, session: Session, service: str, experiment_id: int, change: ReleaseChange,
    actor: str, at: datetime,
) -> ReleaseRecord:
    """Append `change` to the service's history and, when it moves the stable version,
    make its `after` the stable version (its row version checked by the flush)."""
    if change.moves_stable:
        row = session.get(StableVersion, service)
        if row is None:
            row = StableVersion(service=service)
            session.add(row)
        row.upstream = change.after.upstream
        row.label = change.after.label
        row.experiment_id = experiment_id
        row.since = at
    release = Release(
        service=service,
        at=at,
        kind=change.kind.value,
        experiment_id=experiment_id,
        from_upstream=change.before.upstream if change.before else None,
        from_label=change.before.label if change.before else None,
        to_upstream=change.after.upstream,
        to_label=change.after.label,
        actor=actor,
        reason=change.reason,
    )
    session.add(release)
    session.flush()
    return _release_record(release)


def list_releases(
    *, session: Session, service: str, limit: int, offset: int = 0
) -> tuple[list[ReleaseRecord], int]:
    """A page of the service's release history, newest first, and its length."""
    query = select(Release).where(Release.service == service)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Release.id.desc()).limit(limit).offset(offset))
    return [_release_record(row) for row in rows], total
