"""HTTP/1.1 requests to an HTTP/2 upstream (the relay) pass the same overload gate as
the other paths: a real HTTP/1.1 client, the real proxy, and an `h2c://` upstream
driven frame by frame whose `/hang` streams are never answered, so what is in flight,
queued and shed is decided by the test. A hanging request's place is given back when
its client goes away."""

from __future__ import annotations

import asyncio

import httpx

from tests.sidecar.overload.test_proxy_overload import LOW, protect, queued
from tests.sidecar.test_proxy_h2_upstream import H2, rig


def h1_client(base: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base, timeout=30)


async def test_the_relay_is_gated_queued_and_shed() -> None:
    async with rig() as r, h1_client(r.base) as hang1, h1_client(r.base) as hang2, \
            h1_client(r.base) as client:  # fmt: skip
        guard = protect(r.proxy, queue_size=1, queue_timeout_ms=30_000, light_shed_share=1.0)
        # two streams take both places (one connection each: HTTP/1.1)
        hung = [asyncio.create_task(c.get("/hang", headers=H2)) for c in (hang1, hang2)]
        await r.h2.wait_started(2)

        shed = await client.get("/echo", headers=H2 | LOW)  # at the limit: light
        assert shed.status_code == 429
        assert shed.headers["retry-after"] == "1"
        assert shed.headers["x-canary-variant"] == "h2"
        assert "low_priority" in shed.json()["detail"]

        # over the limit: waits, its body held until a place frees
        body = b"x" * 150_000
        waiting = asyncio.create_task(client.post("/echo", content=body, headers=H2))
        await queued(guard, 1)
        gate = next(iter(guard.gates.values()))
        assert (gate.in_flight, len(gate.waiting)) == (2, 1)
        assert r.h2.started == 2  # neither the shed nor the waiting request reached it

        # the queue is full: the next one is shed
        async with h1_client(r.base) as other:
            full = await other.get("/echo", headers=H2)
        assert full.status_code == 429 and "queue_full" in full.json()["detail"]

        hung[0].cancel()  # its client leaves: the stream is reset, its place freed
        echoed = await waiting
        assert echoed.status_code == 200
        assert echoed.json()["body_len"] == len(body)
        assert r.h2.started == 3
        assert guard.shed_counts.counts == {
            ("h2", "low_priority", "low"): 1,
            ("h2", "queue_full", "normal"): 1,
        }
        hung[1].cancel()
        async with asyncio.timeout(10):
            while gate.in_flight:
                await asyncio.sleep(0.005)
        assert (gate.admitted, gate.queued_total) == (3, 1)


async def test_a_relayed_request_waiting_past_the_timeout_is_shed_and_heavy_degrades() -> None:
    async with rig() as r, h1_client(r.base) as hang1, h1_client(r.base) as hang2, \
            h1_client(r.base) as client:  # fmt: skip
        guard = protect(r.proxy, queue_timeout_ms=20, shed_status=503, light_at=0.5, heavy_at=0.5)
        calm = await client.get("/echo", headers=H2 | {"x-canary-degrade": "1"})
        assert ("x-canary-degrade", "1") not in [tuple(f) for f in calm.json()["fields"]]
        hung = asyncio.create_task(hang1.get("/hang", headers=H2))
        await r.h2.wait_started(2)
        pressed = await client.get("/echo", headers=H2)  # 1 of 2 in flight: heavy
        assert ("x-canary-degrade", "1") in [tuple(f) for f in pressed.json()["fields"]]

        hung2 = asyncio.create_task(hang2.get("/hang", headers=H2))
        await r.h2.wait_started(4)
        late = await client.post("/echo", content=b"y" * 1000, headers=H2)
        assert late.status_code == 503 and "queue_timeout" in late.json()["detail"]
        assert r.h2.started == 4
        assert guard.shed_counts.counts == {("h2", "queue_timeout", "normal"): 1}
        for task in (hung, hung2):
            task.cancel()
