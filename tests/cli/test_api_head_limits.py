"""`canary serve` bounds request heads before authentication: their bytes at the
parser, their field count before any route. A real server process, raw sockets."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import httpx
import pytest

from controlplane.cli.server import MAX_HEAD_BYTES
from controlplane.db import migrate
from tests.cli.conftest import free_port
from tests.support.auth import install_test_tokens

BIG = 1024 * 1024


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """(port, pid) of a `canary serve` process."""
    database_url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'canary.db'}"
    migrate.upgrade(database_url)
    install_test_tokens(database_url)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "serve", "--listen", f"127.0.0.1:{port}",
         "--database-url", database_url, "--etcd", "memory://", "--redis", "memory://"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[0].decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "canary serve did not start"
            time.sleep(0.1)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def read_answer(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (5 s at most)."""
    sock.settimeout(5)
    answer = b""
    with suppress(ConnectionResetError, TimeoutError):  # a server that waits for more
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_huge_header_is_refused_before_it_is_all_sent(api: tuple[int, int]) -> None:
    port, _ = api
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /v1/experiments HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        # 64 KiB of a header meant to be 1 MiB: the rest is never sent, and the server
        # answers anyway, so it cannot have waited for the whole head
        sock.sendall(b"a" * (4 * MAX_HEAD_BYTES))
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"connection: close" in answer.lower()


def test_a_1_mib_header_does_not_grow_the_server_by_its_size(api: tuple[int, int]) -> None:
    port, pid = api
    before = peak_rss_kib(pid)
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            head = b"GET /v1/experiments HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
            # the server may close while the header is still being sent
            with suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(head + b"a" * BIG + b"\r\n\r\n")
            answer = read_answer(sock)
        assert not answer or answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert peak_rss_kib(pid) - before < BIG // 1024 // 2


def test_too_many_header_fields_get_431_and_a_normal_request_is_served(
    api: tuple[int, int],
) -> None:
    port, _ = api
    url = f"http://127.0.0.1:{port}"
    many = {f"x-f{i}": "v" for i in range(150)}
    refused = httpx.get(f"{url}/healthz", headers=many)
    assert refused.status_code == 431
    assert refused.headers["content-type"] == "application/problem+json"
    assert "more than 100 header fields" in refused.json()["detail"]
    served = httpx.get(f"{url}/healthz", headers={f"x-f{i}": "v" for i in range(50)})
    assert served.status_code == 200
    assert httpx.get(f"{url}/v1/experiments").status_code == 401  # as before: no token
