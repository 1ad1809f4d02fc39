"""The router agent: what etcd holds reaches the router, coalesced, fail-static."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_memory import MemoryKV
from controlplane.kernel.routes import Route, RouteState
from routers.agent import RouterAgent, apply_delay
from routers.follow import RouteFollower
from routers.seam import InForce, RouterError
from tests.support.routes import two_way_route

SERVICE = "shop"
KEY = EtcdKeys("/canary").route(SERVICE)


class RecordingRouter:
    """A router that keeps what it was given; refuses while `refuse` is set, and can
    hold an apply open until `gate` is set (to let changes pile up behind it)."""

    kind = "recording"

    def __init__(self, min_interval: float = 0.0) -> None:
        self.min_interval = min_interval
        self.applied: list[Route | None] = []
        self.refuse: str | None = None
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def apply(self, route: Route | None) -> None:
        self.entered.set()
        await self.gate.wait()
        if self.refuse:
            raise RouterError(self.refuse)
        self.applied.append(route)

    async def in_force(self) -> InForce:
        return InForce.of(self.applied[-1] if self.applied else None)

    async def close(self) -> None:
        pass


def _value(revision: int, canary_bp: int) -> bytes:
    route = two_way_route(revision, experiment=7, canary_bp=canary_bp, state=RouteState.RUNNING)
    return route.model_dump_json().encode()


async def _agent(kv: MemoryKV, router: RecordingRouter, clock: FakeClock) -> RouterAgent:
    async def sleep(seconds: float) -> None:
        clock.advance(seconds)
        await asyncio.sleep(0)

    follower = RouteFollower(kv, service=SERVICE)
    agent = RouterAgent(follower, router, clock=clock, sleep=sleep)
    agent.start()
    return agent


def _revisions(router: RecordingRouter) -> list[int | None]:
    return [r.revision if r is not None else None for r in router.applied]


@pytest.mark.parametrize(
    ("last", "interval", "now", "expected"),
    [(None, 1.0, 5.0, 0.0), (4.5, 1.0, 5.0, 0.5), (3.0, 1.0, 5.0, 0.0), (5.0, 0.0, 5.0, 0.0)],
)
def test_the_delay_before_an_apply(
    last: float | None, interval: float, now: float, expected: float
) -> None:
    assert apply_delay(last, interval, now) == pytest.approx(expected)


async def test_the_route_etcd_holds_reaches_the_router_and_a_deleted_key_means_none() -> None:
    kv, clock, router = MemoryKV(), FakeClock(), RecordingRouter()
    await kv.put(KEY, _value(1, 500))
    agent = await _agent(kv, router, clock)
    try:
        assert await agent.wait_in_step(5)
        assert _revisions(router) == [1]
        await kv.put(KEY, _value(2, 2500))
        await asyncio.wait_for(_until(lambda: _revisions(router) == [1, 2]), 5)
        await kv.delete(KEY)
        await asyncio.wait_for(_until(lambda: _revisions(router) == [1, 2, None]), 5)
        status = await agent.status()
        assert status["in_step"] is True and status["in_force"] == {
            "experiment": None, "revision": None}
    finally:
        await agent.stop()


async def test_no_route_in_etcd_at_start_is_applied_as_none() -> None:
    kv, clock, router = MemoryKV(), FakeClock(), RecordingRouter()
    agent = await _agent(kv, router, clock)
    try:
        assert await agent.wait_in_step(5)
        assert router.applied == [None]
    finally:
        await agent.stop()


async def test_changes_faster_than_the_interval_are_coalesced_to_the_last() -> None:
    kv, clock, router = MemoryKV(), FakeClock(), RecordingRouter(min_interval=1.0)
    await kv.put(KEY, _value(1, 100))
    agent = await _agent(kv, router, clock)
    try:
        assert await agent.wait_in_step(5)
        router.gate.clear()
        router.entered.clear()
        await kv.put(KEY, _value(2, 200))
        await asyncio.wait_for(router.entered.wait(), 5)  # revision 2 is being applied
        for revision in (3, 4, 5, 6):
            await kv.put(KEY, _value(revision, revision * 100))
        await asyncio.wait_for(_until(lambda: agent.follower.generation == 6), 5)
        router.gate.set()
        assert await agent.wait_in_step(5)
        assert _revisions(router) == [1, 2, 6]
        assert agent.stats.coalesced == 3
    finally:
        await agent.stop()


async def test_a_refused_route_keeps_the_last_and_is_retried_until_taken() -> None:
    kv, clock, router = MemoryKV(), FakeClock(), RecordingRouter()
    await kv.put(KEY, _value(1, 100))
    agent = await _agent(kv, router, clock)
    try:
        assert await agent.wait_in_step(5)
        router.refuse = "nginx: [emerg] host not found in upstream"
        await kv.put(KEY, _value(2, 200))
        await asyncio.wait_for(_until(lambda: agent.stats.apply_errors >= 3), 5)
        assert not agent.in_step
        status = await agent.status()
        assert status["in_force"] == {"experiment": "7", "revision": 1}
        assert status["desired"] == {"experiment": "7", "revision": 2}
        assert "host not found" in status["last_error"]
        router.refuse = None
        assert await agent.wait_in_step(5)
        assert _revisions(router) == [1, 2]
        assert agent.stats.last_error is None
    finally:
        await agent.stop()


async def test_a_malformed_value_is_counted_and_the_route_in_force_stays() -> None:
    kv, clock, router = MemoryKV(), FakeClock(), RecordingRouter()
    await kv.put(KEY, _value(1, 100))
    agent = await _agent(kv, router, clock)
    try:
        assert await agent.wait_in_step(5)
        await kv.put(KEY, b'{"experiment": 7, "revision": 2, "variants": []}')
        await kv.put(KEY + "-other", _value(9, 9000))  # a longer key is another service's
        await asyncio.wait_for(_until(lambda: agent.follower.stats.rejected_malformed == 1), 5)
        assert _revisions(router) == [1] and agent.in_step
    finally:
        await agent.stop()


async def _until(predicate: object) -> None:
    assert callable(predicate)
    while not predicate():
        await asyncio.sleep(0.005)


async def test_a_proxy_that_lost_its_route_is_given_it_again() -> None:
    kv, clock, router = MemoryKV(), FakeClock(), RecordingRouter()
    await kv.put(KEY, _value(1, 100))
    follower = RouteFollower(kv, service=SERVICE)
    agent = RouterAgent(follower, router, clock=clock, verify_every=0.05)
    agent.start()
    try:
        assert await agent.wait_in_step(5)
        router.applied.clear()  # the proxy restarted with its base config: no route
        await asyncio.wait_for(_until(lambda: _revisions(router) == [1]), 5)
        assert agent.stats.drift_repaired == 1 and agent.in_step
    finally:
        await agent.stop()
