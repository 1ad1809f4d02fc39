"""Whatever a token holds, verifying it names a caller or refuses it (401): never any
other exception, which the API would answer with a 500."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.auth.jwks import parse_jwks
from controlplane.auth.oidc import OidcVerifier, StaticJwks
from controlplane.auth.roles import Principal, Role
from controlplane.kernel.errors import Unauthenticated

ISSUER = "https://login.example.com/"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
JWKS = {
    "keys": [
        {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(RSA_KEY.public_key())), "kid": "r"},
        {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(EC_KEY.public_key())), "kid": "e"},
    ]
}
VERIFIER = OidcVerifier(
    issuer=ISSUER,
    audience="canary-api",
    algorithms=["RS256", "ES256"],
    roles_claim="roles",
    role_map={"admin": Role.ADMIN},
    leeway_sec=0,
    keys=StaticJwks(parse_jwks(json.dumps(JWKS).encode())),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
claim_names = st.sampled_from(["iss", "aud", "sub", "exp", "nbf", "iat", "email",
                               "email_verified", "roles"])  # fmt: skip


def signed(claims: dict[str, Any], header: dict[str, Any], use_ec: bool) -> str:
    key, alg = (EC_KEY, "ES256") if use_ec else (RSA_KEY, "RS256")
    body = json.dumps(claims).encode()
    return jwt.api_jws.PyJWS().encode(body, key, algorithm=alg, headers=header)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    overrides=st.dictionaries(claim_names, json_values, max_size=6),
    extra_header=st.dictionaries(
        st.sampled_from(["kid", "typ", "crit", "b64"]), json_values, max_size=2
    ),
    use_ec=st.booleans(),
)
def test_any_claims_or_header_name_a_caller_or_are_refused(
    overrides: dict[str, Any], extra_header: dict[str, Any], use_ec: bool
) -> None:
    claims = {"iss": ISSUER, "aud": "canary-api", "sub": "u", "exp": int(time.time()) + 60,
              "roles": ["admin"], **overrides}  # fmt: skip
    header = {"kid": "e" if use_ec else "r", **extra_header}
    try:
        token = signed(claims, header, use_ec)
    except (jwt.PyJWTError, TypeError, ValueError):
        return  # a header PyJWT will not write
    try:
        principal = asyncio.run(VERIFIER.verify(token))
    except Unauthenticated:
        return
    assert isinstance(principal, Principal)
    assert principal.actor.isascii() and principal.actor.isprintable()
    assert len(principal.actor) <= 128
