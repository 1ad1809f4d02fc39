"""Request hygiene: cross-site writes refused and nothing changed, foreign Host -> 400,
oversized bodies -> 413 before they are read (over a real socket)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from controlplane.api.app import create_app
from controlplane.auth.roles import Role
from controlplane.db import migrate
from controlplane.db.models import Event, Experiment
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends
from tests.api.conftest import API_BASE, experiment_body
from tests.cli.conftest import serving
from tests.support.auth import TOKENS, bearer, install_test_tokens


async def counts(backends: Backends) -> tuple[int, int]:
    def load(*, session: object) -> tuple[int, int]:
        from sqlalchemy.orm import Session

        assert isinstance(session, Session)
        return (
            int(session.scalar(select(func.count()).select_from(Experiment)) or 0),
            int(session.scalar(select(func.count()).select_from(Event)) or 0),
        )

    return await backends.database.read(load)


@pytest.fixture
async def insecure_client(settings: Settings, backends: Backends) -> httpx.AsyncClient:
    """The worst case for CSRF: an app without authentication (`serve --insecure`)."""
    app = create_app(settings, backends=backends, insecure=True)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=API_BASE) as http:
            yield http  # type: ignore[misc]


CROSS_SITE = [
    ("text/plain", "/v1/experiments", b'{"name": "x"}', {"Content-Type": "text/plain"}),
    ("form", "/v1/experiments", b"name=x", {"Content-Type": "application/x-www-form-urlencoded"}),
    ("multipart", "/v1/experiments/1/start", b"--b--",
     {"Content-Type": "multipart/form-data; boundary=b"}),
    ("no type, a body", "/v1/experiments", b"{}", {}),
    ("no type, no body, no token", "/v1/experiments/1/start", b"", {}),
    ("text/plain action", "/v1/experiments/1/abort", b"", {"Content-Type": "text/plain"}),
    ("cross-site fetch", "/v1/experiments/1/start", b"{}",
     {"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}),
]  # fmt: skip


@pytest.mark.parametrize(("label", "path", "body", "headers"), CROSS_SITE)
async def test_cross_site_style_writes_are_refused_and_change_nothing(
    insecure_client: httpx.AsyncClient,
    backends: Backends,
    label: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
) -> None:
    created = await insecure_client.post("/v1/experiments", json=experiment_body())
    assert created.status_code == 201
    before = await counts(backends)
    answer = await insecure_client.post(path, content=body, headers=headers)
    assert answer.status_code in (403, 415), label
    assert answer.headers["content-type"] == "application/problem+json"
    assert await counts(backends) == before
    state = (await insecure_client.get("/v1/experiments/1")).json()["state"]
    assert state == "draft"


async def test_a_bodyless_write_with_a_bearer_token_and_no_type_is_allowed(
    client: httpx.AsyncClient, create: object
) -> None:
    experiment = await create()  # type: ignore[operator]
    answer = await client.post(f"/v1/experiments/{experiment['id']}/start")
    assert answer.status_code == 200, answer.text
    refused = await client.post(
        f"/v1/experiments/{experiment['id']}/pause", content=b"x", headers=bearer(Role.ADMIN)
    )
    assert refused.status_code == 415


async def test_a_foreign_host_is_400_and_a_configured_one_is_answered(
    settings: Settings, backends: Backends
) -> None:
    for trusted, host, status in (
        ("", "evil.example", 400),
        ("", "localhost:8080", 200),
        ("", "[::1]:8080", 200),
        ("canary.example.com", "canary.example.com", 200),
        ("*.example.com", "api.example.com", 200),
        ("*.example.com", "example.com.evil.net", 400),
    ):
        app = create_app(settings.model_copy(update={"trusted_hosts": trusted}), backends=backends)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=API_BASE) as http:
            answer = await http.get("/healthz", headers={"Host": host})
            assert answer.status_code == status, (trusted, host)
            if status == 400:
                assert answer.headers["content-type"] == "application/problem+json"


LIMIT = 4096


@pytest.fixture
def small_limit_api(tmp_path: Path) -> Iterator[tuple[str, int]]:
    database_url = f"sqlite:///{tmp_path / 'canary.db'}"
    migrate.upgrade(database_url)
    install_test_tokens(database_url)
    settings = Settings(
        database_url=database_url, etcd="memory://", redis_url="memory://", max_body_bytes=LIMIT
    )
    with serving(create_app(settings)) as url:
        yield url, int(url.rsplit(":", 1)[1])


def head(path: str, port: int, extra: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKENS[Role.ADMIN]}\r\nContent-Type: application/json\r\n"
        f"{extra}\r\n"
    ).encode()


def status_of(sock: socket.socket) -> tuple[int, bytes]:
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_a_declared_100_mb_body_is_413_before_any_of_it_is_sent(
    small_limit_api: tuple[str, int],
) -> None:
    _, port = small_limit_api
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head("/v1/experiments", port, f"Content-Length: {100 * 1024 * 1024}\r\n"))
        status, data = status_of(sock)  # answered with no byte of the body sent
    assert status == 413 and b"application/problem+json" in data


def test_a_chunked_body_is_413_once_it_crosses_the_limit(
    small_limit_api: tuple[str, int],
) -> None:
    _, port = small_limit_api
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head("/v1/experiments", port, "Transfer-Encoding: chunked\r\n"))
        chunk = b"[" + b" " * 1022 + b"\n"
        for _ in range(LIMIT // len(chunk) + 1):  # just past the limit, then no more
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        status, data = status_of(sock)  # the body never ends: the answer came anyway
    assert status == 413 and b"application/problem+json" in data


def test_a_body_under_the_limit_is_served(small_limit_api: tuple[str, int]) -> None:
    url, _ = small_limit_api
    answer = httpx.post(f"{url}/v1/experiments", json=experiment_body(), headers=bearer())
    assert answer.status_code == 201, answer.text
    too_big = httpx.post(
        f"{url}/v1/experiments", json={**experiment_body(), "name": "x" * LIMIT}, headers=bearer()
    )
    assert too_big.status_code == 413
    metrics = httpx.get(f"{url}/metrics", headers=bearer(Role.VIEWER)).text
    assert 'canary_api_rejected_requests_total{reason="body_too_large"} 1.0' in metrics
