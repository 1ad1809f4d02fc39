"""Requests and responses pass through the proxy as they came, tagged and with the
hop-by-hop headers gone."""

from __future__ import annotations

import asyncio
import re
import zlib
from collections.abc import AsyncIterator

import pytest
from prometheus_client.registry import CollectorRegistry

from sidecar.choice import Upstream
from sidecar.proxy import ProxyMetricsCollector
from sidecar.proxy import server as proxy_server
from sidecar.proxy.upstream import MAX_RESPONSE_HEAD
from tests.sidecar.proxy_harness import EXPERIMENT, harness


def _headers(echo: dict[str, object]) -> dict[str, str]:
    pairs = echo["headers"]
    assert isinstance(pairs, list)
    return {k.lower(): v for k, v in pairs}


async def test_passes_method_path_query_headers_and_status() -> None:
    async with harness() as h:
        response = await h.client.request(
            "PATCH",
            "/status/201?b=2&a=1&a=%20x",
            headers={"X-Custom": "Value-1", "Accept": "text/plain"},
            content=b"hello",
        )
        assert response.status_code == 201
        assert response.reason_phrase == "Whatever"
        echo = response.json()
        assert echo["method"] == "PATCH"
        assert echo["target"] == "/status/201?b=2&a=1&a=%20x"
        assert echo["body_len"] == 5
        seen = _headers(echo)
        assert seen["x-custom"] == "Value-1"
        assert seen["accept"] == "text/plain"
        assert seen["content-length"] == "5"
        assert seen["host"] == f"127.0.0.1:{h.baseline.port}"
        assert response.headers["x-upstream"] == "baseline"
        assert response.headers["content-type"] == "application/json"


async def test_drops_hop_by_hop_headers_and_adds_forwarded_ones() -> None:
    async with harness() as h:
        response = await h.client.get(
            "/echo",
            headers={
                "Connection": "keep-alive, X-Named-Hop",
                "X-Named-Hop": "secret",
                "Keep-Alive": "timeout=5",
                "Proxy-Authorization": "Basic Zm9vOmJhcg==",
                "TE": "trailers",
                "Upgrade": "h2c",
                "X-Forwarded-For": "10.0.0.1",
                "X-Forwarded-Proto": "gopher",
            },
        )
        assert response.status_code == 200
        seen = _headers(response.json())
        for hop in ("connection", "x-named-hop", "keep-alive", "proxy-authorization", "te"):
            assert hop not in seen, hop
        assert "upgrade" not in seen
        assert seen["x-forwarded-for"] == "10.0.0.1, 127.0.0.1"
        assert seen["x-forwarded-proto"] == "http"
        # and on the way back: the upstream's Keep-Alive and the header its
        # Connection names are gone
        assert "keep-alive" not in response.headers
        assert "x-upstream-hop" not in response.headers
        assert response.headers["x-upstream"] == "baseline"


async def test_tags_the_variant_both_ways_and_leaves_traceparent_alone() -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with harness() as h:
        response = await h.client.get(
            "/echo",
            headers={
                "x-test-variant": "canary",
                "traceparent": traceparent,
                "X-Canary-Variant": "spoofed-by-client",
                "X-Canary-Experiment": "spoofed",
            },
        )
        echo = response.json()
        assert echo["upstream"] == "canary"
        seen = _headers(echo)
        assert seen["x-canary-variant"] == "canary"
        assert seen["x-canary-experiment"] == EXPERIMENT
        assert seen["traceparent"] == traceparent
        assert [k for k, _ in echo["headers"]].count("X-Canary-Variant") == 1
        assert response.headers.get_list("x-canary-variant") == ["canary"]


async def test_chooser_sees_lower_case_headers_first_value_and_joined_cookies() -> None:
    async with harness() as h:
        response = await h.client.get(
            "/echo",
            headers=[
                ("X-User-Id", "u-1"),
                ("X-User-Id", "u-2"),
                ("Cookie", "a=1"),
                ("Cookie", "b=2"),
            ],
        )
        assert response.status_code == 200
        seen = h.chooser.seen[-1]
        assert seen["x-user-id"] == "u-1"
        assert seen["cookie"] == "a=1; b=2"
        assert all(name == name.lower() for name in seen)


async def test_records_a_sample_per_response_after_it_went_out() -> None:
    async with harness() as h:
        await h.client.get("/status/503", headers={"x-test-variant": "canary", "x-user-id": "u"})
        await h.client.get("/echo")
        samples = await h.recorder.wait_for(2)
        assert [(s.variant, s.outcome) for s in samples] == [("canary", 503), ("baseline", 200)]
        assert samples[0].experiment == EXPERIMENT
        assert samples[0].unit_hash != 0 and samples[1].unit_hash == 0
        assert all(s.rt_us > 0 for s in samples)
        assert h.proxy.metrics.requests == {("canary", 503): 1, ("baseline", 200): 1}
        assert h.proxy.metrics.overhead_count == 2


async def test_reuses_upstream_connections_across_requests() -> None:
    async with harness() as h:
        for _ in range(20):
            assert (await h.client.get("/echo")).status_code == 200
        assert h.baseline.connections == 1
        assert h.proxy.metrics.upstream_connects == 1
        # concurrent requests open more, which are kept for later
        await asyncio.gather(*(h.client.get("/echo") for _ in range(5)))
        opened = h.baseline.connections
        for _ in range(5):
            await h.client.get("/echo")
        assert h.baseline.connections == opened


async def test_head_and_no_content_responses_keep_the_connections_usable() -> None:
    async with harness() as h:
        head = await h.client.head("/echo")
        assert head.status_code == 200
        assert int(head.headers["content-length"]) > 0
        assert head.content == b""
        empty = await h.client.get("/status/204")
        assert empty.status_code == 204 and empty.content == b""
        after = await h.client.get("/echo")
        assert after.json()["method"] == "GET"
        assert h.baseline.connections == 1


async def test_chunked_request_body_is_forwarded_chunked() -> None:
    async def pieces() -> AsyncIterator[bytes]:
        for part in (b"abc", b"defg", b"h" * 70_000):
            yield part

    async with harness() as h:
        response = await h.client.post("/upload", content=pieces())
        echo = response.json()
        assert echo["body_len"] == 3 + 4 + 70_000
        assert _headers(echo)["transfer-encoding"] == "chunked"


async def test_upstream_base_path_is_prepended() -> None:
    async with harness() as h:
        h.chooser.routes["canary"] = Upstream.parse(h.canary.url + "/status/")
        response = await h.client.get("/202?q=1", headers={"x-test-variant": "canary"})
        assert response.status_code == 202
        assert response.json()["target"] == "/status/202?q=1"


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with harness() as h:
        reader, writer = await asyncio.open_connection("127.0.0.1", h.proxy.port)
        try:
            writer.write(
                b"GET /status/201 HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /status/202 HTTP/1.1\r\nHost: x\r\nx-test-variant: canary\r\n\r\n"
                b"GET /status/203 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            data = await reader.read()  # the proxy closes after the third
        finally:
            writer.close()
            await writer.wait_closed()
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", data) == [b"201", b"202", b"203"]


async def test_http_1_0_client_gets_a_response_it_can_read() -> None:
    async with harness() as h:
        reader, writer = await asyncio.open_connection("127.0.0.1", h.proxy.port)
        try:
            writer.write(b"GET /download/1000 HTTP/1.0\r\nHost: x\r\n\r\n")
            data = await reader.read()
        finally:
            writer.close()
            await writer.wait_closed()
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert b"chunked" not in head.lower()
        assert body == b"x" * 1000


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8080", Upstream("http", "127.0.0.1", 8080, "")),
        ("https://api.example.com/v1/", Upstream("https", "api.example.com", 443, "/v1")),
        ("HTTP://[::1]:81/a/b", Upstream("http", "::1", 81, "/a/b")),
    ],
)
def test_upstream_parse(url: str, expected: Upstream) -> None:
    assert Upstream.parse(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "ftp://x",
        "http://",
        "http://h:99999",
        "http://h/?q=1",
        "http://u:p@h",
        "nonsense",
        "http://a..b",
    ],
)
def test_upstream_parse_rejects(url: str) -> None:
    with pytest.raises(ValueError, match="upstream URL"):
        Upstream.parse(url)


@pytest.mark.parametrize("timer", [True, False], ids=["timer", "count-and-stop"])
async def test_every_request_is_recorded_exactly_once(
    timer: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 300  # a full bulk of SAMPLE_FLUSH_COUNT (256) and a remainder
    if not timer:  # only full bulks go before stop(), which hands over the rest
        monkeypatch.setattr(proxy_server, "SAMPLE_FLUSH_DELAY", 3600.0)
    async with harness() as h:

        async def one(i: int) -> tuple[int, str, int]:
            variant = "canary" if i % 3 == 0 else "baseline"
            response = await h.client.get(
                f"/status/{200 + i % 5}",
                headers={"x-test-variant": variant, "x-user-id": f"user-{i}"},
            )
            assert response.status_code == 200 + i % 5
            return zlib.crc32(f"user-{i}".encode()), variant, 200 + i % 5

        expected = await asyncio.gather(*(one(i) for i in range(n)))
        if timer:
            await h.recorder.wait_for(n)
        else:
            full = n - n % proxy_server.SAMPLE_FLUSH_COUNT
            await h.recorder.wait_for(full)
            assert len(h.recorder.samples) == full
        await h.proxy.stop(timeout=2)  # flushes whatever could still be waiting
        recorded = h.recorder.samples
        assert sorted((s.unit_hash, s.variant, s.outcome) for s in recorded) == sorted(expected)
        assert {s.experiment for s in recorded} == {EXPERIMENT}


async def test_a_scrape_and_stop_hand_over_the_samples_still_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(proxy_server, "SAMPLE_FLUSH_DELAY", 3600.0)  # no timer flush here
    async with harness() as h:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(
            ProxyMetricsCollector(h.proxy.metrics, before_collect=h.proxy.flush_samples)
        )
        response = await h.client.get("/echo", headers={"x-test-variant": "canary"})
        assert response.status_code == 200
        assert h.recorder.samples == []  # finished, waiting for a flush
        labels = {"variant": "canary", "status": "200"}
        assert registry.get_sample_value("canary_sidecar_requests_total", labels) == 1
        assert [(s.variant, s.outcome) for s in h.recorder.samples] == [("canary", 200)]

        assert (await h.client.get("/status/404")).status_code == 404
        assert len(h.recorder.samples) == 1
        await h.proxy.stop(timeout=2)
        outcomes = [(s.variant, s.outcome) for s in h.recorder.samples]
        assert outcomes == [("canary", 200), ("baseline", 404)]


async def _one_response_upstream(head_bytes: int) -> asyncio.Server:
    """Answers any request with a head of about `head_bytes` (one big field)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            start = b"HTTP/1.1 200 OK\r\nX-Big: "
            end = b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
            writer.write(start + b"b" * (head_bytes - len(start) - len(end)) + end + b"ok")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the proxy gave up on this response
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.mark.parametrize(
    ("head_bytes", "status"),
    [
        (MAX_RESPONSE_HEAD - 1024, 200),
        (MAX_RESPONSE_HEAD + 1024, 502),
        (4 * MAX_RESPONSE_HEAD, 502),
    ],
)
async def test_a_response_head_over_the_limit_answers_502(head_bytes: int, status: int) -> None:
    big = await _one_response_upstream(head_bytes)
    try:
        async with harness() as h:
            port = big.sockets[0].getsockname()[1]
            h.chooser.routes["canary"] = Upstream.parse(f"http://127.0.0.1:{port}")
            # a raw client: httpx refuses heads this large itself
            reader, writer = await asyncio.open_connection("127.0.0.1", h.proxy.port)
            try:
                writer.write(
                    b"GET /big HTTP/1.1\r\nHost: x\r\nx-test-variant: canary\r\n"
                    b"Connection: close\r\n\r\n"
                )
                data = await reader.read()
            finally:
                writer.close()
                await writer.wait_closed()
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 %d " % status)
            if status == 200:
                assert body == b"ok"
                assert len(head) > MAX_RESPONSE_HEAD - 1100  # the big field went through
            else:
                assert b"application/problem+json" in head
                assert b"canary" in body
            [sample] = await h.recorder.wait_for(1)
            assert (sample.variant, sample.outcome) == ("canary", status)
    finally:
        big.close()
        await big.wait_closed()
