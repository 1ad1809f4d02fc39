"""publish_route: §4 routes, revisions that only grow, compare-and-swap against races."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from controlplane.kernel.errors import RevisionConflict
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.routes import RouteState, Sticky, parse_route
from controlplane.routing.publish import RouteSource, publish_route


@pytest.fixture(params=["etcd", "memory"])
async def kv(request: pytest.FixtureRequest, etcd_endpoint: str) -> AsyncIterator[KeyValueStore]:
    store = open_kv(etcd_endpoint if request.param == "etcd" else "memory://")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def keys(etcd_prefix: str) -> EtcdKeys:
    return EtcdKeys(etcd_prefix)


def source(experiment: int = 7, route_revision: int = 0) -> RouteSource:
    return RouteSource(
        experiment=experiment,
        service="payment-api",
        salt="s4lt",
        sticky=Sticky(header=None, cookie="uid"),
        baseline_upstream="http://v1:80",
        canary_upstream="http://v2:80",
        route_revision=route_revision,
    )


async def test_writes_the_design_route_and_revisions_grow(
    kv: KeyValueStore, keys: EtcdKeys
) -> None:
    first = await publish_route(
        kv, keys, experiment=source(), canary_bp=500, state=RouteState.RUNNING
    )
    stored = await kv.get(keys.route("payment-api"))
    assert stored is not None and parse_route(stored.value) == first
    assert first.revision == 1 and first.sticky.cookie == "uid" and first.salt == "s4lt"
    assert [(v.name, v.weight) for v in first.variants] == [("baseline", 9500), ("canary", 500)]

    # A new experiment on the service continues the sequence.
    second = await publish_route(
        kv, keys, experiment=source(experiment=8), canary_bp=0, state=RouteState.ROLLED_BACK
    )
    assert second.revision == 2 and second.experiment == 8


async def test_never_goes_below_what_the_experiment_published(
    kv: KeyValueStore, keys: EtcdKeys
) -> None:
    await kv.put(keys.route("payment-api"), b"{corrupt")
    route = await publish_route(
        kv, keys, experiment=source(route_revision=41), canary_bp=100, state=RouteState.RUNNING
    )
    assert route.revision == 42
    stored = await kv.get(keys.route("payment-api"))
    assert stored is not None and parse_route(stored.value).revision == 42


class InterleavedWriter:
    """A store that lets another writer slip in between this writer's read and write."""

    def __init__(self, kv: KeyValueStore, keys: EtcdKeys) -> None:
        self.kv, self.keys, self.slipped = kv, keys, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.kv, name)

    async def compare_and_swap(self, key: str, value: bytes, **kw: object) -> int:
        if self.slipped == 0:
            self.slipped += 1
            await publish_route(
                self.kv, self.keys, experiment=source(), canary_bp=0, state=RouteState.PAUSED
            )
        return await self.kv.compare_and_swap(key, value, **kw)  # type: ignore[arg-type]


async def test_an_older_writer_never_overwrites_a_newer_route(
    kv: KeyValueStore, keys: EtcdKeys
) -> None:
    await publish_route(kv, keys, experiment=source(), canary_bp=500, state=RouteState.RUNNING)
    racing = InterleavedWriter(kv, keys)
    with pytest.raises(RevisionConflict):
        await publish_route(
            racing, keys, experiment=source(), canary_bp=2500, state=RouteState.RUNNING  # type: ignore[arg-type]
        )
    stored = await kv.get(keys.route("payment-api"))
    assert stored is not None
    newer = parse_route(stored.value)
    assert (newer.revision, newer.state) == (2, RouteState.PAUSED)

    # A caller allowed to retry re-reads and writes on top of the newer route.
    retried = await publish_route(
        InterleavedWriter(kv, keys),  # type: ignore[arg-type]
        keys,
        experiment=source(),
        canary_bp=2500,
        state=RouteState.RUNNING,
        retries=1,
    )
    assert retried.revision == 4
