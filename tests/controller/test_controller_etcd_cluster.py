"""Two controllers and a sidecar on a real 3-member etcd cluster; members killed in turn.

A member's loss must cost no election: the leader keeps its lease through the
surviving members, the standby never takes over, and routes started during each
loss still reach the sidecar.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane.controller.runner import Controller
from controlplane.db.migrate import upgrade
from controlplane.experiments.actions import apply_action, create_experiment
from controlplane.experiments.lifecycle import LifecycleAction
from controlplane.experiments.store import ExperimentSpec, StepSpec
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.kv_etcd import EtcdKV
from controlplane.kernel.routes import Route
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends, open_backends
from sidecar.choice import Upstream
from sidecar.routing import RouteTable, RouteWatcher
from tests.support.etcd_cluster import EtcdCluster

LEASE_TTL = 3
SERVICES = ("cart", "search", "pay")
APPLY_TIMEOUT = 10.0


@dataclass
class Plant:
    cluster: EtcdCluster
    leader_backends: Backends
    leader: Controller
    standby: Controller
    watchers: dict[str, RouteWatcher]
    leader_samples: list[tuple[bool, bool]]

    async def start_experiment(self, service: str) -> None:
        spec = ExperimentSpec(
            name=f"{service} v2", service=service,
            baseline_upstream="http://127.0.0.1:9001", canary_upstream="http://127.0.0.1:9002",
            steps=(StepSpec(1000, 30),), sticky_header="x-user-id", sticky_cookie=None,
            rule=None,
        )
        backends = self.leader_backends
        experiment = await create_experiment(
            store=backends.store, clock=SystemClock(), spec=spec, actor="user:test"
        )
        await apply_action(
            store=backends.store, changes=backends.route_changes, clock=SystemClock(),
            experiment_id=experiment.id, action=LifecycleAction.START, actor="user:test",
        )


async def until(condition: Callable[[], bool], timeout: float) -> bool:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)
    return True


def has_route(route: Route | None) -> bool:
    return route is not None


@pytest.fixture
async def plant(
    etcd_cluster: EtcdCluster, tmp_path: Path, etcd_prefix: str
) -> AsyncIterator[Plant]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/canary.db", etcd=etcd_cluster.endpoints,
        etcd_prefix=etcd_prefix, redis_url="memory://",
    )
    upgrade(settings.database_url)
    one, two = await open_backends(settings), await open_backends(settings)
    leader = Controller(identity="one", lease_ttl=LEASE_TTL)
    standby = Controller(identity="two", lease_ttl=LEASE_TTL)
    sidecar_kv = EtcdKV(etcd_cluster.endpoints)
    watchers = {
        service: RouteWatcher(sidecar_kv, RouteTable(default_upstream=Upstream.parse(
            "http://127.0.0.1:9100")), service=service, prefix=etcd_prefix)
        for service in SERVICES
    }
    samples: list[tuple[bool, bool]] = []

    async def sample() -> None:
        while True:
            samples.append((leader.stats.leader, standby.stats.leader))
            await asyncio.sleep(0.1)

    sampler: asyncio.Task[None] | None = None
    try:
        await leader.start(one)
        await until(lambda: leader.stats.leader, APPLY_TIMEOUT)
        await standby.start(two)
        for watcher in watchers.values():
            watcher.start()
            assert await watcher.wait_loaded(APPLY_TIMEOUT)
        sampler = asyncio.create_task(sample())
        yield Plant(etcd_cluster, one, leader, standby, watchers, samples)
    finally:
        if sampler is not None:
            sampler.cancel()
        for watcher in watchers.values():
            await watcher.stop()
        await standby.stop()
        await leader.stop()
        await sidecar_kv.close()
        await two.close()
        await one.close()


async def test_killed_members_cost_no_election_and_routes_still_apply(
    plant: Plant,
) -> None:
    cluster = plant.cluster
    # the raft leader first (renewals wait for a new one), then two followers
    for service, choose in zip(SERVICES, (cluster.leader, cluster.follower,
                                          cluster.follower), strict=True):
        victim = choose()
        cluster.kill(victim)
        await plant.start_experiment(service)
        assert await plant.watchers[service].wait_for(has_route, APPLY_TIMEOUT), (
            f"the route of {service} was not applied with {victim.member_name} down"
        )
        # longer than the lease: it lives only if renewed through the survivors
        await asyncio.sleep(LEASE_TTL + 0.5)
        await asyncio.to_thread(cluster.heal)
    assert plant.leader.stats.terms == 1
    assert plant.standby.stats.terms == 0
    assert plant.leader_samples and all(
        one and not two for one, two in plant.leader_samples
    ), "leadership changed hands or lapsed"
