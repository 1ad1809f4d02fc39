"""WebSocket through the proxy: real `websockets` servers as the two variants, real
`websockets` clients, the sidecar's own route table choosing sticky by user.

An upgrade is assigned a variant like any request, forwarded with its Upgrade, and
after the 101 both connections are one byte tunnel: echo both ways, large messages,
close handshakes, the idle cut, backpressure on a slow reader, the tunnel cap,
shutdown. One sample per upgrade, recorded at the 101.
"""

from __future__ import annotations

import asyncio
import random
import ssl

import pytest
import trustme
from prometheus_client import CollectorRegistry, generate_latest
from websockets.asyncio.client import ClientConnection as WsClient
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from sidecar.proxy import ProxyMetricsCollector, ProxyOptions
from sidecar.proxy.tunnel import CLOSED, IDLE, SHUTDOWN
from tests.sidecar.ws_harness import BIG, setup, user_for
from tests.support.outage import until


async def test_each_user_keeps_its_variant_and_echo_works_both_ways() -> None:
    async with setup() as s:
        for variant in ("baseline", "canary"):
            user = user_for(variant)
            for _ in range(2):  # the same user twice: the same variant
                async with s.connect(user) as ws:
                    assert ws.response is not None
                    assert ws.response.headers["x-canary-variant"] == variant
                    assert await ws.recv() == f"hello from {variant}"
                    await ws.send("text ünïcode")
                    assert await ws.recv() == "text ünïcode"
                    await ws.send(b"\x00\x01binary")
                    assert await ws.recv() == b"\x00\x01binary"
        samples = await s.recorder.wait_for(4)
        assert [x.variant for x in samples] == ["baseline"] * 2 + ["canary"] * 2
        assert {x.outcome for x in samples} == {101}
        assert {x.experiment for x in samples} == {"ws-1"}
        assert s.proxy.metrics.requests == {("baseline", 101): 2, ("canary", 101): 2}


async def test_the_sample_is_the_time_to_the_101_recorded_while_the_tunnel_is_open() -> None:
    async with setup() as s, s.connect(user_for("canary")) as ws:
        assert await ws.recv() == "hello from canary"
        # the tunnel is open and idle: its one sample is in already
        (sample,) = await s.recorder.wait_for(1)
        assert (sample.variant, sample.outcome) == ("canary", 101)
        assert sample.rt_us > 0
        assert s.proxy.metrics.tunnels_open == 1


async def test_large_messages_cross_both_ways() -> None:
    async with setup() as s, s.connect(user_for("baseline")) as ws:
        await ws.recv()
        message = random.Random(7).randbytes(BIG)  # incompressible: BIG bytes travel
        await ws.send(message)
        assert await ws.recv() == message
        metrics = s.proxy.metrics
        assert metrics.tunnel_bytes_upstream > BIG
        assert metrics.tunnel_bytes_downstream > BIG


async def test_close_handshakes_from_either_side_reach_the_other() -> None:
    async with setup() as s:
        async with s.connect(user_for("baseline")) as ws:
            await ws.recv()
        assert ws.close_code == 1000
        async with s.connect(user_for("baseline")) as ws:
            await ws.recv()
            await ws.close(4000, "client says bye")
        async with s.connect(user_for("canary")) as ws:
            await ws.recv()
            await ws.send("close-from-server")
            with pytest.raises(ConnectionClosed):
                await ws.recv()
        assert (ws.close_code, ws.close_reason) == (4001, "server says bye")
        await until(lambda: s.proxy.metrics.tunnels_open == 0, "the tunnels ended")
        assert s.baseline.closes == [(1000, ""), (4000, "client says bye")]
        assert s.canary.closes == [(4001, "server says bye")]
        metrics = s.proxy.metrics
        assert metrics.tunnels_closed == {CLOSED: 3}
        assert sum(metrics.tunnel_lifetime_counts) == 3
        assert metrics.connections == 0  # the client connections are released with them


async def test_an_idle_tunnel_is_cut() -> None:
    async with setup(ProxyOptions(read_timeout=10, tunnel_idle_timeout=0.2)) as s:
        async with s.connect(user_for("baseline")) as ws:
            await ws.recv()
            async with asyncio.timeout(10):  # an upper bound, not a speed claim
                await ws.wait_closed()
        assert ws.close_code == 1006  # cut, no close handshake
        await until(lambda: s.proxy.metrics.tunnels_closed == {IDLE: 1}, "counted as idle")


async def test_a_slow_reader_pauses_the_upstream_instead_of_growing_buffers() -> None:
    flood = 64 * 1024 * 1024
    options = ProxyOptions(read_timeout=10, tunnel_buffer_bytes=64 * 1024)
    async with setup(options) as s:
        s.baseline.flood = flood
        async with s.connect(user_for("baseline"), max_queue=1) as ws:
            # the client reads nothing: its socket fills, then the proxy's buffer
            await until(lambda: len(s.proxy.tunnels) == 1, "the tunnel opened")
            (tunnel,) = s.proxy.tunnels
            await until(lambda: tunnel.paused[1], "reading from the upstream paused")
            buffered = tunnel.client_end.transport.get_write_buffer_size()
            # at most the high-water mark and one read of the upstream beyond it
            assert buffered <= 64 * 1024 + 256 * 1024
            assert s.baseline.flood_sent < flood  # the upstream is held back too
            assert await ws.recv() == "hello from baseline"
            received = 0
            while received < flood:
                received += len(await ws.recv())
            assert received == flood
            assert not tunnel.paused[1]


async def test_the_tunnel_cap_answers_503_beyond_it() -> None:
    async with setup(ProxyOptions(read_timeout=10, max_tunnels=1)) as s:
        async with s.connect(user_for("baseline")) as ws:
            await ws.recv()
            with pytest.raises(InvalidStatus) as refused:
                async with s.connect(user_for("canary")):
                    pass
            assert refused.value.response.status_code == 503
            assert s.proxy.metrics.tunnels_refused == 1
        # the place is free again once the first tunnel ends
        await until(lambda: s.proxy.metrics.tunnels_open == 0, "the first tunnel ended")
        async with s.connect(user_for("canary")) as ws:
            assert await ws.recv() == "hello from canary"


async def test_tunnels_still_open_at_the_shutdown_deadline_are_cut() -> None:
    async with setup() as s:
        ws: WsClient
        async with s.connect(user_for("canary")) as ws:
            await ws.recv()
            await s.proxy.stop(timeout=0.1)
            async with asyncio.timeout(10):
                await ws.wait_closed()
        assert s.proxy.metrics.tunnels_closed == {SHUTDOWN: 1}
        assert s.proxy.metrics.tunnels_open == 0


async def test_tunnel_metrics_are_exported() -> None:
    async with setup() as s:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(
            ProxyMetricsCollector(s.proxy.metrics, before_collect=s.proxy.flush_samples)
        )
        async with s.connect(user_for("baseline")) as ws:
            await ws.recv()
            await ws.send("x" * 1000)
            await ws.recv()
            text = generate_latest(registry).decode()
            assert "canary_sidecar_tunnels_open 1.0" in text
            assert "canary_sidecar_tunnels_total 1.0" in text
            assert 'canary_sidecar_requests_total{status="101",variant="baseline"} 1.0' in text
        await until(lambda: s.proxy.metrics.tunnels_open == 0, "the tunnel ended")
        text = generate_latest(registry).decode()
        assert "canary_sidecar_tunnels_open 0.0" in text
        assert 'canary_sidecar_tunnels_closed_total{reason="closed"} 1.0' in text
        assert "canary_sidecar_tunnel_lifetime_seconds_count 1.0" in text
        up = s.proxy.metrics.tunnel_bytes_upstream
        assert up > 1000
        assert f'canary_sidecar_tunnel_bytes_total{{direction="upstream"}} {float(up)}' in text


async def test_wss_through_a_tls_listener() -> None:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    async with setup(ProxyOptions(read_timeout=10, listen_tls=server_tls)) as s:
        async with connect(
            f"wss://127.0.0.1:{s.proxy.port}/chat",
            ssl=client_tls,
            additional_headers={"x-user-id": user_for("canary")},
            proxy=None,
            compression=None,
        ) as ws:
            assert await ws.recv() == "hello from canary"
            await ws.send("over tls")
            assert await ws.recv() == "over tls"
        assert ws.close_code == 1000
        await until(lambda: s.proxy.metrics.tunnels_open == 0, "the tunnel ended")
