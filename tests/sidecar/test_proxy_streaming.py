"""Bodies stream through the proxy in both directions with flow control: a 100 MB
body is never held whole, the far side starts receiving before the near side is done."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import AsyncIterator

from tests.sidecar.proxy_harness import harness

MB = 1024 * 1024
BIG = 100 * MB
PIECE = b"u" * (256 * 1024)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def test_a_100_mb_upload_streams_to_the_upstream() -> None:
    async with harness() as h:
        started_early = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal started_early
            sent = 0
            while sent < BIG:
                yield PIECE
                sent += len(PIECE)
                if sent == 4 * MB:
                    # the rest is sent only once the upstream has bytes in hand: a proxy
                    # that buffered the whole body would never get here
                    async with asyncio.timeout(10):
                        await h.baseline.upload_started.wait()
                    started_early = True

        before = _peak_rss_mb()
        response = await h.client.post(
            "/upload", content=body(), headers={"content-length": str(BIG)}
        )
        assert response.status_code == 200
        assert response.json()["body_len"] == BIG
        assert started_early
        assert _peak_rss_mb() - before < 50


async def test_a_100_mb_chunked_upload_streams_too() -> None:
    async with harness() as h:

        async def body() -> AsyncIterator[bytes]:
            for index in range(BIG // len(PIECE)):
                yield PIECE
                if index == 8:
                    async with asyncio.timeout(10):
                        await h.canary.upload_started.wait()

        response = await h.client.post(
            "/upload", content=body(), headers={"x-test-variant": "canary"}
        )
        assert response.json()["body_len"] == BIG


async def test_a_100_mb_download_streams_to_the_client() -> None:
    async with harness() as h:
        before = _peak_rss_mb()
        received = 0
        async with h.client.stream("GET", f"/download/{BIG}") as response:
            assert response.status_code == 200
            assert response.headers["transfer-encoding"] == "chunked"
            async for chunk in response.aiter_raw():
                if received == 0:
                    # the client has its first bytes while the upstream is far from done
                    assert h.baseline.download_sent < BIG // 2
                received += len(chunk)
        assert received == BIG
        assert _peak_rss_mb() - before < 50


async def test_a_download_with_content_length_keeps_its_length() -> None:
    async with harness() as h:
        size = 10 * MB + 7
        response = await h.client.get(f"/download/{size}?length=1")
        assert response.headers["content-length"] == str(size)
        assert "transfer-encoding" not in response.headers
        assert len(response.content) == size
        # the connection went back to the pool and serves the next request
        assert (await h.client.get("/echo")).status_code == 200
        assert h.baseline.connections == 1


async def test_a_slow_reader_pauses_the_upstream() -> None:
    async with harness() as h:
        async with h.client.stream("GET", f"/download/{BIG}") as response:
            stream = response.aiter_raw()
            await anext(stream)
            # stop reading; the upstream must stall after a few buffers' worth
            for _ in range(200):
                await asyncio.sleep(0)
            stalled_at = h.baseline.download_sent
            for _ in range(200):
                await asyncio.sleep(0)
            assert h.baseline.download_sent == stalled_at
            assert stalled_at < 32 * MB
            total = 0
            async for chunk in stream:
                total += len(chunk)
        assert h.baseline.download_sent == BIG


async def test_a_body_ended_by_close_reaches_the_client_chunked() -> None:
    async with harness() as h:
        response = await h.client.get("/until-close/300000")
        assert response.status_code == 200
        assert response.headers["transfer-encoding"] == "chunked"
        assert response.content == b"c" * 300_000
        [sample] = await h.recorder.wait_for(1)
        assert sample.outcome == 200
        # the client connection stays open for the next request
        assert (await h.client.get("/echo")).status_code == 200
