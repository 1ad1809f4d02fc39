"""Breaker rules hot-reloaded from etcd (`<prefix>/rules/<service>`).

A rule is in force from the next evaluation after its write. A malformed value never
replaces a valid one: it is counted and logged, and stays listed in `rejections()`
(the leading controller records each as an event, once) while it is the stored
value; the last valid rule stays in force.

A stored value is identified by its key's mod revision and its content hash, so
reading it again after a watch reconnect is not another rejection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.kernel.errors import BackendError, ValidationFailed
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import EventKind, KeyValueStore, RevisionCompacted
from controlplane.kernel.rules import BreakerRule, parse_rule

log = logging.getLogger(__name__)

RETRY_SEC = 1.0


@dataclass(frozen=True)
class RuleRejection:
    service: str
    # the key's mod revision: which write stored the value
    revision: int
    # sha256 of the stored bytes: the revision alone is no identity across stores
    # whose revisions start again (the in-memory store of `canary dev` after a restart)
    value_sha256: str
    error: str

    def same_value(self, other: RuleRejection) -> bool:
        return (self.service, self.revision, self.value_sha256) == (
            other.service, other.revision, other.value_sha256
        )

    def event_payload(self) -> dict[str, Any]:
        return {"etcd_revision": self.revision, "value_sha256": self.value_sha256,
                "error": self.error}

    def recorded_in(self, payload: Mapping[str, Any]) -> bool:
        """Whether an event payload (see `event_payload`) names this very stored value."""
        return (
            payload.get("etcd_revision") == self.revision
            and payload.get("value_sha256") == self.value_sha256
        )


@dataclass(frozen=True)
class RuleInForce:
    rule: BreakerRule
    revision: int


class RuleBook:
    def __init__(self, kv: KeyValueStore, keys: EtcdKeys) -> None:
        self._kv = kv
        self._keys = keys
        self._rules: dict[str, RuleInForce] = {}
        # per service, the stored value rejected (while it is the stored one)
        self._rejected: dict[str, RuleRejection] = {}
        self._task: asyncio.Task[None] | None = None
        self.rejected = 0
        self.loaded = asyncio.Event()

    def get(self, service: str) -> RuleInForce | None:
        return self._rules.get(service)

    def services(self) -> list[str]:
        return sorted(self._rules)

    def rejections(self) -> list[RuleRejection]:
        """The invalid values stored now, one per service at most."""
        return [self._rejected[service] for service in sorted(self._rejected)]

    async def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="rulebook")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _apply(self, service: str, raw: bytes | None, revision: int) -> None:
        if raw is None:
            self._rules.pop(service, None)
            self._rejected.pop(service, None)
            return
        try:
            rule = parse_rule(raw)
            if rule.service != service:
                raise ValidationFailed(
                    f"rule for {rule.service!r} stored under the key of {service!r}"
                )
        except ValidationFailed as exc:
            rejection = RuleRejection(
                service, revision, hashlib.sha256(raw).hexdigest(), str(exc)
            )
            known = self._rejected.get(service)
            if known is not None and known.same_value(rejection):
                return  # read again after a reconnect: counted and logged already
            self._rejected[service] = rejection
            self.rejected += 1
            log.warning("rejected rule for %s at revision %d: %s", service, revision, exc)
            return
        self._rejected.pop(service, None)
        self._rules[service] = RuleInForce(rule, revision)

    async def _follow(self) -> None:
        prefix = self._keys.rules_prefix
        while True:
            try:
                items, revision = await self._kv.get_prefix(prefix)
                seen = set()
                for item in items:
                    service = item.key[len(prefix):]
                    seen.add(service)
                    self._apply(service, item.value, item.mod_revision)
                for gone in set(self._rules) - seen:
                    self._rules.pop(gone, None)
                for gone in set(self._rejected) - seen:
                    self._rejected.pop(gone, None)
                self.loaded.set()
                async for event in self._kv.watch_prefix(prefix, start_revision=revision):
                    service = event.key[len(prefix):]
                    value = event.value if event.kind is EventKind.PUT else None
                    self._apply(service, value, event.mod_revision)
                return  # a watch ends without an error only when its store is closed
            except (BackendError, RevisionCompacted) as exc:
                # fail-static: the rules in force stay while etcd is away
                log.warning("rule watch interrupted (%s); retrying", exc)
                await asyncio.sleep(RETRY_SEC)
