"""The dashboard's pages, the docs and /v1/me over HTTP (the browser tests drive them
in Chromium): same-origin assets only, a strict policy, the caller's role."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from controlplane.api.pages import STATIC_DIR
from controlplane.auth.roles import Role
from tests.support.auth import NAMES, bearer

ASSET = re.compile(r"""(?:src|href)="([^"]+)\"""")


@pytest.mark.parametrize("path", ["/ui/", "/ui/experiments/7", "/docs"])
async def test_a_page_loads_only_assets_of_its_own_origin(
    client: httpx.AsyncClient, path: str
) -> None:
    response = await client.get(path, headers={"Authorization": ""})

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assets = ASSET.findall(response.text)
    assert assets, "the page names its scripts and styles"
    assert all(a.startswith("/") and not a.startswith("//") for a in assets), assets
    assert "<script>" not in response.text, "no inline script: the policy would block it"
    for asset in assets:
        if asset.startswith("/ui/static/"):
            served = await client.get(asset)
            assert served.status_code == 200, asset
            assert "script-src 'self'" in served.headers["content-security-policy"]


async def test_the_pages_carry_the_policy_and_refuse_framing(client: httpx.AsyncClient) -> None:
    response = await client.get("/ui/")
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"
    # the API's own answers are JSON and keep their headers as they were
    assert "content-security-policy" not in (await client.get("/v1/experiments")).headers


@pytest.mark.parametrize("path", ["/ui/", "/ui/experiments/7", "/docs"])
async def test_every_page_names_the_icon_it_is_served(client: httpx.AsyncClient, path: str) -> None:
    page = (await client.get(path)).text
    assert '<link rel="icon" href="/ui/static/favicon.svg" type="image/svg+xml">' in page
    for where in ("/ui/static/favicon.svg", "/favicon.ico"):  # the latter: where browsers look
        icon = await client.get(where, headers={"Authorization": ""})
        assert icon.status_code == 200, where
        assert icon.headers["content-type"].startswith("image/svg+xml")
        assert icon.content.startswith(b"<svg") and b"<script" not in icon.content
        assert "default-src 'none'" in icon.headers["content-security-policy"]


async def test_ui_without_a_slash_goes_to_the_list(client: httpx.AsyncClient) -> None:
    response = await client.get("/ui")
    assert (response.status_code, response.headers["location"]) == (308, "/ui/")


async def test_the_static_mount_serves_files_of_its_folder_only(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.get("/ui/static/../pages.py")).status_code == 404
    assert (await client.get("/ui/static/%2e%2e/pages.py")).status_code == 404
    assert (await client.get("/ui/experiments/seven")).status_code == 404


def test_every_vendored_library_ships_with_its_licence() -> None:
    for library in (STATIC_DIR / "vendor").iterdir():
        assert (library / "LICENSE").is_file(), library.name


@pytest.mark.parametrize("role", list(Role))
async def test_me_names_the_caller_and_what_its_role_covers(
    client: httpx.AsyncClient, role: Role
) -> None:
    body = (await client.get("/v1/me", headers=bearer(role))).json()

    assert body["actor"] == f"token:{NAMES[role]}" and body["role"] == role.value
    assert ("operator" in body["may"]) is (role is not Role.VIEWER)


async def test_me_without_a_token_is_a_401(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/me", headers={"Authorization": ""})
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")


async def test_the_list_carries_the_controllers_last_reason(
    client: httpx.AsyncClient, create: Callable[..., Any]
) -> None:
    created = await create()
    listed = (await client.get("/v1/experiments")).json()["items"]
    assert listed[0]["id"] == created["id"] and listed[0]["last_reason"] is None
