"""The leader makes every breaker rule and overload protection in etcd equal to its
service's desired config in SQL (db.service_configs), as it does routes.

    (once) import what etcd held before SQL kept it
    read stored (etcd) → read desired (SQL) → plan_values (pure) → write, fenced → record

Every write is fenced by the leadership and a compare-and-swap on the mod revision
read. A difference this leader cannot explain by a commit (etcd moved since it last
wrote or read the key, or it has not read it yet this term) is a repair: a
`rule_reconciled` or `overload_reconciled` event names what was found.

The import: a release before this one kept these configs in etcd alone. The first
leader of this release adopts every valid config etcd holds for a service SQL has
none for, records that it did (`etcd_imports`, one `config_imported` event per
service), and never imports again; a malformed value is counted, logged and left to
the pass, which removes it. Until the import is recorded no key is removed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from controlplane.controller.metrics import ControllerStats
from controlplane.controller.parsed_by_text import ParsedByText
from controlplane.controller.value_plan import StoredValue, ValueChange, ValueFound, plan_values
from controlplane.db import experiments as records
from controlplane.db import service_configs as desired_configs
from controlplane.experiments.events import EventKind
from controlplane.kernel.clock import utc_now
from controlplane.kernel.errors import CodecError, RevisionConflict, ValidationFailed
from controlplane.kernel.keys import is_service_name
from controlplane.kernel.kv import Fence, KeyValueStore
from controlplane.kernel.service_configs import (
    ConfigKind,
    ServiceConfig,
    config_bytes,
    config_document,
    parse_config,
)
from controlplane.runtime import Backends

log = logging.getLogger(__name__)

T = TypeVar("T")

RECONCILED: dict[ConfigKind, EventKind] = {
    ConfigKind.RULE: EventKind.RULE_RECONCILED,
    ConfigKind.OVERLOAD: EventKind.OVERLOAD_RECONCILED,
}
CONFIG_IMPORTED = EventKind.CONFIG_IMPORTED


async def read_values(
    kv: KeyValueStore, prefix: str, name_ok: Callable[[str], bool],
    parse: Callable[[str, bytes], T],
) -> dict[str, StoredValue[T]]:
    """The values under `prefix` by name (the key's last segment), unreadable as None;
    keys whose name is no name of this kind are left out (and alone)."""
    values, _ = await kv.get_prefix(prefix)
    found: dict[str, StoredValue[T]] = {}
    for value in values:
        name = value.key[len(prefix):]
        if not name_ok(name):
            continue
        try:
            found[name] = StoredValue(parse(name, value.value), value.mod_revision)
        except ValidationFailed:
            found[name] = StoredValue(None, value.mod_revision)
    return found


async def apply_change(
    kv: KeyValueStore, key: str, change: ValueChange[T], to_bytes: Callable[[T], bytes],
    fence: Fence | None,
) -> int:
    """Write or delete as `change` says; the key's mod revision after it (0: deleted).
    A delete takes whatever the key holds: nothing should be there."""
    if change.write is None:
        await kv.delete(key, fence=fence)
        return 0
    return await kv.compare_and_swap(
        key, to_bytes(change.write), expected_mod_revision=change.expected_mod_revision, fence=fence
    )


@dataclass
class ConfigReconciler:
    stats: ControllerStats = field(default_factory=ControllerStats)
    # by key: the mod revision this leader last wrote or found in sync (0: absent)
    _seen: dict[str, int] = field(default_factory=dict)
    # the kinds whose whole prefix this leader has read this term
    _listed: set[ConfigKind] = field(default_factory=set)
    _imported: set[ConfigKind] = field(default_factory=set)
    # per kind, what etcd and SQL hold, parsed once per text (parsed_by_text.py)
    _stored: dict[ConfigKind, ParsedByText[str, bytes, ServiceConfig]] = field(
        default_factory=dict
    )
    _desired: dict[ConfigKind, ParsedByText[str, Any, ServiceConfig]] = field(
        default_factory=dict
    )

    def new_term(self) -> None:
        """A new term trusts nothing it remembers."""
        self._seen.clear()
        self._listed.clear()
        self._imported.clear()

    async def reconcile(
        self, backends: Backends, fence: Fence | None,
        before_each: Callable[[], Awaitable[bool]] | None = None,
    ) -> bool:  # fmt: skip
        """One pass over every config of every kind; True after a lost race.
        `before_each` runs before each kind (what the caller must not keep waiting)."""
        again = False
        for kind in ConfigKind:
            if before_each is not None:
                again = await before_each() or again
            again = await self._reconcile_kind(backends, fence, kind) or again
        return again

    async def _reconcile_kind(
        self, backends: Backends, fence: Fence | None, kind: ConfigKind
    ) -> bool:
        prefix = kind.prefix(backends.keys)
        parsed = self._stored.setdefault(kind, ParsedByText(partial(parse_config, kind)))
        stored = await read_values(backends.kv, prefix, is_service_name, parsed.get)
        parsed.keep(stored)
        if kind not in self._imported:
            await self._import(backends, fence, kind, stored)
            self._imported.add(kind)
        desired, unreadable = self._desired_of(
            kind,
            await backends.database.read(desired_configs.desired_config_documents, kind=kind),
        )
        for service in sorted(unreadable):
            log.warning("the desired %s of %r is unreadable: its key in etcd is left alone",
                        kind.described, service)
            stored.pop(service, None)
        listed = kind in self._listed
        again = False
        for change in plan_values(desired, stored):
            key = kind.key(backends.keys, change.name)
            held = stored.get(change.name)
            try:
                revision = await apply_change(
                    backends.kv, key, change, partial(config_bytes, kind, change.name), fence
                )
            except RevisionConflict as exc:
                self.stats.conflicts += 1
                self._seen.pop(key, None)
                log.info("%s of %r changed under the reconciler: %s",
                         kind.described, change.name, exc)
                again = True
                continue
            if change.write is None:
                self.stats.configs_deleted += 1
            else:
                self.stats.configs_published += 1
            held_revision = held.mod_revision if held is not None else 0
            if not listed or self._seen.get(key, 0) != held_revision:
                await self._record_repair(backends, fence, kind, change, held)
            self._seen[key] = revision
        for service, value in stored.items():
            if value.value is not None and desired.get(service) == value.value:
                self._seen[kind.key(backends.keys, service)] = value.mod_revision
        self._listed.add(kind)
        return again

    def _desired_of(
        self, kind: ConfigKind, documents: Mapping[str, Any]
    ) -> tuple[dict[str, ServiceConfig], frozenset[str]]:
        """The desired configs by service, and the services whose row does not read
        (their key in etcd is left alone), each document parsed once per text."""
        parsed = self._desired.setdefault(
            kind, ParsedByText(partial(desired_configs.config_of_document, kind))
        )
        parsed.keep(documents)
        found: dict[str, ServiceConfig] = {}
        unreadable: set[str] = set()
        for service, document in documents.items():
            try:
                found[service] = parsed.get(service, document)
            except CodecError:
                unreadable.add(service)
        return found, frozenset(unreadable)

    async def _record_repair(
        self, backends: Backends, fence: Fence | None, kind: ConfigKind,
        change: ValueChange[ServiceConfig], held: StoredValue[ServiceConfig] | None,
    ) -> None:
        self.stats.configs_reconciled += 1
        what = {
            ValueFound.MISSING: "no value",
            ValueFound.FOREIGN: "another value than the desired one",
            ValueFound.UNREADABLE: "a value that is none",
            ValueFound.UNOWNED: "a value the database has none for",
        }[change.found]
        done = "removed it" if change.write is None else "published the desired one"
        reason = f"etcd held {what} as {kind.described}: {done}"
        log.warning("service %r: %s", change.name, reason)
        payload: dict[str, Any] = {
            "found": change.found.value,
            "stored": _document(kind, change.name, held),
            "published": (
                None if change.write is None else config_document(kind, change.name, change.write)
            ),
        }
        if fence is not None:
            payload["leader_fence"] = {"key": fence.key, "revision": fence.create_revision}
        now = utc_now(backends.clock)
        async with backends.database.transaction() as tx:
            await tx.run(records.record_event, service=change.name, at=now, actor="controller",
                         kind=RECONCILED[kind], reason=reason, payload=payload)

    async def _import(
        self, backends: Backends, fence: Fence | None, kind: ConfigKind,
        stored: dict[str, StoredValue[ServiceConfig]],
    ) -> None:
        if await backends.database.read(desired_configs.imported, kind=kind):
            return
        found: dict[str, ServiceConfig] = {}
        skipped = 0
        for service, value in sorted(stored.items()):
            if value.value is None:
                skipped += 1
                log.warning("import of %s from etcd: the value of %r is malformed; skipped "
                            "(the reconciler removes it unless the service is given one)",
                            kind.described, service)
            else:
                found[service] = value.value
        self.stats.config_imports_skipped += skipped
        now = utc_now(backends.clock)
        async with backends.database.transaction() as tx:
            done = await tx.run(desired_configs.import_configs, kind=kind, found=found,
                                skipped=skipped, now=now)
            if done is None:
                return  # another leader imported meanwhile
            # one call for every event: an await per service held the database's write
            # lock across as many turns of a loop a thousand experiments' rounds share
            await tx.run(_record_imports, kind=kind,
                         adopted={s: found[s] for s in done["services"]}, now=now, fence=fence)
        log.info("imported %d %s value(s) from etcd into SQL, skipped %d malformed",
                 len(done["services"]), kind.described, skipped)


def _record_imports(
    *, session: Any, kind: ConfigKind, adopted: Mapping[str, ServiceConfig], now: datetime,
    fence: Fence | None,
) -> None:
    """A `config_imported` event per service adopted."""
    for service, config in adopted.items():
        payload: dict[str, Any] = {"kind": kind.value,
                                   "config": config_document(kind, service, config)}
        if fence is not None:
            payload["leader_fence"] = {"key": fence.key, "revision": fence.create_revision}
        records.record_event(
            session=session, service=service, at=now, actor="controller", kind=CONFIG_IMPORTED,
            reason=f"{kind.described} imported from etcd: SQL keeps it from now on",
            payload=payload,
        )


def _document(
    kind: ConfigKind, service: str, held: StoredValue[ServiceConfig] | None
) -> Any:
    if held is None:
        return None
    if held.value is None:
        return "unreadable"
    return config_document(kind, service, held.value)
