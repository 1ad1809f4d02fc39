"""RouteWatcher against real etcd and the in-process store: hot reload, fail-static."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest

from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants
from sidecar.choice import Upstream
from sidecar.routing import RouteTable, RouteWatcher
from tests.support.outage import Outage
from tests.support.processes import EtcdProcess

SERVICE = "checkout"
APPLY_TIMEOUT = 5.0


def route_json(canary_bp: int, *, revision: int, experiment: int | str = 7) -> bytes:
    route = Route(
        experiment=experiment,
        revision=revision,
        salt="exp-1",
        sticky=Sticky(header="x-user-id"),
        variants=two_way_variants("http://127.0.0.1:9001", "http://127.0.0.1:9002", canary_bp),
        state=RouteState.RUNNING,
    )
    return route.to_json().encode()


@pytest.fixture(params=["etcd", "memory"])
async def kv(request: pytest.FixtureRequest, etcd_endpoint: str) -> AsyncIterator[KeyValueStore]:
    store = open_kv(etcd_endpoint if request.param == "etcd" else "memory://")
    yield store
    await store.close()


@pytest.fixture
async def watcher(kv: KeyValueStore, etcd_prefix: str) -> AsyncIterator[RouteWatcher]:
    table = RouteTable(default_upstream=Upstream.parse("http://127.0.0.1:9100"))
    route_watcher = RouteWatcher(kv, table, service=SERVICE, prefix=etcd_prefix)
    route_watcher.start()
    assert await route_watcher.wait_loaded(APPLY_TIMEOUT)
    yield route_watcher
    await route_watcher.stop()


async def put_when_up(kv: KeyValueStore, key: str, value: bytes, timeout: float = 15.0) -> None:
    """A client reconnects on its own schedule after a restart: retry until it does."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await kv.put(key, value)
            return
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def at_revision(revision: int) -> Callable[[Route | None], bool]:
    return lambda route: route is not None and route.revision == revision


async def test_a_route_written_after_start_is_applied(
    kv: KeyValueStore, watcher: RouteWatcher, etcd_prefix: str
) -> None:
    assert watcher.table.route is None
    assert watcher.table.choose({}).variant == "default"
    await kv.put(EtcdKeys(etcd_prefix).route(SERVICE), route_json(10_000, revision=1))
    assert await watcher.wait_for(at_revision(1), APPLY_TIMEOUT)
    assert watcher.table.choose({"x-user-id": "alice"}).variant == "canary"
    assert watcher.stats.applied == 1


async def test_the_route_present_at_start_is_loaded(kv: KeyValueStore, etcd_prefix: str) -> None:
    await kv.put(EtcdKeys(etcd_prefix).route(SERVICE), route_json(2500, revision=4))
    table = RouteTable()
    route_watcher = RouteWatcher(kv, table, service=SERVICE, prefix=etcd_prefix)
    route_watcher.start()
    try:
        assert await route_watcher.wait_for(at_revision(4), APPLY_TIMEOUT)
        assert table.ready
    finally:
        await route_watcher.stop()


async def test_a_malformed_route_is_rejected_counted_and_the_last_valid_stays(
    kv: KeyValueStore, watcher: RouteWatcher, etcd_prefix: str
) -> None:
    key = EtcdKeys(etcd_prefix).route(SERVICE)
    await kv.put(key, route_json(2500, revision=1))
    assert await watcher.wait_for(at_revision(1), APPLY_TIMEOUT)

    bad_weights = json.loads(route_json(2500, revision=2))
    bad_weights["variants"][1]["weight"] = 1
    for value in (b"{not json", json.dumps(bad_weights).encode(), b'{"experiment": 7}'):
        await kv.put(key, value)
    await kv.put(key, route_json(5000, revision=3))
    assert await watcher.wait_for(at_revision(3), APPLY_TIMEOUT)
    assert watcher.stats.rejected_malformed == 3
    assert watcher.stats.applied == 2


async def test_the_route_etcd_wrote_last_is_in_force_whatever_its_revision_says(
    kv: KeyValueStore, watcher: RouteWatcher, etcd_prefix: str
) -> None:
    key = EtcdKeys(etcd_prefix).route(SERVICE)
    await kv.put(key, route_json(2500, revision=5))
    assert await watcher.wait_for(at_revision(5), APPLY_TIMEOUT)
    # a hand writer pins the largest revision: it claims nothing over later writes
    await kv.put(key, route_json(10_000, revision=2**31 - 1))
    assert await watcher.wait_for(at_revision(2**31 - 1), APPLY_TIMEOUT)
    await kv.put(key, route_json(0, revision=5))  # the leader's repair
    assert await watcher.wait_for(at_revision(5), APPLY_TIMEOUT)
    assert watcher.table.choose({"x-user-id": "alice"}).variant == "baseline"
    await kv.put(key, route_json(100, revision=1, experiment=8))
    assert await watcher.wait_for(at_revision(1), APPLY_TIMEOUT)
    assert watcher.table.route is not None and watcher.table.route.experiment == 8
    assert (watcher.stats.applied, watcher.stats.rejected) == (4, 0)


async def test_a_deleted_route_falls_back_to_the_default_upstream(
    kv: KeyValueStore, watcher: RouteWatcher, etcd_prefix: str
) -> None:
    key = EtcdKeys(etcd_prefix).route(SERVICE)
    await kv.put(key, route_json(2500, revision=1))
    assert await watcher.wait_for(at_revision(1), APPLY_TIMEOUT)
    await kv.delete(key)
    assert await watcher.wait_for(lambda route: route is None, APPLY_TIMEOUT)
    assert watcher.table.choose({}).variant == "default"


async def test_keys_of_other_services_sharing_the_name_prefix_are_ignored(
    kv: KeyValueStore, watcher: RouteWatcher, etcd_prefix: str
) -> None:
    keys = EtcdKeys(etcd_prefix)
    await kv.put(keys.route(SERVICE + "-2"), b"{garbage")
    await kv.put(keys.route(SERVICE), route_json(2500, revision=1))
    assert await watcher.wait_for(at_revision(1), APPLY_TIMEOUT)
    assert watcher.stats.rejected == 0


async def test_fail_static_while_etcd_is_down_and_resumes_after_restart() -> None:
    etcd = EtcdProcess()
    etcd.start()
    kv = open_kv(etcd.endpoint)
    writer = open_kv(etcd.endpoint)
    key = EtcdKeys("/canary").route(SERVICE)
    route_watcher = RouteWatcher(
        kv, RouteTable(), service=SERVICE, backoff_initial=0.05, backoff_max=0.2
    )
    try:
        await put_when_up(writer, key, route_json(2500, revision=1))
        route_watcher.start()
        assert await route_watcher.wait_for(at_revision(1), APPLY_TIMEOUT)

        etcd.stop()
        # nothing to wait for but time: the route must stay while the store is gone
        assert not await route_watcher.wait_for(lambda route: route is None, 0.5)
        assert route_watcher.table.choose({"x-user-id": "alice"}).variant == "canary"

        etcd.start()
        await put_when_up(writer, key, route_json(0, revision=2))
        assert await route_watcher.wait_for(at_revision(2), 15.0)
        assert route_watcher.table.choose({"x-user-id": "alice"}).variant == "baseline"
    finally:
        await route_watcher.stop()
        await kv.close()
        await writer.close()
        etcd.close()


# -- a watch lost for longer than the store keeps history --




async def test_a_route_deleted_while_the_watch_was_lost_is_dropped_after_reconnect(
    outage: Outage, etcd_prefix: str
) -> None:
    keys = EtcdKeys(etcd_prefix)
    await outage.writer.put(keys.route(SERVICE), route_json(2500, revision=3))
    await outage.writer.put(keys.route("other"), route_json(2500, revision=1))
    table = RouteTable(default_upstream=Upstream.parse("http://127.0.0.1:9100"))
    route_watcher = RouteWatcher(outage.consumer_kv, table, service=SERVICE, prefix=etcd_prefix)
    route_watcher.start()
    try:
        assert await route_watcher.wait_for(at_revision(3), APPLY_TIMEOUT)

        async def delete_route(kv: KeyValueStore) -> None:
            await kv.delete(keys.route(SERVICE))

        await outage.while_away(delete_route)
        assert await route_watcher.wait_for(lambda route: route is None, 15.0)
        assert table.choose({"x-user-id": "alice"}).variant == "default"
        assert route_watcher.informer.stats.relists >= 1
        assert route_watcher.stats.deleted == 1

        # a route written again after the relist is followed as before
        await outage.writer.put(keys.route(SERVICE), route_json(0, revision=1, experiment=9))
        assert await route_watcher.wait_for(at_revision(1), APPLY_TIMEOUT)
    finally:
        await route_watcher.stop()


async def test_a_lower_revision_written_while_the_watch_was_lost_is_in_force_after_it(
    outage: Outage, etcd_prefix: str
) -> None:
    key = EtcdKeys(etcd_prefix).route(SERVICE)
    await outage.writer.put(key, route_json(2500, revision=2**31 - 1))
    route_watcher = RouteWatcher(outage.consumer_kv, RouteTable(), service=SERVICE,
                                 prefix=etcd_prefix)  # fmt: skip
    route_watcher.start()
    try:
        assert await route_watcher.wait_for(at_revision(2**31 - 1), APPLY_TIMEOUT)

        async def write_repair(kv: KeyValueStore) -> None:
            await kv.put(key, route_json(0, revision=4))

        await outage.while_away(write_repair)
        assert await route_watcher.wait_for(at_revision(4), 15.0)
        assert route_watcher.table.choose({"x-user-id": "alice"}).variant == "baseline"
    finally:
        await route_watcher.stop()
