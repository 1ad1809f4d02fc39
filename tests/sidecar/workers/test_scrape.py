"""Reading a worker's admin answer: anything malformed is a ScrapeError."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.registry import CollectorRegistry

from sidecar.admin import AdminServer
from sidecar.workers.scrape import ScrapeError, get, parse_response


def test_a_well_formed_answer_gives_status_and_body() -> None:
    data = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 3\r\n\r\nno\n"
    assert parse_response(data) == (503, b"no\n")


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n",  # head never ends
        b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\nbody without a length",
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
    ],
)
def test_a_malformed_answer_is_refused(data: bytes) -> None:
    with pytest.raises(ScrapeError):
        parse_response(data)


def test_a_body_over_the_bound_is_refused() -> None:
    with pytest.raises(ScrapeError):
        parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", max_bytes=4)


async def test_a_real_admin_server_on_a_unix_socket_answers(tmp_path: Path) -> None:
    path = str(tmp_path / "w.sock")
    admin = AdminServer(registry=CollectorRegistry(), ready=lambda: False)
    await admin.start_unix(path)
    try:
        assert await get(path, "/healthz", timeout=2) == (200, b"ok\n")
        status, _ = await get(path, "/readyz", timeout=2)
        assert status == 503
    finally:
        await admin.stop()


async def test_nobody_listening_is_a_scrape_error(tmp_path: Path) -> None:
    with pytest.raises(ScrapeError):
        await get(str(tmp_path / "absent.sock"), "/metrics", timeout=1)


async def test_a_silent_worker_is_a_scrape_error_after_the_timeout(tmp_path: Path) -> None:
    path = str(tmp_path / "silent.sock")
    accepted = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # never answers; the client gives up and closes
        writer.close()

    server = await asyncio.start_unix_server(silent, path)
    try:
        with pytest.raises(ScrapeError, match="no answer"):
            await get(path, "/metrics", timeout=0.2)
        assert accepted.is_set()
    finally:
        server.close()
        await server.wait_closed()
