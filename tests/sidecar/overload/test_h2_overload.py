"""HTTP/2 streams through the same overload gate as HTTP/1.1 exchanges: a real HTTP/2
client (httpx, and raw `h2` frames for a reset) in front of the real proxy and an
upstream that holds `/slow` requests until told to answer.

The held requests go on one connection and the rest on another: httpx reads an HTTP/2
connection for one waiting request at a time, so an answer on a connection whose
reader waits for a held response would only be seen once that one comes."""

from __future__ import annotations

import asyncio

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx

from controlplane.kernel.codec import SHED
from tests.sidecar.overload.test_proxy_overload import LOW, arrived, protect, queued
from tests.sidecar.proxy_harness import harness


def h2_client(port: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        http1=False, http2=True, base_url=f"http://127.0.0.1:{port}", timeout=30
    )


async def test_streams_are_shed_with_429_queued_and_released_on_end() -> None:
    async with harness() as h, h2_client(h.proxy.port) as held, h2_client(h.proxy.port) as client:
        guard = protect(h.proxy, queue_size=2, queue_timeout_ms=30_000, light_shed_share=1.0)
        # two streams of one connection take both places
        served = [asyncio.create_task(held.get("/slow")) for _ in range(2)]
        await arrived(h.baseline.requests, 2)

        shed = await client.get("/slow", headers=LOW)  # at the limit: light, low is shed
        assert shed.http_version == "HTTP/2"
        assert shed.status_code == 429
        assert shed.headers["retry-after"] == "1"
        assert shed.headers["content-type"] == "application/problem+json"
        assert shed.headers["x-canary-variant"] == "baseline"
        assert shed.json()["status"] == 429 and "low_priority" in shed.json()["detail"]

        # a stream over the limit waits, its body held (unacknowledged) until admitted
        body = b"x" * 200_000  # beyond the initial window: flow control must move it
        waiting = asyncio.create_task(client.post("/echo", content=body))
        await queued(guard, 1)
        assert len(h.baseline.requests) == 2
        state = guard.state()["upstreams"][0]
        assert (state["in_flight"], state["queued"]) == (2, 1)

        h.baseline.release.set()
        answers = await asyncio.gather(*served)
        assert [r.status_code for r in answers] == [200, 200]
        echoed = await waiting
        assert echoed.status_code == 200 and echoed.json()["body_len"] == len(body)
        assert len(h.baseline.requests) == 3  # the shed stream never reached it

        h.proxy.flush_samples()
        samples = await h.recorder.wait_for(3)
        # shed: no sample, a tally (codec.SHED) of one request
        assert sorted(s.outcome for s in samples if s.outcome != SHED) == [200] * 3
        assert sum(s.rt_us for s in samples if s.outcome == SHED) == 1
        assert guard.shed_counts.counts == {("baseline", "low_priority", "low"): 1}
        assert h.proxy.metrics.requests[("baseline", 429)] == 1
        # every place was given back when its stream ended
        state = guard.state()["upstreams"][0]
        assert (state["in_flight"], state["queued"], state["admitted"]) == (0, 0, 3)


async def test_a_stream_waiting_past_the_queue_timeout_is_shed_with_503() -> None:
    async with harness() as h, h2_client(h.proxy.port) as held, h2_client(h.proxy.port) as client:
        guard = protect(
            h.proxy, queue_size=5, queue_timeout_ms=20, shed_status=503, retry_after_s=7
        )
        served = [asyncio.create_task(held.get("/slow")) for _ in range(2)]
        await arrived(h.baseline.requests, 2)
        late = await client.post("/echo", content=b"y" * 100_000)
        assert late.status_code == 503
        assert late.headers["retry-after"] == "7"
        assert "queue_timeout" in late.json()["detail"]
        h.baseline.release.set()
        assert [r.status_code for r in await asyncio.gather(*served)] == [200, 200]
        assert guard.shed_counts.counts == {("baseline", "queue_timeout", "normal"): 1}
        assert len(h.baseline.requests) == 2
        # the connection still serves, and its window was given back
        assert (await client.post("/echo", content=b"z" * 100_000)).json()["body_len"] == 100_000


async def test_heavy_overload_asks_the_upstream_to_degrade_and_a_client_cannot() -> None:
    async with harness() as h, h2_client(h.proxy.port) as held, h2_client(h.proxy.port) as client:
        protect(h.proxy, light_at=0.5, heavy_at=0.5, severe_at=5.0)
        calm = await client.get("/echo", headers={"x-canary-degrade": "1"})
        assert ["X-Canary-Degrade", "1"] not in calm.json()["headers"]
        holding = asyncio.create_task(held.get("/slow"))
        await arrived(h.baseline.requests, 2)
        pressed = await client.get("/echo")  # 1 of 2 in flight: heavy
        assert ["X-Canary-Degrade", "1"] in pressed.json()["headers"]
        h.baseline.release.set()
        assert (await holding).status_code == 200


async def test_a_stream_reset_while_it_waits_is_counted_as_abandoned() -> None:
    async with harness() as h, h2_client(h.proxy.port) as held:
        guard = protect(h.proxy, queue_size=5, queue_timeout_ms=30_000)
        served = [asyncio.create_task(held.get("/slow")) for _ in range(2)]
        await arrived(h.baseline.requests, 2)

        _, writer = await asyncio.open_connection("127.0.0.1", h.proxy.port)
        raw = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        raw.initiate_connection()
        sid = raw.get_next_available_stream_id()
        head = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"proxy"),
                (b":path", b"/echo")]  # fmt: skip
        raw.send_headers(sid, head)
        raw.send_data(sid, b"q" * 1000)
        writer.write(raw.data_to_send())
        await writer.drain()
        await queued(guard, 1)
        raw.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        writer.write(raw.data_to_send())
        await writer.drain()
        async with asyncio.timeout(10):
            while not guard.shed_counts.counts:
                await asyncio.sleep(0.005)
        assert guard.shed_counts.counts == {("baseline", "abandoned", "normal"): 1}
        assert guard.state()["upstreams"][0]["queued"] == 0
        writer.close()

        h.baseline.release.set()
        await asyncio.gather(*served)
        assert len(h.baseline.requests) == 2
        assert guard.state()["upstreams"][0]["in_flight"] == 0
