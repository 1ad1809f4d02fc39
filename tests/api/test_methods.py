"""OPTIONS lists every method a path answers; any other method is 405 with that `Allow`,
before the caller's content type or credentials are looked at.

The app here has no backends open: both answers come before any route runs, so a
request that got past them would fail on the missing database rather than pass.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from controlplane.api.app import create_app
from controlplane.api.hygiene.methods import served_paths
from controlplane.kernel.settings import Settings
from tests.api.conftest import API_BASE
from tests.support.auth import bearer

# every path the app serves with declared methods, and those methods
METHODS: dict[str, set[str]] = {
    "/healthz": {"GET"},
    "/readyz": {"GET"},
    "/metrics": {"GET"},
    "/openapi.json": {"GET", "HEAD"},
    "/ui": {"GET", "HEAD"},
    "/ui/": {"GET", "HEAD"},
    "/ui/experiments/{experiment_id:int}": {"GET", "HEAD"},
    "/docs": {"GET", "HEAD"},
    "/favicon.ico": {"GET", "HEAD"},
    "/v1/experiments": {"GET", "POST"},
    "/v1/experiments/{experiment_id}": {"GET", "PATCH", "DELETE"},
    "/v1/experiments/{experiment_id}/events": {"GET"},
    "/v1/experiments/{experiment_id}/start": {"POST"},
    "/v1/experiments/{experiment_id}/pause": {"POST"},
    "/v1/experiments/{experiment_id}/resume": {"POST"},
    "/v1/experiments/{experiment_id}/promote": {"POST"},
    "/v1/experiments/{experiment_id}/rollback": {"POST"},
    "/v1/experiments/{experiment_id}/abort": {"POST"},
    "/v1/experiments/{experiment_id}/history": {"GET"},
    "/v1/services/{service}/rule": {"GET", "PUT"},
    "/v1/services/{service}/rule/recommendation": {"GET"},
    "/v1/services/{service}/overload": {"GET", "PUT", "DELETE"},
    "/v1/services/{service}/releases": {"GET"},
    "/v1/judge": {"POST"},
    "/v1/tokens": {"GET", "POST"},
    "/v1/tokens/{token_id}": {"DELETE"},
    "/v1/notifications/subscriptions": {"GET", "POST"},
    "/v1/notifications/subscriptions/{subscription_id}": {"GET", "PATCH", "DELETE"},
    "/v1/notifications/subscriptions/{subscription_id}/test": {"POST"},
    "/v1/notifications/deliveries": {"GET"},
    "/v1/me": {"GET"},
}
STANDARD = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
VALUES = {"experiment_id": "1", "service": "payment-api", "token_id": "1", "subscription_id": "1"}


def concrete(template: str) -> str:
    return re.sub(r"\{(\w+)(:\w+)?\}", lambda m: VALUES[m.group(1)], template)


def allow(path: str) -> set[str]:
    return METHODS[path] | {"OPTIONS"}


def allow_of(response: httpx.Response) -> set[str]:
    return {m.strip() for m in response.headers["allow"].split(",")}


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(Settings(trusted_hosts="localhost"))


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=API_BASE) as c:
        yield c


def test_the_method_table_is_what_the_routes_serve(app: FastAPI) -> None:
    assert {s.path: set(s.methods) for s in served_paths(app.routes)} == METHODS


@pytest.mark.parametrize("path", sorted(METHODS))
async def test_options_lists_exactly_the_paths_methods(http: httpx.AsyncClient, path: str) -> None:
    for headers in ({}, bearer()):
        answer = await http.options(concrete(path), headers=headers)
        assert answer.status_code == 204
        assert allow_of(answer) == allow(path)
        assert answer.content == b""


UNDECLARED = [
    pytest.param(path, method, id=f"{method} {path}")
    for path in sorted(METHODS)
    for method in STANDARD
    if method not in METHODS[path]
]


@pytest.mark.parametrize(("path", "method"), UNDECLARED)
async def test_an_undeclared_method_is_405_with_allow_before_type_or_credentials(
    http: httpx.AsyncClient, path: str, method: str
) -> None:
    for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "text/plain", **bearer()}):
        answer = await http.request(method, concrete(path), content=b"x", headers=headers)
        assert answer.status_code == 405
        assert allow_of(answer) == allow(path)
        if method != "HEAD":
            assert answer.headers["content-type"] == "application/problem+json"
            assert answer.json()["status"] == 405


async def test_an_unknown_path_is_404_whatever_the_method(http: httpx.AsyncClient) -> None:
    for method in ("OPTIONS", "PUT", "GET"):
        answer = await http.request(method, "/v1/nothing-here", headers=bearer())
        assert answer.status_code == 404
        assert "allow" not in answer.headers


async def test_each_405_is_counted_and_an_options_answer_is_not(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    def refused() -> float:
        value = app.state.metrics.registry.get_sample_value(
            "canary_api_rejected_requests_total", {"reason": "method_not_allowed"}
        )
        return float(value or 0)

    before = refused()
    await http.put("/v1/judge", content=b"{}", headers={"Content-Type": "application/json"})
    await http.options("/v1/judge")
    assert refused() == before + 1
