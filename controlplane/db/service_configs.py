"""Data access for each service's desired breaker rule and overload protection
(models.DesiredConfig, kernel.service_configs), and the record of their one import
from etcd (models.EtcdImport).

Synchronous functions given the session of the caller's transaction; they never
commit. A saved or removed config queues a NOTIFY on PostgreSQL, as a saved route
does (db.routes), so the leader's reconciler on another replica wakes at once: on the
routes' channel, with CONFIGS_NOTICE for payload, which no service can be named.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session

from controlplane.db.models import DesiredConfig, EtcdImport
from controlplane.db.routes import ROUTES_CHANNEL
from controlplane.kernel.errors import CodecError, Conflict, RevisionConflict, ValidationFailed
from controlplane.kernel.service_configs import (
    ConfigKind,
    ServiceConfig,
    config_document,
    parse_config,
)

CONFIGS_NOTICE = "@configs"


def _notify(session: Session) -> None:
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": ROUTES_CHANNEL, "payload": CONFIGS_NOTICE},
        )


def _config_of(row: DesiredConfig) -> ServiceConfig:
    # written by this code only; unreadable means a hand edit or a bug: never publish it
    return config_of_document(ConfigKind(row.kind), row.service, row.document)


def desired_config_documents(*, session: Session, kind: ConfigKind) -> dict[str, Any]:
    """The desired configs of `kind` by service, unparsed, for the reconciler to parse
    once per document text (`config_of_document`)."""
    query = select(DesiredConfig.service, DesiredConfig.document).where(
        DesiredConfig.kind == kind.value
    )
    return {service: document for service, document in session.execute(query)}


def config_of_document(kind: ConfigKind, service: str, document: Any) -> ServiceConfig:
    """A desired config from its row's document (pure); CodecError when it does not read."""
    try:
        return parse_config(kind, service, document)
    except ValidationFailed as exc:
        raise CodecError(
            f"the desired {kind.described} of {service!r} is unreadable: {exc}"
        ) from exc


def desired_config(*, session: Session, kind: ConfigKind, service: str) -> ServiceConfig | None:
    row = session.get(DesiredConfig, (kind.value, service))
    return _config_of(row) if row is not None else None


def _check_expected(
    row: DesiredConfig | None, kind: ConfigKind, service: str, expected: ServiceConfig | None
) -> None:
    """RevisionConflict unless the row still holds `expected` (None: no row, or an
    unreadable one), what the caller read and logs as the previous config. The row is
    read again here (the caller's read is gone from the session), and its version
    then guards the write."""
    try:
        current = _config_of(row) if row is not None else None
    except CodecError:
        current = None
    if current != expected:
        raise RevisionConflict(
            f"the {kind.described} of {service!r} changed since it was read; read it again"
        )


def save_config(
    *, session: Session, kind: ConfigKind, service: str, config: ServiceConfig, now: datetime,
    expected: ServiceConfig | None,
) -> None:
    """Store `config` as the service's desired one in place of `expected`; a change of
    the row since (here, or concurrent at flush: the version moved) raises
    RevisionConflict."""
    document = config_document(kind, service, config)
    row = session.get(DesiredConfig, (kind.value, service))
    _check_expected(row, kind, service, expected)
    if row is None:
        session.add(DesiredConfig(kind=kind.value, service=service, document=document,
                                  updated_at=now))
    else:
        row.document = document
        row.updated_at = now
    session.flush()
    _notify(session)


def remove_config(
    *, session: Session, kind: ConfigKind, service: str, expected: ServiceConfig | None
) -> None:
    """Remove the service's desired config, which holds `expected`; Conflict when
    another request removed or changed it since it was read."""
    _check_expected(session.get(DesiredConfig, (kind.value, service)), kind, service, expected)
    removed = session.execute(
        delete(DesiredConfig).where(
            DesiredConfig.kind == kind.value, DesiredConfig.service == service
        )
    )
    if getattr(removed, "rowcount", 1) != 1:
        raise Conflict(f"the {kind.described} of {service!r} was removed meanwhile")
    _notify(session)


# ---------------------------------------------------------------- the one import


def imported(*, session: Session, kind: ConfigKind) -> bool:
    """Whether the configs of `kind` etcd held before SQL kept them were imported."""
    return session.get(EtcdImport, kind.value) is not None


def import_configs(
    *,
    session: Session,
    kind: ConfigKind,
    found: Mapping[str, ServiceConfig],
    skipped: int,
    now: datetime,
) -> dict[str, Any] | None:
    """Adopt the configs found in etcd that have no row yet, and record that the import
    is done; None (and nothing written) when it was done before. Returns what was
    adopted, for the audit event."""
    if imported(session=session, kind=kind):
        return None
    adopted: list[str] = []
    for service, config in sorted(found.items()):
        if session.get(DesiredConfig, (kind.value, service)) is None:
            session.add(DesiredConfig(kind=kind.value, service=service,
                                      document=config_document(kind, service, config),
                                      updated_at=now))
            adopted.append(service)
    session.add(EtcdImport(kind=kind.value, at=now, imported=len(adopted), skipped=skipped))
    session.flush()
    return {"kind": kind.value, "services": adopted, "skipped": skipped}
