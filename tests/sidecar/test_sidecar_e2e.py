"""End to end through the real proxy: two real upstreams, real etcd, real Redis.

The test owns its etcd and redis-server (own ports) because it stops and restarts
them: routing must go on with the last route while etcd is down, and no request may
fail while Redis is down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest

from controlplane.kernel.backoff import BackoffPolicy
from controlplane.kernel.codec import parse_entry
from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.keys import COLLECTOR_GROUP, EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants
from controlplane.kernel.streams import SampleStream
from controlplane.kernel.streams_factory import open_streams
from sidecar.assignment import bucket
from sidecar.main import Sidecar
from sidecar.reporter import SampleReporter
from tests.sidecar import upstreams
from tests.support.processes import EtcdProcess, RedisProcess

pytestmark = pytest.mark.e2e

SERVICE = "checkout"
SALT = "e2e-salt"
KEY = EtcdKeys().route(SERVICE)


@dataclass
class Stack:
    etcd: EtcdProcess
    redis: RedisProcess
    base: upstreams.Upstream
    canary: upstreams.Upstream
    writer: KeyValueStore
    reader: SampleStream
    sidecar: Sidecar
    client: httpx.AsyncClient

    def route(self, canary_bp: int, revision: int) -> bytes:
        return Route(
            experiment=11, revision=revision, salt=SALT, sticky=Sticky(header="x-user-id"),
            variants=two_way_variants(self.base.url, self.canary.url, canary_bp),
            state=RouteState.RUNNING,
        ).to_json().encode()

    async def put_route(self, canary_bp: int, revision: int) -> None:
        async with asyncio.timeout(15):  # a client reconnects on its own schedule
            while True:
                try:
                    await self.writer.put(KEY, self.route(canary_bp, revision))
                    break
                except BackendUnavailable:
                    await asyncio.sleep(0.05)
        assert await self.sidecar.watcher.wait_for(
            lambda r: r is not None and r.revision == revision, 5
        )

    async def get(self, user: str | None = None) -> httpx.Response:
        headers = {"x-user-id": user} if user else {}
        return await self.client.get("/echo", headers=headers)


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    etcd, redis_server = EtcdProcess(), RedisProcess()
    etcd.start()
    redis_server.start()
    base, canary = upstreams.Upstream("baseline"), upstreams.Upstream("canary")
    await base.start()
    await canary.start()
    kv = open_kv(etcd.endpoint)
    writer = open_kv(etcd.endpoint)
    stream, _ = open_streams(redis_server.url, namespace="e2e")
    reader, _ = open_streams(redis_server.url, namespace="e2e")
    reporter = SampleReporter(
        stream, SERVICE, max_delay=0.01, backoff_initial=0.02, backoff_max=0.2
    )
    sidecar = Sidecar(service=SERVICE, kv=kv, stream=stream, reporter=reporter)
    # read again quickly after the restart below
    sidecar.watcher.informer.backoff.policy = BackoffPolicy(initial=0.05, maximum=0.2)
    await sidecar.start(("127.0.0.1", 0), ("127.0.0.1", 0))
    client = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{sidecar.proxy.port}", trust_env=False, timeout=10
    )
    stack = Stack(etcd, redis_server, base, canary, writer, reader, sidecar, client)
    try:
        yield stack
    finally:
        await client.aclose()
        await sidecar.stop()
        await writer.close()
        await reader.close()
        await base.stop()
        await canary.stop()
        etcd.close()
        redis_server.close()


def expected_variant(user: str, canary_bp: int) -> str:
    return "canary" if bucket(SALT, user) < canary_bp else "baseline"


async def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.01)


async def test_split_stickiness_hot_reload_and_outages(stack: Stack) -> None:
    await stack.reader.ensure_group(SERVICE, COLLECTOR_GROUP)
    await stack.put_route(2000, revision=1)
    users = [f"user-{i}" for i in range(200)]

    # split: every user lands where the published hash says, upstream and tag agree
    for user in users:
        response = await stack.get(user)
        assert response.status_code == 200
        assert response.headers["x-upstream"] == expected_variant(user, 2000)
        assert response.headers["x-canary-variant"] == expected_variant(user, 2000)
        assert response.json()["headers"].count(["X-Canary-Experiment", "11"]) == 1
    canary_users = sum(expected_variant(u, 2000) == "canary" for u in users)
    assert 20 <= canary_users <= 60  # ~20% of 200
    # stickiness: the same users again, the same variants
    for user in users[:50]:
        assert (await stack.get(user)).headers["x-upstream"] == expected_variant(user, 2000)

    # a route change applied while requests flow: none fails, the new split follows
    statuses: list[int] = []
    stop_flow = asyncio.Event()

    async def flow() -> None:
        i = 0
        while not stop_flow.is_set():
            statuses.append((await stack.get(f"flow-{i}")).status_code)
            i += 1

    flowing = asyncio.create_task(flow())
    await wait_until(lambda: len(statuses) >= 20)
    await stack.put_route(8000, revision=2)
    await wait_until(lambda: len(statuses) >= 60)
    stop_flow.set()
    await flowing
    assert set(statuses) == {200}
    for user in users[:50]:
        assert (await stack.get(user)).headers["x-upstream"] == expected_variant(user, 8000)

    # samples reached Redis, tagged with the experiment and the variants
    await wait_until(lambda: stack.sidecar.reporter.snapshot().buffered_samples == 0)
    entries = await stack.reader.read_group(
        [SERVICE], COLLECTOR_GROUP, "t", count=10_000, block_ms=0
    )
    decoded = [parse_entry(entry.fields) for entry in entries]
    assert sum(meta.n for meta, _ in decoded) == stack.sidecar.reporter.snapshot().samples_sent
    assert {meta.experiment for meta, _ in decoded} == {"11"}
    assert {name for _, batch in decoded for name in batch.variants} == {"baseline", "canary"}

    # Redis down: every request still succeeds; samples are buffered or dropped, counted
    stack.redis.stop()
    sent_before = stack.sidecar.reporter.snapshot().samples_sent
    for i in range(100):
        assert (await stack.get(f"r-{i}")).status_code == 200
    await wait_until(lambda: stack.sidecar.reporter.snapshot().send_errors > 0)
    # the proxy hands samples to the reporter every few milliseconds
    await wait_until(
        lambda: (stats := stack.sidecar.reporter.snapshot()).buffered_samples
        + stats.samples_dropped
        >= 100
    )
    assert stack.sidecar.reporter.snapshot().samples_sent == sent_before
    stack.redis.start()
    await wait_until(lambda: stack.sidecar.reporter.snapshot().samples_sent >= sent_before + 100,
                     timeout=15)

    # etcd down: routing goes on with the last route in force
    stack.etcd.stop()
    for user in users[:50]:
        response = await stack.get(user)
        assert response.status_code == 200
        assert response.headers["x-upstream"] == expected_variant(user, 8000)
    stack.etcd.start()
    await stack.put_route(0, revision=3)
    assert {(await stack.get(u)).headers["x-upstream"] for u in users[:20]} == {"baseline"}
