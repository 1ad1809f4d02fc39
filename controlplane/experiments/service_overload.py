"""A service's overload protection: etcd holds it (the source of truth), SQL logs each
change, exactly as for its breaker rule (`service_rules`).

Every sidecar of the service watches `<prefix>/overload/<service>` and keeps the last
valid value; this module is the API's side: read, replace and remove one config, each
change with its audit event in a single step.
"""

from __future__ import annotations

import json

from controlplane.experiments.events import EventKind
from controlplane.experiments.service_rules import StoredValueInvalid, previous_value
from controlplane.experiments.store import ExperimentStore
from controlplane.kernel.clock import Clock, utc_now
from controlplane.kernel.errors import Conflict, NotFound, ValidationFailed
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.overload import ServiceOverload, parse_overload

EVENT_KIND = EventKind.OVERLOAD_CHANGED


async def read_overload(*, kv: KeyValueStore, keys: EtcdKeys, service: str) -> ServiceOverload:
    key = keys.overload(service)
    stored = await kv.get(key)
    if stored is None:
        raise NotFound(f"no overload protection for service {service!r}")
    try:
        config = parse_overload(stored.value)
    except ValidationFailed as exc:
        raise StoredValueInvalid(key, exc.message, exc.errors) from exc
    return ServiceOverload.model_validate({**config.model_dump(), "service": service})


async def write_overload(
    *,
    store: ExperimentStore,
    kv: KeyValueStore,
    keys: EtcdKeys,
    clock: Clock,
    overload: ServiceOverload,
    actor: str,
) -> ServiceOverload:
    """Store the config in etcd and its change event in SQL; neither without the other."""
    key = keys.overload(overload.service)
    value = overload.to_stored()
    previous = await kv.get(key)
    new_value = json.loads(value)  # as stored: fields at their defaults may be left out
    old_value = previous_value(previous.value if previous else None)
    if old_value == new_value:
        return overload  # writes only on change
    async with store.transaction() as tx:
        await tx.append_event(
            service=overload.service,
            at=utc_now(clock),
            actor=actor,
            kind=EVENT_KIND,
            reason=f"overload protection {'replaced' if previous else 'created'} by {actor}",
            payload={"overload": new_value, "previous": old_value},
        )
        # compare-and-swap: two concurrent writers cannot both log a change against the
        # same previous value (the loser's event rolls back with its RevisionConflict)
        await kv.compare_and_swap(
            key, value, expected_mod_revision=previous.mod_revision if previous else 0
        )
    return overload


async def delete_overload(
    *,
    store: ExperimentStore,
    kv: KeyValueStore,
    keys: EtcdKeys,
    clock: Clock,
    service: str,
    actor: str,
) -> None:
    """Remove the config (protection off on every sidecar of the service), logged."""
    key = keys.overload(service)
    previous = await kv.get(key)
    if previous is None:
        raise NotFound(f"no overload protection for service {service!r}")
    async with store.transaction() as tx:
        await tx.append_event(
            service=service,
            at=utc_now(clock),
            actor=actor,
            kind=EVENT_KIND,
            reason=f"overload protection removed by {actor}",
            payload={"overload": None, "previous": previous_value(previous.value)},
        )
        if not await kv.delete(key):
            raise Conflict(f"the overload protection of {service!r} was removed meanwhile")
