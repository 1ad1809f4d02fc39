"""Breaker rules hot-reloaded from etcd (`<prefix>/rules/<service>`).

A rule is in force from the next evaluation after its write. A malformed value never
replaces a valid one: it is counted, logged and handed to `on_rejected` (the
controller records it as an event), and the last valid rule stays in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from controlplane.kernel.errors import BackendError, ValidationFailed
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import EventKind, KeyValueStore, RevisionCompacted
from controlplane.kernel.rules import BreakerRule, parse_rule

log = logging.getLogger(__name__)

RETRY_SEC = 1.0


@dataclass(frozen=True)
class RuleRejection:
    service: str
    revision: int
    error: str


@dataclass(frozen=True)
class RuleInForce:
    rule: BreakerRule
    revision: int


Rejected = Callable[[RuleRejection], Awaitable[None]]


class RuleBook:
    def __init__(
        self, kv: KeyValueStore, keys: EtcdKeys, *, on_rejected: Rejected | None = None
    ) -> None:
        self._kv = kv
        self._keys = keys
        self._rules: dict[str, RuleInForce] = {}
        self._on_rejected = on_rejected
        self._task: asyncio.Task[None] | None = None
        self.rejected = 0
        self.loaded = asyncio.Event()

    def get(self, service: str) -> RuleInForce | None:
        return self._rules.get(service)

    def services(self) -> list[str]:
        return sorted(self._rules)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="rulebook")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _apply(self, service: str, raw: bytes | None, revision: int) -> None:
        if raw is None:
            self._rules.pop(service, None)
            return
        try:
            rule = parse_rule(raw)
            if rule.service != service:
                raise ValidationFailed(
                    f"rule for {rule.service!r} stored under the key of {service!r}"
                )
        except ValidationFailed as exc:
            self.rejected += 1
            log.warning("rejected rule for %s at revision %d: %s", service, revision, exc)
            if self._on_rejected is not None:
                await self._on_rejected(RuleRejection(service, revision, str(exc)))
            return
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
                    await self._apply(service, item.value, item.mod_revision)
                for gone in set(self._rules) - seen:
                    self._rules.pop(gone, None)
                self.loaded.set()
                async for event in self._kv.watch_prefix(prefix, start_revision=revision):
                    service = event.key[len(prefix):]
                    value = event.value if event.kind is EventKind.PUT else None
                    await self._apply(service, value, event.mod_revision)
                return  # a watch ends without an error only when its store is closed
            except (BackendError, RevisionCompacted) as exc:
                # fail-static: the rules in force stay while etcd is away
                log.warning("rule watch interrupted (%s); retrying", exc)
                await asyncio.sleep(RETRY_SEC)
