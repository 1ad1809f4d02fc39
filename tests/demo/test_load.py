"""The load generator: open-loop sending and who each failure is blamed on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter

import pytest

from controlplane.demo.load import Attribution, LoadGenerator, attribute


@pytest.mark.parametrize(
    ("status", "content_type", "expected"),
    [
        (None, None, Attribution.SIDECAR),  # no response at all
        (200, "application/json", Attribution.OK),
        (404, "application/problem+json", Attribution.OK),
        (500, "text/plain", Attribution.UPSTREAM),
        (503, None, Attribution.UPSTREAM),
        (502, "application/problem+json", Attribution.SIDECAR),
        (504, "Application/Problem+JSON; charset=utf-8", Attribution.SIDECAR),
    ],
)
def test_attribution(status: int | None, content_type: str | None, expected: Attribution) -> None:
    assert attribute(status, content_type) is expected


PROBLEM = b'{"title":"Bad Gateway","status":502}'
BEHAVIOURS = ("ok", "upstream", "proxy", "reset")


class FakeSidecar:
    """Answers in turn: 200, an upstream's 500, the proxy's own 502, and a connection
    dropped mid-answer; tags the 200s as the canary's."""

    def __init__(self) -> None:
        self.served: Counter[str] = Counter()
        self._n = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                behaviour = BEHAVIOURS[self._n % len(BEHAVIOURS)]
                self._n += 1
                self.served[behaviour] += 1
                if behaviour == "reset":
                    # a dropped connection mid-answer: a byte came, so no client
                    # may send the request again
                    writer.write(b"HTTP/1.1 2")
                    await writer.drain()
                    return
                if behaviour == "ok":
                    head = b"HTTP/1.1 200 OK\r\nX-Canary-Variant: canary\r\nContent-Length: 2\r\n"
                    writer.write(head + b"\r\n{}")
                elif behaviour == "upstream":
                    writer.write(
                        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
                        b"Content-Length: 3\r\n\r\nerr"
                    )
                else:
                    writer.write(
                        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/problem+json\r\n"
                        + f"Content-Length: {len(PROBLEM)}\r\n\r\n".encode()
                        + PROBLEM
                    )
                await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def test_failures_are_attributed_to_who_caused_them() -> None:
    fake = FakeSidecar()
    await fake.start()
    load = LoadGenerator("127.0.0.1", fake.port, rate=100, users=50, seed=1)
    try:
        load.start()
        await asyncio.sleep(1.0)
    finally:
        await load.stop()
        await fake.close()
    stats = load.stats
    assert stats.sent >= 80  # open loop: about rate x seconds
    assert stats.completed == stats.sent == sum(fake.served.values())
    assert stats.ok == fake.served["ok"]
    assert stats.upstream_failed == fake.served["upstream"]
    assert stats.sidecar_failed == fake.served["proxy"] + fake.served["reset"]
    assert stats.sidecar_reasons["HTTP 502"] == fake.served["proxy"]
    assert stats.by_variant == Counter({"canary": fake.served["ok"]})
    assert "canary" in load.last_sent_to


async def test_a_kept_alive_connection_closed_before_any_answer_is_retried_once() -> None:
    # a proxy that closes idle connections (a reload, an idle timeout) as a request
    # goes out: the request is sent again on a new connection, as browsers do
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # counted per connection: a retried request, on its new connection, is answered
        # however many requests other connections have in flight
        on_this_connection = 0
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                served.append(1)
                on_this_connection += 1
                if on_this_connection == 2:
                    break  # a kept-alive connection's second request: closed unanswered
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    load = LoadGenerator("127.0.0.1", port, rate=40, users=5, seed=3)
    try:
        load.start()
        await asyncio.sleep(0.5)
    finally:
        await load.stop()
        server.close()
        await server.wait_closed()
    stats = load.stats
    assert stats.sent > 5 and stats.stale_retries > 0
    assert stats.ok == stats.sent and stats.sidecar_failed == 0, stats


async def test_a_sidecar_that_does_not_answer_fails_every_request() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    load = LoadGenerator("127.0.0.1", port, rate=50, seed=2)
    load.start()
    await asyncio.sleep(0.3)
    await load.stop()
    assert load.stats.sent > 0
    assert load.stats.sidecar_failed == load.stats.sent
    assert load.stats.ok == load.stats.upstream_failed == 0


async def test_open_loop_keeps_its_rate_while_responses_are_slow() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await asyncio.sleep(0.5)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    load = LoadGenerator("127.0.0.1", port, rate=100, seed=3)
    try:
        load.start()
        await asyncio.sleep(1.0)
        # a closed loop would have sent a handful; open loop sends on schedule
        assert load.stats.sent >= 90
        assert load.in_flight >= 40
    finally:
        await load.stop()
        server.close()
        await server.wait_closed()
    assert load.stats.ok == load.stats.sent
