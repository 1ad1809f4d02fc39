"""The rule book after a watch lost for longer than the store keeps history.

A rule deleted meanwhile is no longer in force, a rule changed meanwhile is, and an
invalid value deleted meanwhile is no longer listed as a rejection; the rules in
force stay while the store is away. Against an etcd of its own and the in-process
store (tests/support/outage.py).
"""

from __future__ import annotations

import json

from controlplane.controller.rulebook import RuleBook
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from tests.support.outage import Outage, until

WAIT = 15.0  # an upper bound so a broken watch fails the test; no speed claim


def rule(service: str, threshold_ms: int) -> bytes:
    return json.dumps({"service": service, "threshold_ms": threshold_ms}).encode()






async def test_rules_deleted_or_changed_while_the_watch_was_lost_are_caught_up(
    outage: Outage, etcd_prefix: str
) -> None:
    keys = EtcdKeys(etcd_prefix)
    await outage.writer.put(keys.rule("kept"), rule("kept", 100))
    await outage.writer.put(keys.rule("changed"), rule("changed", 200))
    await outage.writer.put(keys.rule("deleted"), rule("deleted", 300))
    await outage.writer.put(keys.rule("bad"), b"{not json")
    book = RuleBook(outage.consumer_kv, keys)
    await book.start()
    try:
        assert await book.informer.wait_synced(WAIT)
        assert book.services() == ["changed", "deleted", "kept"]
        assert [r.service for r in book.rejections()] == ["bad"]
        kept = book.get("kept")

        async def change(kv: KeyValueStore) -> None:
            await kv.delete(keys.rule("deleted"))
            await kv.delete(keys.rule("bad"))
            await kv.put(keys.rule("changed"), rule("changed", 250))

        await outage.while_away(change)
        await until(lambda: book.get("deleted") is None, "the deleted rule to go")
        await until(lambda: book.get("changed") is not None
                    and book.get("changed").rule.threshold_ms == 250,  # type: ignore[union-attr]
                    "the changed rule")  # fmt: skip
        assert book.services() == ["changed", "kept"]
        assert book.rejections() == []
        assert book.get("kept") is kept, "an unchanged rule is not applied again"
        assert book.rejected == 1
        assert book.informer.stats.relists >= 1
    finally:
        await book.stop()
