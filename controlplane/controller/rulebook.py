"""Breaker rules hot-reloaded from etcd (`<prefix>/rules/<service>`).

A rule is in force from the next evaluation after its write. A malformed value never
replaces a valid one: it is counted and logged, and stays listed in `rejections()`
(the leading controller records each as an event, once) while it is the stored
value; the last valid rule stays in force.

A stored value is identified by its key's mod revision and its content hash, so
reading it again after a watch reconnect is not another rejection. The keys are kept
in step by the shared list-then-watch loop (controlplane/kernel/informer.py): a rule
deleted while etcd was away is dropped when the prefix is read again.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.informer import PrefixInformer
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.rules import BreakerRule, parse_rule

log = logging.getLogger(__name__)


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
        self._prefix = keys.rules_prefix
        self._rules: dict[str, RuleInForce] = {}
        # per service, the stored value rejected (while it is the stored one)
        self._rejected: dict[str, RuleRejection] = {}
        self.rejected = 0
        self.informer = PrefixInformer(kv, self._prefix, self, name="rulebook")
        self.loaded = self.informer.synced

    def get(self, service: str) -> RuleInForce | None:
        return self._rules.get(service)

    def services(self) -> list[str]:
        return sorted(self._rules)

    def rejections(self) -> list[RuleRejection]:
        """The invalid values stored now, one per service at most."""
        return [self._rejected[service] for service in sorted(self._rejected)]

    async def start(self) -> None:
        self.informer.start()

    async def stop(self) -> None:
        await self.informer.stop()

    # --- what the informer delivers (PrefixHandler) -----------------------------

    def on_put(self, key: str, value: bytes, mod_revision: int) -> None:
        self._apply(key[len(self._prefix):], value, mod_revision)

    def on_delete(self, key: str) -> None:
        self._apply(key[len(self._prefix):], None, 0)

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
