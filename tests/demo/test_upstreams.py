"""The demo upstreams: latency and error profiles, switchable while serving."""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
from statistics import NormalDist

import pytest

from controlplane.demo.load import read_response
from controlplane.demo.scenarios import THRESHOLD_MS
from controlplane.demo.upstreams import LatencyProfile, UpstreamServer


def test_delays_follow_the_lognormal_profile() -> None:
    profile = LatencyProfile(median_ms=40, sigma=0.35)
    rng = random.Random(7)
    delays = sorted(profile.delay_ms(rng) for _ in range(20_000))
    assert statistics.median(delays) == pytest.approx(40, rel=0.03)
    p95 = delays[int(0.95 * len(delays))]
    assert p95 == pytest.approx(profile.quantile_ms(0.95), rel=0.05)
    profile.degrade(5)
    assert profile.quantile_ms(0.95) == pytest.approx(5 * 40 * math.exp(0.35 * 1.6449), rel=1e-3)
    assert statistics.median(profile.delay_ms(rng) for _ in range(5_000)) == pytest.approx(
        200, rel=0.05
    )
    profile.restore()
    assert profile.factor == 1.0


def test_default_profile_meets_the_demo_rule_until_it_degrades() -> None:
    profile = LatencyProfile()
    # healthy: P95 far below the threshold, so a short stall of the host does not trip it
    assert profile.quantile_ms(0.95) < THRESHOLD_MS / 3
    profile.degrade(5)
    # degraded: far more than the 5 % a P95 rule allows lie above the threshold
    above = 1 - NormalDist().cdf(math.log(THRESHOLD_MS / (5 * profile.median_ms)) / profile.sigma)
    assert above > 0.15
    assert profile.quantile_ms(0.95) > THRESHOLD_MS


def test_error_rate() -> None:
    profile = LatencyProfile(error_rate=0.1)
    rng = random.Random(3)
    failures = sum(profile.fails(rng) for _ in range(20_000))
    assert failures / 20_000 == pytest.approx(0.1, abs=0.01)
    assert not any(LatencyProfile(error_rate=0).fails(rng) for _ in range(1_000))


@pytest.mark.parametrize(
    "kwargs", [{"median_ms": 0}, {"sigma": -1}, {"factor": 0}, {"error_rate": 1.5}]
)
def test_invalid_profiles_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LatencyProfile(**kwargs)


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[float, int]:
    started = time.monotonic()
    writer.write(b"GET /x HTTP/1.1\r\nHost: t\r\nx-user-id: u1\r\n\r\n")
    await writer.drain()
    response = await read_response(reader)
    return time.monotonic() - started, response.status


async def test_server_keeps_alive_and_switches_latency_at_runtime() -> None:
    server = UpstreamServer("v9", LatencyProfile(median_ms=30, sigma=0, error_rate=0), seed=1)
    await server.start()
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        fast, status = await _get(reader, writer)
        assert status == 200 and 0.025 < fast < 0.2
        server.profile.degrade(5)
        slow, status = await _get(reader, writer)  # the same connection: kept alive
        assert status == 200 and 0.14 < slow < 0.5
        assert server.stats.requests == 2 and server.stats.connections == 1
    finally:
        writer.close()
        await writer.wait_closed()
        await server.close()


async def test_server_errors_are_plain_text_500s() -> None:
    server = UpstreamServer("v9", LatencyProfile(median_ms=1, sigma=0, error_rate=1))
    await server.start()
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc")
        await writer.drain()
        response = await read_response(reader)
        assert response.status == 500
        assert response.content_type == "text/plain"
        assert server.stats.errors == 1
    finally:
        writer.close()
        await writer.wait_closed()
        await server.close()


async def test_server_answers_with_its_version() -> None:
    server = UpstreamServer("shop v2", LatencyProfile(median_ms=1, sigma=0, error_rate=0))
    await server.start()
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        body = await reader.read()
        assert b"Connection: close" in head
        assert json.loads(body) == {"version": "shop v2"}
    finally:
        writer.close()
        await writer.wait_closed()
        await server.close()
