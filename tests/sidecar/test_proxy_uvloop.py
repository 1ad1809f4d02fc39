"""The proxy on uvloop, the loop a deployed sidecar runs on: its transports differ
from asyncio's (they are not `asyncio.Transport` subclasses, their buffers differ)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from controlplane.kernel.codec import CONNECT_ERROR
from tests.sidecar.proxy_harness import harness
from tests.sidecar.ws_harness import setup, user_for
from tests.support.outage import until
from tests.support.processes import free_port

uvloop = pytest.importorskip("uvloop")


async def _scenario() -> None:
    async with harness() as h:
        for _ in range(5):
            response = await h.client.get("/echo?x=1", headers={"x-test-variant": "canary"})
            assert response.status_code == 200
            assert response.headers["x-canary-variant"] == "canary"
        assert h.canary.connections == 1

        size = 20 * 1024 * 1024
        received = 0
        async with h.client.stream("GET", f"/download/{size}") as streamed:
            async for chunk in streamed.aiter_raw():
                received += len(chunk)
        assert received == size

        async def body() -> AsyncIterator[bytes]:
            for _ in range(80):
                yield b"z" * 256 * 1024

        uploaded = await h.client.post("/upload", content=body())
        assert uploaded.json()["body_len"] == size

        h.chooser.routes["canary"] = type(h.chooser.routes["canary"]).parse(
            f"http://127.0.0.1:{free_port()}"
        )
        # a sample is recorded after its response has gone out: wait for the seven
        # exchanges above (5 echoes, the download, the upload) before the next one
        await h.recorder.wait_for(7)
        failed = await h.client.get("/echo", headers={"x-test-variant": "canary"})
        assert failed.status_code == 502
        samples = await h.recorder.wait_for(8)
        assert [s.outcome for s in samples[7:]] == [CONNECT_ERROR]
        assert samples[7].variant == "canary"


def test_the_proxy_runs_on_uvloop() -> None:
    uvloop.run(asyncio.wait_for(_scenario(), 30))


async def _tunnel_scenario() -> None:
    async with setup() as s:
        for variant in ("baseline", "canary"):
            async with s.connect(user_for(variant)) as ws:
                assert await ws.recv() == f"hello from {variant}"
                message = b"\x01" * (2 * 1024 * 1024)
                await ws.send(message)
                assert await ws.recv() == message
        assert [x.outcome for x in await s.recorder.wait_for(2)] == [101, 101]
        await until(lambda: s.proxy.metrics.tunnels_open == 0, "the tunnels ended")
        assert s.proxy.metrics.tunnels_closed == {"closed": 2}


def test_websocket_tunnels_run_on_uvloop() -> None:
    uvloop.run(asyncio.wait_for(_tunnel_scenario(), 30))
