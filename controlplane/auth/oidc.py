"""OIDC bearer tokens (JWTs) verified with PyJWT: signature against the issuer's JWKS
(a URL, fetched and cached by `jwt.PyJWKClient`, or a file), issuer, audience, expiry
with a leeway, and only asymmetric algorithms (never `none`, never HS*: an HMAC
"verified" with a public key is a forgery anyone can make).

Roles come from one claim (a list, or a space-separated string), each value mapped
through the role map; the highest role wins.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt

from controlplane.auth.roles import Principal, Role, parse_role
from controlplane.kernel.errors import ConfigError, Unauthenticated
from controlplane.kernel.secrets import read_bounded_file
from controlplane.kernel.settings import Settings

ASYMMETRIC = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
MAX_JWKS_BYTES = 1024 * 1024
MAX_JWT_CHARS = 16 * 1024
JWKS_FETCH_TIMEOUT_SEC = 5
_SUBJECT = re.compile(r"^[\w.@+:/-]{1,120}$")


def parse_role_map(text: str) -> dict[str, Role]:
    """'sre=operator, platform=admin' -> {'sre': OPERATOR, 'platform': ADMIN}."""
    mapping: dict[str, Role] = {role.value: role for role in Role}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        value, sep, role = pair.partition("=")
        if not sep or not value.strip():
            raise ConfigError(f"role map entry {pair!r}: expected VALUE=ROLE")
        try:
            mapping[value.strip()] = parse_role(role)
        except ValueError as exc:
            raise ConfigError(f"role map entry {pair!r}: {exc}") from None
    return mapping


def parse_algorithms(text: str) -> list[str]:
    algorithms = [a.strip() for a in text.split(",") if a.strip()]
    refused = [a for a in algorithms if a not in ASYMMETRIC]
    if refused or not algorithms:
        raise ConfigError(
            f"OIDC algorithms {refused or '(none)'} refused: use asymmetric ones "
            f"({', '.join(sorted(ASYMMETRIC))})"
        )
    return algorithms


def role_of(claims: Mapping[str, Any], claim: str, mapping: Mapping[str, Role]) -> Role | None:
    """The highest role the claim's values map to; None when none does."""
    raw = claims.get(claim)
    values: list[Any] = (
        raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
    )
    roles = [mapping[v] for v in values[:256] if isinstance(v, str) and v in mapping]
    return max(roles, key=lambda r: r.rank) if roles else None


def actor_of(claims: Mapping[str, Any]) -> str:
    """`oidc:<email>` when the token has a plain one, else `oidc:<sub>`."""
    for key in ("email", "sub"):
        value = claims.get(key)
        if isinstance(value, str) and _SUBJECT.match(value):
            return f"oidc:{value}"
    raise Unauthenticated("the token's subject is missing or not a plain identifier")


@dataclass
class OidcVerifier:
    issuer: str
    audience: str
    algorithms: list[str]
    roles_claim: str
    role_map: dict[str, Role]
    leeway_sec: int
    jwks_client: jwt.PyJWKClient | None = None
    jwks: jwt.PyJWKSet | None = field(default=None)

    @classmethod
    def from_settings(cls, settings: Settings) -> OidcVerifier | None:
        if not settings.oidc_enabled:
            return None
        if not settings.oidc_audience:
            raise ConfigError("OIDC needs an audience (CANARY_OIDC_AUDIENCE)")
        if bool(settings.oidc_jwks_url) == bool(settings.oidc_jwks_file):
            raise ConfigError("OIDC needs one of CANARY_OIDC_JWKS_URL or CANARY_OIDC_JWKS_FILE")
        verifier = cls(
            issuer=settings.oidc_issuer,
            audience=settings.oidc_audience,
            algorithms=parse_algorithms(settings.oidc_algorithms),
            roles_claim=settings.oidc_roles_claim,
            role_map=parse_role_map(settings.oidc_role_map),
            leeway_sec=settings.oidc_leeway_sec,
        )
        if settings.oidc_jwks_url:
            if not re.match(r"^https?://", settings.oidc_jwks_url):
                raise ConfigError("CANARY_OIDC_JWKS_URL must be an http(s) URL")
            verifier.jwks_client = jwt.PyJWKClient(
                settings.oidc_jwks_url, cache_keys=True, timeout=JWKS_FETCH_TIMEOUT_SEC
            )
        else:
            verifier.jwks = load_jwks_file(Path(settings.oidc_jwks_file))
        return verifier

    def _key(self, token: str) -> Any:
        """The JWKS key the token's header names (blocking when the JWKS is a URL)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"malformed token: {exc}") from None
        if header.get("alg") not in self.algorithms:
            raise Unauthenticated(f"token algorithm {header.get('alg')!r} is not accepted")
        try:
            if self.jwks_client is not None:
                return self.jwks_client.get_signing_key_from_jwt(token).key
            assert self.jwks is not None
            kid = header.get("kid")
            keys = [k for k in self.jwks.keys if kid is None or k.key_id == kid]
            if len(keys) != 1:
                raise Unauthenticated("no single key of the JWKS matches the token's kid")
            return keys[0].key
        except jwt.PyJWKClientConnectionError as exc:
            raise Unauthenticated(f"the issuer's keys cannot be fetched: {exc}") from None
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"no key for the token: {exc}") from None

    def verify(self, token: str) -> Principal:
        """The caller the token names; Unauthenticated when anything does not hold."""
        if len(token) > MAX_JWT_CHARS:
            raise Unauthenticated("token too long")
        key = self._key(token)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway_sec,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"token rejected: {exc}") from None
        return Principal(actor_of(claims), role_of(claims, self.roles_claim, self.role_map))


def load_jwks_file(path: Path) -> jwt.PyJWKSet:
    data = read_bounded_file(path, what="JWKS file", max_bytes=MAX_JWKS_BYTES)
    try:
        return jwt.PyJWKSet.from_dict(json.loads(data))
    except (ValueError, jwt.PyJWTError) as exc:
        raise ConfigError(f"the JWKS file {path} is not a valid JWKS: {exc}") from None
