"""A service's breaker rule and overload protection, the API's side: read the desired
config, replace or remove it with its audit event in one commit.

SQL holds what each should be (db.service_configs); nothing here writes etcd. The
leader's reconciler publishes each committed change (controller.reconciler), woken by
`changes` after the commit; until then the API says the change is not in force yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controlplane.experiments.decision_log import log_event
from controlplane.experiments.events import EventKind
from controlplane.experiments.store import EventRecord, ExperimentStore
from controlplane.kernel.clock import Clock, utc_now
from controlplane.kernel.errors import BackendError, CodecError, FieldError, NotFound
from controlplane.kernel.service_configs import ConfigKind, ServiceConfig, config_document
from controlplane.routing.changes import RouteChanges

# the audit trail's kind of a change, and the payload field that carries the config
CHANGED: dict[ConfigKind, tuple[EventKind, str]] = {
    ConfigKind.RULE: (EventKind.RULE_CHANGED, "rule"),
    ConfigKind.OVERLOAD: (EventKind.OVERLOAD_CHANGED, "overload"),
}


class StoredValueInvalid(BackendError):
    """A stored value does not parse: reported with its field paths, never fatal."""

    def __init__(self, key: str, message: str, errors: Sequence[FieldError] = ()) -> None:
        self.key = key
        self.errors = tuple(errors)
        super().__init__(f"stored value at {key} is invalid: {message}")


async def read_config(
    *, store: ExperimentStore, kind: ConfigKind, service: str
) -> ServiceConfig:
    """The service's desired config; NotFound without one."""
    try:
        async with store.transaction() as tx:
            config = await tx.load_service_config(kind=kind, service=service)
    except CodecError as exc:
        raise StoredValueInvalid(f"service_configs ({kind.value}, {service})", str(exc)) from exc
    if config is None:
        raise NotFound(f"no {kind.described} for service {service!r}")
    return config


async def write_config(
    *,
    store: ExperimentStore,
    changes: RouteChanges,
    clock: Clock,
    kind: ConfigKind,
    service: str,
    config: ServiceConfig,
    actor: str,
) -> None:
    """Commit `config` as the service's desired one with its change event; nothing
    when it is the desired one already."""
    event_kind, field = CHANGED[kind]
    now = utc_now(clock)
    async with store.transaction() as tx:
        try:
            previous = await tx.load_service_config(kind=kind, service=service)
        except CodecError:
            previous = None  # an unreadable row is replaced like any other
        if previous == config:
            return  # writes only on change
        await tx.save_service_config(kind=kind, service=service, config=config, now=now,
                                     expected=previous)
        event = await tx.append_event(
            service=service, at=now, actor=actor, kind=event_kind,
            reason=f"{kind.described} {'replaced' if previous else 'created'} by {actor}",
            payload={field: config_document(kind, service, config),
                     "previous": _document(kind, service, previous)},
        )
    changes.notify_configs()
    logged(event)


async def remove_config(
    *,
    store: ExperimentStore,
    changes: RouteChanges,
    clock: Clock,
    kind: ConfigKind,
    service: str,
    actor: str,
) -> None:
    """Remove the service's desired config with its change event; NotFound without one."""
    event_kind, field = CHANGED[kind]
    now = utc_now(clock)
    async with store.transaction() as tx:
        try:
            previous = await tx.load_service_config(kind=kind, service=service)
            found = previous is not None
        except CodecError:
            previous, found = None, True
        if not found:
            raise NotFound(f"no {kind.described} for service {service!r}")
        await tx.remove_service_config(kind=kind, service=service, expected=previous)
        event = await tx.append_event(
            service=service, at=now, actor=actor, kind=event_kind,
            reason=f"{kind.described} removed by {actor}",
            payload={field: None, "previous": _document(kind, service, previous)},
        )
    changes.notify_configs()
    logged(event)


def logged(event: EventRecord) -> None:
    """A committed change of a service's settings, on the decision log."""
    log_event(
        kind=event.kind, experiment_id=None, service=event.service, actor=event.actor,
        from_state=None, to_state=None, reason=event.reason, payload=event.payload,
    )  # fmt: skip


def _document(kind: ConfigKind, service: str, config: ServiceConfig | None) -> Any:
    return config_document(kind, service, config) if config is not None else None
