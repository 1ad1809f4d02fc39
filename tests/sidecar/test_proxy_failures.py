"""Upstream failures answer 502/504 with a problem+json body naming the variant, and
each counts as a failure sample."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, TIMEOUT
from sidecar.proxy import ProxyOptions
from tests.sidecar.proxy_harness import EXPERIMENT, harness
from tests.support.processes import free_port


async def test_upstream_down_answers_502_naming_the_variant() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with harness() as h:
        h.chooser.routes["canary"] = type(h.chooser.routes["canary"]).parse(dead)
        response = await h.client.get("/echo", headers={"x-test-variant": "canary"})
        assert response.status_code == 502
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["x-canary-variant"] == "canary"
        problem = response.json()
        assert problem["status"] == 502
        assert problem["variant"] == "canary"
        assert problem["experiment"] == EXPERIMENT
        assert "canary" in problem["detail"] and "connect" in problem["detail"]
        [sample] = await h.recorder.wait_for(1)
        assert (sample.variant, sample.outcome) == ("canary", CONNECT_ERROR)
        # the connection to the client is still good
        assert (await h.client.get("/echo")).status_code == 200


async def test_slow_upstream_answers_504_and_records_a_timeout() -> None:
    async with harness(options=ProxyOptions(read_timeout=0.2)) as h:
        response = await h.client.get("/slow", headers={"x-test-variant": "canary"})
        assert response.status_code == 504
        problem = response.json()
        assert problem["variant"] == "canary"
        assert "timed out" in problem["detail"]
        [sample] = await h.recorder.wait_for(1)
        assert (sample.variant, sample.outcome) == ("canary", TIMEOUT)
        assert sample.rt_us >= 200_000


async def test_no_route_answers_503_with_a_clear_body() -> None:
    async with harness(routes={}) as h:
        response = await h.client.post("/anything", content=b"x" * 10)
        assert response.status_code == 503
        assert response.headers["content-type"] == "application/problem+json"
        assert "no route" in response.json()["detail"]
        assert (await h.client.get("/again")).status_code == 503
        assert h.recorder.samples == []


async def test_stale_pooled_connection_is_retried_once_for_an_idempotent_request() -> None:
    async with harness() as h:
        assert (await h.client.get("/echo")).status_code == 200
        h.baseline.close_next = 1  # the pooled connection dies under the next request
        response = await h.client.get("/echo")
        assert response.status_code == 200
        assert h.proxy.metrics.upstream_retries == 1
        assert h.baseline.connections == 2


async def test_a_request_with_a_body_is_not_replayed() -> None:
    async with harness() as h:
        assert (await h.client.get("/echo")).status_code == 200
        h.baseline.close_next = 1
        response = await h.client.put("/echo", content=b"payload")
        assert response.status_code == 502
        assert h.proxy.metrics.upstream_retries == 0
        [_, sample] = await h.recorder.wait_for(2)
        assert sample.outcome == 502


async def test_a_retry_is_made_only_once() -> None:
    async with harness() as h:
        assert (await h.client.get("/echo")).status_code == 200
        response = await h.client.get("/close")  # closes every connection it gets
        assert response.status_code == 502
        assert h.proxy.metrics.upstream_retries == 1
        assert h.baseline.connections == 2


async def test_upstream_dying_mid_response_cuts_the_client() -> None:
    async with harness() as h:
        async with h.client.stream("GET", "/download/50000000") as response:
            assert response.status_code == 200
            stream = response.aiter_raw()
            await anext(stream)
            await h.baseline.stop()
            with pytest.raises(httpx.RemoteProtocolError):
                async for _ in stream:
                    pass
        [sample] = await h.recorder.wait_for(1)
        assert sample.outcome == 502


async def test_client_leaving_before_the_answer_is_recorded_as_aborted() -> None:
    async with harness() as h:
        _, writer = await asyncio.open_connection("127.0.0.1", h.proxy.port)
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\nx-test-variant: canary\r\n\r\n")
        await writer.drain()
        await h.canary.arrived.wait()
        writer.close()
        await writer.wait_closed()
        [sample] = await h.recorder.wait_for(1)
        assert (sample.variant, sample.outcome) == ("canary", ABORTED)


async def test_malformed_request_answers_400_and_closes() -> None:
    async with harness() as h:
        reader, writer = await asyncio.open_connection("127.0.0.1", h.proxy.port)
        try:
            writer.write(b"GET / HTTP/1.1\r\nBad Header Line\r\n\r\n")
            data = await reader.read()
        finally:
            writer.close()
            await writer.wait_closed()
        assert data.startswith(b"HTTP/1.1 400 ")
        assert b"application/problem+json" in data


async def test_stop_lets_in_flight_requests_finish() -> None:
    async with harness() as h:
        pending = asyncio.create_task(h.client.get("/slow"))
        await h.baseline.arrived.wait()
        stopping = asyncio.create_task(h.proxy.stop(timeout=5))
        for _ in range(20):  # let stop() get as far as it can without the response
            await asyncio.sleep(0)
        assert h.proxy.draining and not stopping.done()
        h.baseline.release.set()
        response = await pending
        await stopping
        assert response.status_code == 200
        assert response.headers["connection"] == "close"


async def test_an_oversized_request_head_answers_431() -> None:
    async with harness(options=ProxyOptions(max_head_bytes=4096)) as h:
        response = await h.client.get("/echo", headers={"x-big": "b" * 5000})
        assert response.status_code == 431
        assert response.headers["content-type"] == "application/problem+json"
        assert h.baseline.requests == []
        assert (await h.client.get("/echo")).status_code == 200  # on a new connection


async def test_stop_waits_even_after_the_proxy_was_once_without_clients() -> None:
    async with harness() as h:
        await h.client.get("/echo")
        await h.client.aclose()  # no client connection left for a moment
        async with httpx.AsyncClient(base_url=h.url) as again:
            h.baseline.arrived.clear()
            pending = asyncio.create_task(again.get("/slow"))
            await h.baseline.arrived.wait()
            stopping = asyncio.create_task(h.proxy.stop(timeout=5))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not stopping.done()
            h.baseline.release.set()
            assert (await pending).status_code == 200
            await stopping
