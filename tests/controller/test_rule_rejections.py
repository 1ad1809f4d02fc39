"""An invalid breaker rule stored in etcd is recorded as `rule_rejected` once per value.

Not again when the rule watch reconnects and reads it again, nor when another
controller (a restart, a failover) reads it; a different invalid value is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from sqlalchemy.orm import Session

from controlplane.controller.rulebook import RuleBook, RuleRejection
from controlplane.controller.runner import RULE_REJECTED, Controller
from controlplane.db import experiments as records
from controlplane.db.migrate import upgrade
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.kv import KeyValueStore, WatchEvent
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends, open_backends

SERVICE = "payment-api"

# ------------------------------------------------------------------ identity, pure

REJECTION = RuleRejection(SERVICE, 12, "ab" * 32, "invalid rule")


@pytest.mark.parametrize(
    ("payload", "recorded"),
    [
        ({"etcd_revision": 12, "value_sha256": "ab" * 32}, True),
        ({"etcd_revision": 13, "value_sha256": "ab" * 32}, False),  # written again
        ({"etcd_revision": 12, "value_sha256": "cd" * 32}, False),  # a store started anew
        ({"etcd_revision": 12}, False),  # recorded before values were identified
        ({}, False),
    ],
)
def test_a_rejection_is_recorded_in_an_event_naming_the_same_revision_and_value(
    payload: dict[str, Any], recorded: bool
) -> None:
    assert REJECTION.recorded_in(payload) is recorded
    assert REJECTION.recorded_in(REJECTION.event_payload())


# ------------------------------------------------------------------ against the backends


class ReconnectingKV:
    """The store, with a rule watch that can be cut as a lost connection would."""

    def __init__(self, kv: KeyValueStore) -> None:
        self.kv = kv
        self.watches = 0
        self._cut = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)

    def cut(self) -> None:
        self._cut.set()

    async def watch_prefix(
        self, prefix: str, *, start_revision: int = 0
    ) -> AsyncIterator[WatchEvent]:
        self.watches += 1
        events = aiter(self.kv.watch_prefix(prefix, start_revision=start_revision))
        cut = asyncio.ensure_future(self._cut.wait())
        try:
            while True:
                following = asyncio.ensure_future(anext(events))
                await asyncio.wait({following, cut}, return_when=asyncio.FIRST_COMPLETED)
                if cut.done():
                    following.cancel()
                    self._cut.clear()
                    raise BackendUnavailable("injected: the watch connection dropped")
                try:
                    yield following.result()
                except StopAsyncIteration:
                    return
        finally:
            cut.cancel()
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait for the rule watch (real etcd I/O, not the clock) to deliver."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.fixture
async def backends(
    backend_settings: Settings,
) -> AsyncIterator[Backends]:
    upgrade(backend_settings.database_url)
    opened = await open_backends(backend_settings, clock=FakeClock())
    try:
        yield opened
    finally:
        await opened.close()


async def rejections(backends: Backends) -> list[dict[str, Any]]:
    def read(*, session: Session) -> list[dict[str, Any]]:
        rows, _ = records.list_events(session=session, service=SERVICE)
        return [dict(e.payload) for e in rows if e.kind == RULE_REJECTED]

    return await backends.database.read(read)


async def open_controller(backends: Backends, identity: str) -> tuple[Controller, RuleBook]:
    controller = Controller(identity=identity)
    await controller.open(backends)
    book = controller._rulebook
    assert book is not None
    await asyncio.wait_for(book.loaded.wait(), 10)
    return controller, book


async def test_an_invalid_rule_is_recorded_once_across_reconnects_and_controllers(
    backends: Backends,
) -> None:
    key = backends.keys.rule(SERVICE)
    revision = await backends.kv.put(key, b'{"service": "payment-api", "threshold_ms": -1}')
    kv = ReconnectingKV(backends.kv)
    leader = dataclasses.replace(backends, kv=kv)
    first, book = await open_controller(leader, "first")
    try:
        await until(lambda: bool(book.rejections()), "the rejection")
        await first.evaluate_all(leader, None)
        [event] = await rejections(backends)
        assert event["etcd_revision"] == revision and len(event["value_sha256"]) == 64

        kv.cut()  # the watch reconnects: the rule is read again
        await until(lambda: kv.watches == 2, "the watch to reconnect")
        await first.evaluate_all(leader, None)
        assert len(await rejections(backends)) == 1
        assert book.rejected == 1, "a value read again is no new rejection"
    finally:
        await first.stop()

    # a restart or failover: a controller that has recorded nothing itself
    second, book = await open_controller(backends, "second")
    try:
        await until(lambda: bool(book.rejections()), "the rejection")
        await second.evaluate_all(backends, None)
        assert len(await rejections(backends)) == 1

        other = await backends.kv.put(key, b"{not json")
        await until(lambda: book.rejections()[0].revision == other, "the new value")
        await second.evaluate_all(backends, None)
        await second.evaluate_all(backends, None)
        events = await rejections(backends)
        assert [e["etcd_revision"] for e in events] == [revision, other]
    finally:
        await second.stop()


async def test_a_valid_rule_clears_the_rejection_and_the_same_bad_value_again_counts(
    backends: Backends,
) -> None:
    key, bad = backends.keys.rule(SERVICE), b"{not json"
    await backends.kv.put(key, bad)
    controller, book = await open_controller(backends, "only")
    try:
        await until(lambda: bool(book.rejections()), "the rejection")
        await controller.evaluate_all(backends, None)
        valid = await backends.kv.put(
            key, b'{"service": "payment-api", "threshold_ms": 800, "window_sec": 60}'
        )
        await until(lambda: not book.rejections(), "the valid rule")
        in_force = book.get(SERVICE)
        assert in_force is not None and in_force.revision == valid
        again = await backends.kv.put(key, bad)  # written again: a new rejection
        await until(lambda: bool(book.rejections()), "the rejection")
        await controller.evaluate_all(backends, None)
        assert [e["etcd_revision"] for e in await rejections(backends)][-1] == again
        assert len(await rejections(backends)) == 2
    finally:
        await controller.stop()
