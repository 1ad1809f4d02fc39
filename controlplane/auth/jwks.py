"""An issuer's key set (JWKS) as parsed keys: strict parsing of untrusted bytes, and
the choice of the key a token names. Pure functions; fetching lives in jwks_remote.

A set is refused whole (`JwksFailure`, with a short `reason` for the metrics) when it
is too large, not JSON, not `{"keys": [...]}`, holds too many entries, names one `kid`
twice, or leaves no usable signing key. A single entry we cannot use (an encryption
key, a symmetric or unknown key type, a malformed or oversized key) is skipped and
named in `skipped`: issuers publish such keys beside their signing keys.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

MAX_JWKS_BYTES = 1024 * 1024
MAX_JWKS_KEYS = 64
MAX_RSA_BITS = 8192  # a larger modulus only makes each verification slower
ASYMMETRIC = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
KID = re.compile(r"^[\x21-\x7e]{1,128}$")  # printable ASCII, bounded


class JwksFailure(Exception):
    """A key set we could not fetch or refuse; `reason` is a fixed label (a metrics
    label value), never bytes of the input."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class SigningKey:
    """A public key and the algorithms a token signed with it may name: the JWK's
    `alg` if it declares one, else those its key type can verify. A token whose `alg`
    does not fit its key is refused before PyJWT sees the pair."""

    kid: str | None
    algorithms: frozenset[str]
    key: Any


@dataclass(frozen=True)
class KeySet:
    """The usable signing keys of one JWKS; `skipped` counts the entries left out by
    reason."""

    keys: Sequence[SigningKey]
    skipped: Mapping[str, int] = field(default_factory=dict)

    def select(self, kid: str | None) -> SigningKey | None:
        """The key a token's `kid` names; a token without one may use the only key."""
        if kid is None:
            return self.keys[0] if len(self.keys) == 1 else None
        for key in self.keys:
            if key.kid == kid:
                return key
        return None


def parse_jwks(body: bytes) -> KeySet:
    """The usable keys of a JWKS document; JwksFailure when the set cannot be used."""
    if len(body) > MAX_JWKS_BYTES:
        raise JwksFailure(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes", "too_large")
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise JwksFailure("the JWKS is not JSON", "not_json") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise JwksFailure('the JWKS is not an object with a "keys" list', "bad_shape")
    if len(entries) > MAX_JWKS_KEYS:
        raise JwksFailure(f"the JWKS holds more than {MAX_JWKS_KEYS} keys", "too_many_keys")
    keys: list[SigningKey] = []
    skipped: Counter[str] = Counter()
    for entry in entries:
        key, why = _signing_key(entry)
        if key is None:
            skipped[why] += 1
        else:
            keys.append(key)
    kids = Counter(k.kid for k in keys if k.kid is not None)
    if any(n > 1 for n in kids.values()):
        raise JwksFailure("the JWKS names one kid for two signing keys", "duplicate_kid")
    if not keys:
        raise JwksFailure(
            f"the JWKS holds no usable signing key (skipped: {_named(skipped) or 'none'})",
            "no_usable_key",
        )
    return KeySet(tuple(keys), dict(skipped))


def _signing_key(entry: Any) -> tuple[SigningKey | None, str]:
    """The entry as a signing key, or None and why it is skipped."""
    if not isinstance(entry, dict):
        return None, "not_an_object"
    if entry.get("use", "sig") != "sig":
        return None, "not_for_signing"
    kid = entry.get("kid")
    if kid is not None and not (isinstance(kid, str) and KID.fullmatch(kid)):
        return None, "bad_kid"
    try:
        jwk = jwt.PyJWK(entry)
    except (jwt.PyJWTError, ValueError, TypeError):
        return None, "unusable_key"
    if jwk.algorithm_name not in ASYMMETRIC:
        return None, "not_asymmetric"
    if isinstance(jwk.key, RSAPublicKey) and jwk.key.key_size > MAX_RSA_BITS:
        return None, "key_too_large"
    declared = entry.get("alg")
    algorithms = frozenset({declared}) if isinstance(declared, str) else _verifies(jwk.key)
    if not algorithms:
        return None, "not_asymmetric"
    return SigningKey(kid, algorithms, jwk.key), ""


_RSA = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_CURVES = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


def _verifies(key: Any) -> frozenset[str]:
    """The algorithms a public key without a declared `alg` can verify."""
    if isinstance(key, RSAPublicKey):
        return _RSA
    if isinstance(key, EllipticCurvePublicKey) and key.curve.name in _CURVES:
        return frozenset({_CURVES[key.curve.name]})
    if isinstance(key, Ed25519PublicKey):
        return frozenset({"EdDSA"})
    return frozenset()


def _named(skipped: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))


def token_kid(header: Mapping[str, Any]) -> str | None:
    """The `kid` of a token's (unverified) header; ValueError when it is not a plain one."""
    kid = header.get("kid")
    if kid is None:
        return None
    if not isinstance(kid, str) or not KID.fullmatch(kid):
        raise ValueError("the token's kid is not a short printable string")
    return kid
