"""An API client over a migrated database, on both backend sets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from controlplane.api.app import create_app
from controlplane.controller.reconciler import RouteReconciler
from controlplane.db import migrate
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends, open_backends
from tests.support.auth import bearer, install_test_tokens
from tests.support.databases import emptied

API_BASE = "http://localhost"  # a trusted Host by default


def experiment_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "payments v2",
        "service": "payment-api",
        "variants": {
            "baseline": {"upstream": "http://payments-v1:8080"},
            "canary": {"upstream": "http://payments-v2:8080"},
        },
        "steps": [
            {"weight_pct": 1, "hold_sec": 60},
            {"weight_pct": 5, "hold_sec": 60},
            {"weight_pct": 25, "hold_sec": 120},
            {"weight_pct": 100, "hold_sec": 0},
        ],
        "sticky": {"header": "x-user-id"},
    }
    body.update(overrides)
    return body


@pytest.fixture(scope="session")
def migrated_pg(pg_database_url: str) -> str:
    """The session's PostgreSQL database, migrated once (creating one per test is slow)."""
    migrate.upgrade(pg_database_url)
    return pg_database_url


@pytest.fixture
def pg_url(migrated_pg: str) -> Iterator[str]:
    """Overrides the shared fixture for the API tests: the same schema, every table
    emptied (read from the database, so a table a migration adds is emptied too)."""
    yield emptied(migrated_pg)


@pytest.fixture
def settings(backend_settings: Settings) -> Settings:
    """Migrated, with one token per role (the clients below carry the admin's)."""
    migrate.upgrade(backend_settings.database_url)
    install_test_tokens(backend_settings.database_url)
    return backend_settings


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def backends(settings: Settings, clock: FakeClock) -> AsyncIterator[Backends]:
    """Backends the test opens itself, so it can look into the KV store and break it."""
    opened = await open_backends(settings, clock=clock, streams=False)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def publish(backends: Backends) -> Callable[[], Awaitable[None]]:
    """One pass of the leader's reconciler, as `canary serve` runs it after each commit
    (its first pass, at hand, is the one a leader makes on taking the lead)."""
    reconciler = RouteReconciler()
    await reconciler.reconcile(backends, None)

    async def one_pass() -> None:
        assert not await reconciler.reconcile(backends, None)

    return one_pass


@pytest.fixture
async def client(settings: Settings, backends: Backends) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, backends=backends)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=API_BASE, headers=bearer()
        ) as http:
            yield http


@pytest.fixture
def create(client: httpx.AsyncClient) -> Callable[..., Any]:
    async def make(**overrides: Any) -> dict[str, Any]:
        response = await client.post("/v1/experiments", json=experiment_body(**overrides))
        assert response.status_code == 201, response.text
        created: dict[str, Any] = response.json()
        return created

    return make


@pytest.fixture
async def stream_backends(settings: Settings, clock: FakeClock) -> AsyncIterator[Backends]:
    """Backends with the sample streams and the snapshot board open (Redis or in-process)."""
    opened = await open_backends(settings, clock=clock, streams=True)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def stream_client(
    settings: Settings, stream_backends: Backends
) -> AsyncIterator[httpx.AsyncClient]:
    """An API client whose app reads the snapshot board of `stream_backends`."""
    app = create_app(settings, backends=stream_backends)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=API_BASE, headers=bearer()
        ) as http:
            yield http
