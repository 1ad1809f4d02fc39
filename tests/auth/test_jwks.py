"""Parsing an issuer's key set: what is refused whole, what is skipped, which key a
token's kid selects."""

from __future__ import annotations

import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.utils import to_base64url_uint

from controlplane.auth.jwks import MAX_JWKS_BYTES, MAX_JWKS_KEYS, JwksFailure, parse_jwks, token_kid

RSA_JWK = {
    **json.loads(
        jwt.algorithms.RSAAlgorithm.to_jwk(
            rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
        )
    ),
    "kid": "rsa-1",
}
EC_JWK = {
    **json.loads(
        jwt.algorithms.ECAlgorithm.to_jwk(ec.generate_private_key(ec.SECP256R1()).public_key())
    ),
    "kid": "ec-1",
}
# an odd modulus past the bound: a public key that need not be a real one
BIG_RSA_JWK = {"kty": "RSA", "kid": "big", "n": to_base64url_uint((1 << 8200) - 1).decode(),
               "e": "AQAB"}  # fmt: skip


def body(*keys: Any) -> bytes:
    return json.dumps({"keys": list(keys)}).encode()


@pytest.mark.parametrize(
    ("label", "document", "reason"),
    [
        ("html", b"<html>sign in</html>", "not_json"),
        ("not UTF-8", b"\xff\xfe{", "not_json"),
        ("deeply nested", b"[" * 100_000 + b"]" * 100_000, "not_json"),
        ("a list", b"[]", "bad_shape"),
        ("no keys member", b"{}", "bad_shape"),
        ("keys is a string", b'{"keys": "rsa-1"}', "bad_shape"),
        ("too large", b" " * (MAX_JWKS_BYTES + 1), "too_large"),
        (
            "too many keys",
            body(*[{**RSA_JWK, "kid": f"k{i}"} for i in range(MAX_JWKS_KEYS + 1)]),
            "too_many_keys",
        ),
        ("empty", body(), "no_usable_key"),
        ("symmetric key only", body({"kty": "oct", "k": "c2VjcmV0", "kid": "h"}), "no_usable_key"),
        ("encryption key only", body({**RSA_JWK, "use": "enc"}), "no_usable_key"),
        ("one kid for two keys", body(RSA_JWK, {**EC_JWK, "kid": "rsa-1"}), "duplicate_kid"),
    ],
)
def test_a_key_set_refused_whole(label: str, document: bytes, reason: str) -> None:
    with pytest.raises(JwksFailure) as refused:
        parse_jwks(document)
    assert refused.value.reason == reason, label


def test_unusable_entries_are_skipped_and_counted_beside_the_signing_keys() -> None:
    keys = parse_jwks(
        body(
            RSA_JWK,
            EC_JWK,
            {**RSA_JWK, "kid": "enc", "use": "enc"},
            {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
            {"kty": "RSA", "kid": "broken", "n": "!", "e": "AQAB"},
            {"kty": "XYZ", "kid": "unknown"},
            {**RSA_JWK, "kid": "bad kid with spaces"},
            BIG_RSA_JWK,
            "not an object",
        )
    )
    assert [k.kid for k in keys.keys] == ["rsa-1", "ec-1"]
    assert keys.skipped == {
        "not_for_signing": 1,
        "not_asymmetric": 1,
        "unusable_key": 2,
        "bad_kid": 1,
        "key_too_large": 1,
        "not_an_object": 1,
    }


def test_a_kid_selects_its_key_and_no_kid_selects_only_a_lone_key() -> None:
    both = parse_jwks(body(RSA_JWK, EC_JWK))
    assert [getattr(both.select(k), "kid", None) for k in ("rsa-1", "ec-1")] == ["rsa-1", "ec-1"]
    assert both.select("other") is None and both.select(None) is None
    assert parse_jwks(body({**RSA_JWK, "kid": None})).select(None) is not None


@pytest.mark.parametrize(
    ("header", "kid"),
    [({}, None), ({"kid": "rsa-1"}, "rsa-1"), ({"kid": 7}, ValueError), ({"kid": ""}, ValueError),
     ({"kid": "x" * 129}, ValueError), ({"kid": "a b"}, ValueError), ({"kid": "k\n"}, ValueError),
     ({"kid": "é"}, ValueError)],
)  # fmt: skip
def test_a_token_kid_is_a_short_printable_string(header: dict[str, Any], kid: Any) -> None:
    if kid is ValueError:
        with pytest.raises(ValueError):
            token_kid(header)
    else:
        assert token_kid(header) == kid


def test_a_key_fits_its_declared_alg_else_the_algorithms_of_its_type() -> None:
    keys = parse_jwks(body({**RSA_JWK, "alg": "PS384"}, {**RSA_JWK, "kid": "r"}, EC_JWK))
    assert [sorted(k.algorithms) for k in keys.keys] == [
        ["PS384"],
        ["PS256", "PS384", "PS512", "RS256", "RS384", "RS512"],
        ["ES256"],
    ]
