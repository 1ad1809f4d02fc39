"""A service's breaker rule: etcd holds it (the source of truth), SQL logs each change.

The controller watches the rules prefix itself; this module is the API's side:
read one rule, and replace one rule with its audit event in a single step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from controlplane.experiments.events import EventKind
from controlplane.experiments.store import ExperimentStore
from controlplane.kernel.clock import Clock, utc_now
from controlplane.kernel.errors import BackendError, FieldError, NotFound, ValidationFailed
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.rules import BreakerRule, parse_rule


class StoredValueInvalid(BackendError):
    """A value in the store does not parse: reported with its field paths, never fatal."""

    def __init__(self, key: str, message: str, errors: Sequence[FieldError] = ()) -> None:
        self.key = key
        self.errors = tuple(errors)
        super().__init__(f"stored value at {key} is invalid: {message}")


async def read_rule(*, kv: KeyValueStore, keys: EtcdKeys, service: str) -> BreakerRule:
    key = keys.rule(service)
    stored = await kv.get(key)
    if stored is None:
        raise NotFound(f"no breaker rule for service {service!r}")
    try:
        rule = parse_rule(stored.value)
    except ValidationFailed as exc:
        raise StoredValueInvalid(key, exc.message, exc.errors) from exc
    if rule.service != service:
        raise StoredValueInvalid(
            key, f"names service {rule.service!r}", [FieldError(("service",), "wrong service")]
        )
    return rule


def previous_value(raw: bytes | None) -> Any:
    """The replaced value for the audit trail, kept even when it was malformed."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode("utf-8", "replace")


async def write_rule(
    *,
    store: ExperimentStore,
    kv: KeyValueStore,
    keys: EtcdKeys,
    clock: Clock,
    rule: BreakerRule,
    actor: str,
) -> BreakerRule:
    """Store the rule in etcd and its change event in SQL; neither without the other."""
    key = keys.rule(rule.service)
    now = utc_now(clock)
    previous = await kv.get(key)
    new_value = json.loads(rule.to_json())
    old_value = previous_value(previous.value if previous else None)
    if old_value == new_value:
        return rule  # writes only on change
    async with store.transaction() as tx:
        await tx.append_event(
            service=rule.service,
            at=now,
            actor=actor,
            kind=EventKind.RULE_CHANGED,
            reason=f"breaker rule {'replaced' if previous else 'created'} by {actor}",
            payload={"rule": new_value, "previous": old_value},
        )
        # Compare-and-swap, so two concurrent writers cannot both log a change
        # against the same previous rule.
        await kv.compare_and_swap(
            key,
            rule.to_json().encode(),
            expected_mod_revision=previous.mod_revision if previous else 0,
        )
    return rule
