"""OIDC tokens: signed by a key pair made here, the JWKS served from a file and from a
real local HTTP server."""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from controlplane.api.app import create_app
from controlplane.auth.oidc import OidcVerifier
from controlplane.kernel.errors import ConfigError
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends
from tests.api.conftest import API_BASE
from tests.cli.conftest import free_port

ISSUER = "https://login.example.com/"
AUDIENCE = "canary-api"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def jwks() -> dict[str, Any]:
    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(KEY.public_key()))
    ec_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(EC_KEY.public_key()))
    return {"keys": [{**rsa_jwk, "kid": "rsa-1", "use": "sig", "alg": "RS256"},
                     {**ec_jwk, "kid": "ec-1", "use": "sig", "alg": "ES256"}]}  # fmt: skip


def sign(key: Any = KEY, alg: str = "RS256", kid: str = "rsa-1", **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "u-42", "email": "alice@example.com",
            "iat": now, "exp": now + 300, "groups": ["sre"], **claims}  # fmt: skip
    return jwt.encode({k: v for k, v in body.items() if v is not None}, key, alg,
                      headers={"kid": kid})  # fmt: skip


@pytest.fixture
def jwks_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks()))
    return path


@pytest.fixture
def jwks_server() -> Iterator[str]:
    body = json.dumps(jwks()).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def oidc(settings: Settings, **jwks_source: str) -> Settings:
    return settings.model_copy(update={
        "oidc_issuer": ISSUER, "oidc_audience": AUDIENCE, "oidc_roles_claim": "groups",
        "oidc_role_map": "sre=operator,platform=admin", "oidc_leeway_sec": 10, **jwks_source,
    })  # fmt: skip


async def ask(app_settings: Settings, backends: Backends, token: str, method: str = "GET",
              path: str = "/v1/experiments") -> httpx.Response:  # fmt: skip
    app = create_app(app_settings, backends=backends)
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url=API_BASE) as http,
    ):
        return await http.request(method, path, headers=headers)


def none_token() -> str:
    header = jwt.utils.base64url_encode(b'{"alg":"none","typ":"JWT","kid":"rsa-1"}').decode()
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": now + 300, "groups": ["platform"]}
    payload = jwt.utils.base64url_encode(json.dumps(claims).encode()).decode()
    return f"{header}.{payload}."


def with_header(header: dict[str, Any]) -> str:
    """A token with a header PyJWT would not write (its signature is never reached)."""
    encoded = jwt.utils.base64url_encode(json.dumps(header).encode()).decode()
    valid = sign().split(".")
    return ".".join([encoded, valid[1], valid[2]])


def hs_with_public_key() -> str:
    """The classic forgery: HMAC keyed with the public key's bytes."""
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": now + 300, "groups": ["platform"]}
    secret = b"an-hmac-secret-that-only-an-attacker-knows"
    return jwt.api_jws.PyJWS().encode(
        json.dumps(claims).encode(), secret, algorithm="HS256", headers={"kid": "rsa-1"}
    )


@pytest.mark.parametrize(
    ("label", "token", "status"),
    [
        ("valid, sre maps to operator", lambda: sign(), 200),
        ("valid ES256", lambda: sign(EC_KEY, "ES256", "ec-1"), 200),
        ("expired beyond the leeway", lambda: sign(exp=int(time.time()) - 60), 401),
        ("expired within the leeway", lambda: sign(exp=int(time.time()) - 3), 200),
        ("wrong issuer", lambda: sign(iss="https://evil.example.com/"), 401),
        ("wrong audience", lambda: sign(aud="another-api"), 401),
        ("signed by another key", lambda: sign(OTHER_KEY), 401),
        ("alg none", none_token, 401),
        ("HS256 forgery", hs_with_public_key, 401),
        ("RS256 naming the EC key", lambda: sign(kid="ec-1"), 401),
        ("ES256 naming the RSA key", lambda: sign(EC_KEY, "ES256", "rsa-1"), 401),
        ("kid not a string", lambda: with_header({"alg": "RS256", "kid": 7}), 401),
        ("kid too long", lambda: with_header({"alg": "RS256", "kid": "k" * 200}), 401),
        ("no subject", lambda: sign(sub=None, email=None), 401),
        ("no role", lambda: sign(groups=["staff"]), 403),
    ],
)
async def test_tokens_from_a_jwks_file(
    settings: Settings, backends: Backends, jwks_file: Path, label: str, token: Any, status: int
) -> None:
    answer = await ask(oidc(settings, oidc_jwks_file=str(jwks_file)), backends, token())
    assert answer.status_code == status, (label, answer.text)


async def test_roles_claim_maps_to_the_highest_role_and_the_actor_is_the_subject(
    settings: Settings, backends: Backends, jwks_file: Path
) -> None:
    app_settings = oidc(settings, oidc_jwks_file=str(jwks_file))
    body = {"threshold_ms": 800, "window_sec": 60, "failure_ratio": 0.3}
    operator = sign()
    admin = sign(groups=["sre", "platform"], email=None)
    app = create_app(app_settings, backends=backends)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url=API_BASE) as http,
    ):
        path = "/v1/services/payment-api/rule"
        refused = await http.put(path, json=body, headers={"Authorization": f"Bearer {operator}"})
        assert refused.status_code == 403 and "operator" in refused.json()["detail"]
        done = await http.put(path, json=body, headers={"Authorization": f"Bearer {admin}"})
        assert done.status_code == 200, done.text

    from controlplane.db import experiments as records

    events, _ = await backends.database.read(records.list_events, service="payment-api")
    assert [e.actor for e in events] == ["oidc:sub:u-42@login.example.com"]


async def test_tokens_from_a_jwks_served_over_http(
    settings: Settings, backends: Backends, jwks_server: str
) -> None:
    app_settings = oidc(settings, oidc_jwks_url=jwks_server)
    assert (await ask(app_settings, backends, sign())).status_code == 200
    assert (await ask(app_settings, backends, sign(OTHER_KEY))).status_code == 401


async def test_an_unreachable_jwks_is_503_not_a_crash(
    settings: Settings, backends: Backends
) -> None:
    app_settings = oidc(settings, oidc_jwks_url=f"http://127.0.0.1:{free_port()}/jwks.json")
    answer = await ask(app_settings, backends, sign())
    assert answer.status_code == 503, answer.text
    assert answer.json()["type"] == "urn:canary:problem:identity-provider-unavailable"
    assert "last fetch: unreachable" in answer.json()["detail"]


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"oidc_algorithms": "HS256"}, "refused"),
        ({"oidc_algorithms": "none"}, "refused"),
        ({"oidc_audience": ""}, "audience"),
        ({"oidc_jwks_file": "", "oidc_jwks_url": ""}, "JWKS"),
        ({"oidc_role_map": "sre=root"}, "unknown role"),
        ({"oidc_jwks_file": "", "oidc_jwks_url": "ftp://login.example.com/keys"}, "http"),
        ({"oidc_jwks_file": "", "oidc_jwks_url": "https:///keys"}, "host"),
        ({"oidc_jwks_file": "", "oidc_jwks_url": "https://exa mple.com/keys"}, "host"),
        ({"oidc_jwks_file": "", "oidc_jwks_url": "https://[::1"}, "URL"),
        ({"oidc_issuer": "login.example.com"}, "host"),
    ],
)
def test_bad_oidc_settings_are_config_errors(
    jwks_file: Path, update: dict[str, str], message: str
) -> None:
    base = oidc(Settings(), oidc_jwks_file=str(jwks_file))
    with pytest.raises(ConfigError, match=message):
        OidcVerifier.from_settings(base.model_copy(update=update))


async def test_the_audit_actor_is_the_issuers_subject_unless_the_email_is_verified(
    settings: Settings, backends: Backends, jwks_file: Path
) -> None:
    app_settings = oidc(settings, oidc_jwks_file=str(jwks_file))
    body = {"threshold_ms": 800, "window_sec": 60, "failure_ratio": 0.3}
    claims: dict[str, Any] = {"sub": "mallory", "email": "boss@example.com", "groups": ["platform"]}
    callers = {
        "payment-api": sign(**claims),
        "ledger-api": sign(**claims, email_verified=False),
        "search-api": sign(**claims, email_verified=True),
    }
    app = create_app(app_settings, backends=backends)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url=API_BASE) as http,
    ):
        for service, token in callers.items():
            headers = {"Authorization": f"Bearer {token}"}
            done = await http.put(f"/v1/services/{service}/rule", json=body, headers=headers)
            assert done.status_code == 200, done.text
        me = await http.get("/v1/me", headers={"Authorization": f"Bearer {callers['payment-api']}"})
        assert me.json()["actor"] == "oidc:sub:mallory@login.example.com"

    from controlplane.db import experiments as records

    actors = {}
    for service in callers:
        events, _ = await backends.database.read(records.list_events, service=service)
        actors[service] = [e.actor for e in events]
    assert actors == {
        "payment-api": ["oidc:sub:mallory@login.example.com"],
        "ledger-api": ["oidc:sub:mallory@login.example.com"],
        "search-api": ["oidc:boss@example.com"],
    }


def test_a_plain_http_jwks_url_beyond_loopback_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for url in ("http://127.0.0.1:9/jwks.json", "https://login.example.com/jwks.json"):
        OidcVerifier.from_settings(oidc(Settings(), oidc_jwks_url=url))
    assert not [r for r in caplog.records if "plain HTTP" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="controlplane.auth.oidc"):
        OidcVerifier.from_settings(oidc(Settings(), oidc_jwks_url="http://idp.example.com/j"))
    assert [r for r in caplog.records if "plain HTTP" in r.getMessage()]
