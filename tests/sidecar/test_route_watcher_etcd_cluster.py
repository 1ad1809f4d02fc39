"""The sidecar's route watcher on a 3-member etcd cluster whose member is killed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_etcd import EtcdKV
from controlplane.kernel.routes import Route, RouteState
from sidecar.choice import Upstream
from sidecar.routing import RouteTable, RouteWatcher
from tests.support.etcd_cluster import EtcdCluster
from tests.support.routes import two_way_route

SERVICE = "checkout"
APPLY_TIMEOUT = 10.0


@pytest.fixture
async def sidecar_kv(etcd_cluster: EtcdCluster) -> AsyncIterator[EtcdKV]:
    async with etcd_cluster.client() as store:
        yield store


async def test_routes_written_after_the_loss_of_the_watched_member_are_applied(
    etcd_cluster: EtcdCluster, sidecar_kv: EtcdKV, etcd_prefix: str
) -> None:
    key = EtcdKeys(etcd_prefix).route(SERVICE)
    watcher = RouteWatcher(
        sidecar_kv, RouteTable(default_upstream=Upstream.parse("http://127.0.0.1:9100")),
        service=SERVICE, prefix=etcd_prefix,
    )
    watcher.start()
    try:
        async with etcd_cluster.client() as writer:
            assert await watcher.wait_loaded(APPLY_TIMEOUT)
            await writer.put(key, _route(1))
            assert await watcher.wait_for(at_revision(1), APPLY_TIMEOUT)
            victim = etcd_cluster.watched_member()
            etcd_cluster.kill(victim)
            for revision in (2, 3):
                await writer.put(key, _route(revision))
                assert await watcher.wait_for(at_revision(revision), APPLY_TIMEOUT), (
                    f"route revision {revision} not applied with {victim.member_name} down"
                )
        assert watcher.stats.applied == 3
        assert watcher.table.choose({"x": "1"}).variant in {"baseline", "canary"}
        assert etcd_cluster.watched_member() is not victim
    finally:
        await watcher.stop()


def at_revision(revision: int) -> Callable[[Route | None], bool]:
    return lambda route: route is not None and route.revision == revision


def _route(revision: int) -> bytes:
    route = two_way_route(revision, experiment=1, canary_bp=revision * 1000,
                          state=RouteState.RUNNING)
    return route.to_json().encode()
