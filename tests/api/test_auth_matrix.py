"""Every route has a role: anonymous -> 401, a role too low -> 403, else allowed.

The routes are enumerated from the app itself, so a route added without a line in
MATRIX (or without a guard) fails here.
"""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from controlplane.api.app import create_app
from controlplane.api.security import route_roles
from controlplane.auth.roles import Role
from controlplane.db.models import ApiToken
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends
from tests.api.conftest import API_BASE
from tests.support.auth import bearer

VIEW, OPER, ADMIN = Role.VIEWER, Role.OPERATOR, Role.ADMIN
ACTIONS = ("start", "pause", "resume", "promote", "rollback", "abort")
MATRIX: dict[tuple[str, str], Role | None] = {
    ("GET", "/healthz"): None,
    ("GET", "/readyz"): None,
    ("GET", "/metrics"): VIEW,
    ("GET", "/v1/experiments"): VIEW,
    ("POST", "/v1/experiments"): ADMIN,
    ("GET", "/v1/experiments/{experiment_id}"): VIEW,
    ("PATCH", "/v1/experiments/{experiment_id}"): ADMIN,
    ("DELETE", "/v1/experiments/{experiment_id}"): ADMIN,
    ("GET", "/v1/experiments/{experiment_id}/events"): VIEW,
    ("GET", "/v1/experiments/{experiment_id}/history"): VIEW,
    ("GET", "/v1/me"): VIEW,
    **{("POST", f"/v1/experiments/{{experiment_id}}/{a}"): OPER for a in ACTIONS},
    ("GET", "/v1/services/{service}/rule"): VIEW,
    ("PUT", "/v1/services/{service}/rule"): ADMIN,
    ("GET", "/v1/services/{service}/rule/recommendation"): VIEW,
    ("GET", "/v1/services/{service}/releases"): VIEW,
    ("GET", "/v1/services/{service}/overload"): VIEW,
    ("PUT", "/v1/services/{service}/overload"): ADMIN,
    ("DELETE", "/v1/services/{service}/overload"): ADMIN,
    ("GET", "/v1/tokens"): ADMIN,
    ("POST", "/v1/tokens"): ADMIN,
    ("DELETE", "/v1/tokens/{token_id}"): ADMIN,
    ("POST", "/v1/judge"): VIEW,
    ("GET", "/v1/notifications/subscriptions"): ADMIN,
    ("POST", "/v1/notifications/subscriptions"): ADMIN,
    ("GET", "/v1/notifications/subscriptions/{subscription_id}"): ADMIN,
    ("PATCH", "/v1/notifications/subscriptions/{subscription_id}"): ADMIN,
    ("DELETE", "/v1/notifications/subscriptions/{subscription_id}"): ADMIN,
    ("POST", "/v1/notifications/subscriptions/{subscription_id}/test"): ADMIN,
    ("GET", "/v1/notifications/deliveries"): VIEW,
}
PARAMS = {"{experiment_id}": "987654", "{service}": "payment-api", "{token_id}": "987654",
          "{subscription_id}": "987654"}


def concrete(path: str) -> str:
    for name, value in PARAMS.items():
        path = path.replace(name, value)
    return path


async def call(http: httpx.AsyncClient, method: str, path: str, **kw: Any) -> httpx.Response:
    body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    return await http.request(method, concrete(path), headers=headers, **body, **kw)


def test_every_route_of_the_app_is_in_the_matrix(settings: Settings) -> None:
    assert route_roles(create_app(settings)) == MATRIX


@pytest.mark.parametrize(("method", "path"), sorted(MATRIX))
async def test_role_matrix(
    client: httpx.AsyncClient, settings: Settings, backends: Backends, method: str, path: str
) -> None:
    needed = MATRIX[(method, path)]
    anonymous = await call(client, method, path, headers={"Authorization": ""})
    if needed is None:
        assert anonymous.status_code in (200, 503)
        return
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert anonymous.headers["content-type"] == "application/problem+json"
    assert anonymous.json()["required_role"] == needed.value
    for role in Role:
        answer = await call(client, method, path, headers=bearer(role))
        if role.covers(needed):
            assert answer.status_code not in (401, 403), (role, answer.text)
        else:
            assert answer.status_code == 403, (role, answer.text)
            problem = answer.json()
            assert problem["required_role"] == needed.value
            assert f"needs the {needed.value} role" in problem["detail"]


async def test_a_revoked_token_is_refused_and_a_token_is_shown_once_and_stored_hashed(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    made = await client.post("/v1/tokens", json={"name": "ci", "role": "operator"})
    assert made.status_code == 201, made.text
    token, token_id = made.json()["token"], made.json()["id"]
    assert token.startswith("cnry_") and len(token) > 40
    mine = {"Authorization": f"Bearer {token}"}
    assert (await client.get("/v1/experiments", headers=mine)).status_code == 200

    listed = (await client.get("/v1/tokens")).json()
    assert all("token" not in item and "token_hash" not in item for item in listed)
    assert token not in (await client.get("/v1/tokens")).text

    def stored(*, session: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in session.execute(select(ApiToken.__table__)).all()]

    rows = await backends.database.read(stored)
    cells = [str(cell) for row in rows for cell in row]
    assert token not in cells
    assert hashlib.sha256(token.encode()).hexdigest() in cells

    assert (await client.delete(f"/v1/tokens/{token_id}")).json()["revoked_at"]
    refused = await client.get("/v1/experiments", headers=mine)
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]


async def test_unknown_and_malformed_credentials_are_401(client: httpx.AsyncClient) -> None:
    for value in ("Bearer cnry_" + "x" * 43, "Bearer not-a-token", "Basic dXNlcjpwdw==",
                  "Bearer " + "cnry_" + "y" * 400):  # fmt: skip
        answer = await client.get("/v1/experiments", headers={"Authorization": value})
        assert answer.status_code == 401, value


async def test_the_audit_actor_is_the_token_not_a_header(
    client: httpx.AsyncClient, create: Any
) -> None:
    experiment = await create()
    headers = {**bearer(Role.OPERATOR), "X-Canary-User": "mallory"}
    await client.post(f"/v1/experiments/{experiment['id']}/start", headers=headers)
    events = (await client.get(f"/v1/experiments/{experiment['id']}/events")).json()["items"]
    assert [e["actor"] for e in events] == ["token:test-admin", "token:test-operator"]
    assert "mallory" not in str(events)


async def test_openapi_documents_the_security_statuses_as_problem_json(
    client: httpx.AsyncClient,
) -> None:
    document = (await client.get("/openapi.json", headers={"Authorization": ""})).json()
    start = document["paths"]["/v1/experiments/{experiment_id}/start"]["post"]
    for status in ("400", "401", "403", "413", "415"):
        assert "application/problem+json" in start["responses"][status]["content"], status
    assert "401" not in document["paths"]["/healthz"]["get"]["responses"]
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


async def test_an_insecure_app_lets_anonymous_act_as_admin_and_says_so(
    settings: Settings, backends: Backends
) -> None:
    app = create_app(settings, backends=backends, insecure=True)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=API_BASE) as http:
            assert (await http.get("/v1/experiments")).status_code == 200
            assert "canary_api_insecure 1.0" in (await http.get("/metrics")).text
            # credentials that are given are still checked
            bad = await http.get("/v1/experiments", headers={"Authorization": "Bearer x"})
            assert bad.status_code == 401
