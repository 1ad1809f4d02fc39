"""Whether etcd holds a service's committed config yet: what the API reports beside a
breaker rule or an overload protection (`applied`), as `route_applied` beside an
experiment. The leader's reconciler publishes each commit; until it has, the answer
says so rather than passing the commit off as the state in force.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, Field

from controlplane.kernel.errors import CanaryError, NotFound, ValidationFailed
from controlplane.kernel.overload import ServiceOverload
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.service_configs import ConfigKind, ServiceConfig, parse_config
from controlplane.runtime import Backends

READ_TIMEOUT_SEC = 1.0
# what a GET adds to a config; a PUT of what a GET answered ignores them
READ_ONLY_FIELDS = ("applied", "applied_note")


class InForce(BaseModel):
    applied: bool | None = Field(
        default=None,
        description="whether etcd holds this config yet, so sidecars and controllers "
        "apply it (false: committed, the leader publishes it within one pass; null: "
        "could not be told)",
    )
    applied_note: str | None = Field(default=None, description="why `applied` is what it is")


class RuleInForce(BreakerRule, InForce):
    """A breaker rule as the API answers it."""


class OverloadInForce(ServiceOverload, InForce):
    """An overload protection as the API answers it."""


def without_read_only(body: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in body.items() if name not in READ_ONLY_FIELDS}


async def applied(
    backends: Backends, kind: ConfigKind, service: str, desired: ServiceConfig | None
) -> tuple[bool | None, str | None]:
    """(applied, note): whether etcd holds `desired` (None: holds nothing) yet."""
    try:
        async with asyncio.timeout(READ_TIMEOUT_SEC):
            stored = await backends.kv.get(kind.key(backends.keys, service))
    except (CanaryError, TimeoutError) as exc:
        return None, f"the {kind.described} in etcd could not be read: {exc or 'timed out'}"
    if stored is None:
        if desired is None:
            return True, None
        return False, "not published yet: the leader publishes it within one pass"
    if desired is None:
        return False, "etcd still holds one: the leader removes it within one pass"
    try:
        held = parse_config(kind, service, stored.value)
    except ValidationFailed:
        return False, "etcd holds an unreadable value: the leader replaces it within one pass"
    if held != desired:
        return False, "etcd holds another one: the leader publishes this one within one pass"
    return True, None


async def not_found(backends: Backends, kind: ConfigKind, exc: NotFound, service: str) -> NotFound:
    """The 404 of a service with no desired config, saying so when etcd still holds one
    in force (removed, not yet removed from etcd; or written by hand)."""
    is_applied, note = await applied(backends, kind, service, None)
    return NotFound(f"{exc}; {note}") if is_applied is False and note else exc
