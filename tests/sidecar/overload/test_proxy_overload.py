"""Overload protection in the real proxy, in front of a real upstream it overloads.

The upstream holds `/slow` requests until told to answer, so what is in flight, queued
and shed is decided by the test, not by timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx

from controlplane.kernel.codec import SHED
from controlplane.kernel.overload import OverloadConfig
from sidecar.overload.guard import OverloadGuard
from sidecar.proxy import ProxyServer
from tests.sidecar.proxy_harness import EXPERIMENT, harness

LOW = {"x-priority": "low"}


def protect(proxy: ProxyServer, **fields: object) -> OverloadGuard:
    # the limit is pinned at 2: its bounds leave it nothing to learn
    base: dict[str, object] = {"min_limit": 2, "max_limit": 2, "min_rtt_concurrency": 2}
    config = OverloadConfig.model_validate(base | fields)
    guard = OverloadGuard(config, monotonic=proxy.clock.monotonic, call_later=proxy.loop.call_later)
    proxy.overload = guard
    return guard


async def arrived(upstream_requests: Sequence[object], count: int) -> None:
    async with asyncio.timeout(10):
        while len(upstream_requests) < count:
            await asyncio.sleep(0.005)


async def queued(guard: OverloadGuard, count: int) -> None:
    async with asyncio.timeout(10):
        while sum(len(g.waiting) for g in guard.gates.values()) < count:
            await asyncio.sleep(0.005)


async def test_high_priority_is_served_while_low_priority_is_shed() -> None:
    async with harness() as h:
        guard = protect(h.proxy, queue_size=2, queue_timeout_ms=30_000, light_shed_share=1.0)
        client = h.client
        served = [asyncio.create_task(client.get("/slow")) for _ in range(2)]
        await arrived(h.baseline.requests, 2)  # at the limit: light

        light = await client.get("/slow", headers=LOW)
        waiting = [asyncio.create_task(client.get("/slow"))]
        await queued(guard, 1)
        heavy = await client.get("/slow", headers=LOW)  # 3 of 2: heavy
        waiting.append(asyncio.create_task(client.get("/slow")))
        await queued(guard, 2)
        severe = await client.get("/slow")  # 4 of 2: severe, nothing more queues

        assert len(h.baseline.requests) == 2  # none of the shed touched the upstream
        for shed in (light, heavy, severe):
            assert shed.status_code == 429
            assert shed.headers["retry-after"] == "1"
            assert shed.headers["content-type"] == "application/problem+json"
            assert shed.headers["x-canary-variant"] == "baseline"
            assert shed.json()["status"] == 429
        state = guard.state()["upstreams"][0]
        assert (state["in_flight"], state["queued"], state["level"]) == (2, 2, "severe")

        h.baseline.release.set()
        answers = await asyncio.gather(*served, *waiting)
        assert [r.status_code for r in answers] == [200] * 4
        assert len(h.baseline.requests) == 4

        h.proxy.flush_samples()
        samples = await h.recorder.wait_for(4)
        # shed: no samples, tallies of the shed requests (codec.SHED) for the collector
        assert [s.outcome for s in samples if s.outcome != SHED] == [200] * 4
        tallies = [s for s in samples if s.outcome == SHED]
        assert sum(s.rt_us for s in tallies) == 3
        assert {(s.experiment, s.variant, s.unit_hash) for s in tallies} == {
            (EXPERIMENT, "baseline", 0)
        }
        counts = guard.shed_counts.counts
        assert counts == {
            ("baseline", "low_priority", "low"): 2,
            ("baseline", "over_limit", "normal"): 1,
        }
        assert h.proxy.metrics.requests[("baseline", 429)] == 3
        assert guard.state()["upstreams"][0]["in_flight"] == 0


async def test_a_request_waiting_past_the_queue_timeout_is_shed() -> None:
    async with harness() as h:
        guard = protect(h.proxy, queue_size=5, queue_timeout_ms=20, retry_after_s=3)
        served = [asyncio.create_task(h.client.get("/slow")) for _ in range(2)]
        await arrived(h.baseline.requests, 2)
        late = await h.client.get("/slow")
        assert late.status_code == 429
        assert late.headers["retry-after"] == "3"
        assert "queue_timeout" in late.json()["detail"]
        h.baseline.release.set()
        assert [r.status_code for r in await asyncio.gather(*served)] == [200, 200]
        assert guard.shed_counts.counts == {("baseline", "queue_timeout", "normal"): 1}
        assert len(h.baseline.requests) == 2


async def test_a_queued_request_goes_on_when_a_place_frees() -> None:
    async with harness() as h:
        guard = protect(h.proxy, queue_size=5, queue_timeout_ms=30_000, shed_status=503)
        first = [asyncio.create_task(h.client.get("/slow")) for _ in range(2)]
        await arrived(h.baseline.requests, 2)
        waiting = asyncio.create_task(h.client.get("/status/201"))
        await queued(guard, 1)
        assert len(h.baseline.requests) == 2
        h.baseline.release.set()
        assert (await waiting).status_code == 201
        await asyncio.gather(*first)
        assert guard.shed_counts.counts == {}


async def test_a_client_leaving_the_queue_is_counted_as_abandoned() -> None:
    async with harness() as h:
        guard = protect(h.proxy, queue_size=5, queue_timeout_ms=30_000)
        served = [asyncio.create_task(h.client.get("/slow")) for _ in range(2)]
        await arrived(h.baseline.requests, 2)
        async with httpx.AsyncClient(base_url=h.url) as other:
            leaving = asyncio.create_task(other.get("/slow"))
            await queued(guard, 1)
            leaving.cancel()
        async with asyncio.timeout(10):
            while not guard.shed_counts.counts:
                await asyncio.sleep(0.005)
        assert guard.shed_counts.counts == {("baseline", "abandoned", "normal"): 1}
        assert guard.state()["upstreams"][0]["queued"] == 0
        h.baseline.release.set()
        await asyncio.gather(*served)
        assert len(h.baseline.requests) == 2
        # it never reached the upstream because of the overload: in the tally
        h.proxy.flush_samples()
        samples = await h.recorder.wait_for(3)
        assert [s.rt_us for s in samples if s.outcome == SHED] == [1]
        assert sorted(s.outcome for s in samples if s.outcome != SHED) == [200, 200]


async def test_heavy_overload_asks_the_upstream_to_degrade_and_a_client_cannot() -> None:
    async with harness() as h:
        protect(h.proxy, light_at=0.5, heavy_at=0.5, severe_at=5.0)
        calm = await h.client.get("/status/200", headers={"x-canary-degrade": "1"})
        assert ("X-Canary-Degrade", "1") not in [tuple(x) for x in calm.json()["headers"]]
        held = asyncio.create_task(h.client.get("/slow"))
        await arrived(h.baseline.requests, 2)
        pressed = await h.client.get("/status/200")  # 1 of 2 in flight: heavy
        assert ["X-Canary-Degrade", "1"] in pressed.json()["headers"]
        h.baseline.release.set()
        await held


async def test_low_priority_paths_are_shed_like_the_header() -> None:
    async with harness() as h:
        guard = protect(h.proxy, low_priority_paths=["/batch/"], heavy_at=1.0, severe_at=1.0)
        served = [asyncio.create_task(h.client.get("/slow")) for _ in range(2)]
        await arrived(h.baseline.requests, 2)
        assert (await h.client.get("/batch/report")).status_code == 429
        h.baseline.release.set()
        await asyncio.gather(*served)
        assert guard.shed_counts.counts == {("baseline", "low_priority", "low"): 1}


async def test_a_shed_request_without_a_body_keeps_its_connection() -> None:
    async with harness() as h:
        protect(h.proxy, queue_size=0)
        served = [asyncio.create_task(h.client.get("/slow")) for _ in range(2)]
        await arrived(h.baseline.requests, 2)
        port = h.proxy.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            request = b"GET /status/200 HTTP/1.1\r\nHost: shop\r\n\r\n"
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 429 ")
            assert b"connection: close" not in head.lower()
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            h.baseline.release.set()
            await asyncio.gather(*served)
            writer.write(request)  # the same connection, once a place is free
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200 ")
        finally:
            writer.close()
