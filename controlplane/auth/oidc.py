"""OIDC bearer tokens (JWTs) verified with PyJWT: signature against the issuer's JWKS
(a URL, fetched on the event loop by `RemoteJwks`, or a file), issuer, audience,
expiry with a leeway, and only asymmetric algorithms (never `none`, never HS*: an HMAC
"verified" with a public key is a forgery anyone can make).

Roles come from one claim (a list, or a space-separated string), each value mapped
through the role map; the highest role wins. The audit actor is the verified email
when the issuer says it verified it, else the subject qualified by the issuer's host
(`actor_of`, decision 0041).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import jwt

from controlplane.auth.jwks import (
    ASYMMETRIC,
    MAX_JWKS_BYTES,
    JwksFailure,
    KeySet,
    SigningKey,
    parse_jwks,
    token_kid,
)
from controlplane.auth.jwks_remote import JwksCounters, RemoteJwks
from controlplane.auth.jwks_schedule import FetchPolicy
from controlplane.auth.roles import Principal, Role, parse_role
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.errors import ConfigError, Unauthenticated
from controlplane.kernel.secrets import read_bounded_file
from controlplane.kernel.settings import Settings

log = logging.getLogger(__name__)

MAX_JWT_CHARS = 16 * 1024
MAX_ACTOR_CHARS = 128  # the audit trail's column
MAX_ISSUER_HOST_CHARS = 64
# A subject shown as is: printable ASCII without spaces, '#' or anything a log or a
# terminal would interpret. Anything else is shown as a digest.
_PLAIN_SUBJECT = re.compile(r"^[A-Za-z0-9_.+|:/=@-]{1,118}$")
# An address shown as is: no ':' and no '#', so no email actor can read as a subject one.
_PLAIN_EMAIL = re.compile(r"^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})+$")


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


def issuer_host(issuer: str) -> str:
    """The host of the issuer URL, which qualifies subjects in the audit trail."""
    host = (urlsplit(issuer).hostname or "").lower()
    if not host or len(host) > MAX_ISSUER_HOST_CHARS or not re.fullmatch(r"[a-z0-9.-]+", host):
        raise ConfigError(
            f"CANARY_OIDC_ISSUER {issuer!r} must be a URL whose host has at most "
            f"{MAX_ISSUER_HOST_CHARS} characters"
        )
    return host


def actor_of(claims: Mapping[str, Any], issuer: str) -> str:
    """How the audit trail names the caller (`issuer` is the issuer's host):

    - `oidc:<email>` when `email_verified` is JSON `true` and the address is plain;
    - else `oidc:sub:<sub>@<issuer>`, or `oidc:sub#<digest>@<issuer>` (the first 24 hex
      digits of the subject's SHA-256) for a subject that is not plain or too long.

    An unverified email is never used: anyone may put any address in their profile.
    The forms cannot be confused (an email actor holds no ':' or '#'), and every actor
    is printable ASCII of at most MAX_ACTOR_CHARS.
    """
    email = claims.get("email")
    if (
        claims.get("email_verified") is True
        and isinstance(email, str)
        and len(email) <= MAX_ACTOR_CHARS - len("oidc:")
        and _PLAIN_EMAIL.fullmatch(email)
    ):
        return f"oidc:{email}"
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise Unauthenticated("the token has no subject")
    actor = f"oidc:sub:{subject}@{issuer}"
    if _PLAIN_SUBJECT.fullmatch(subject) and len(actor) <= MAX_ACTOR_CHARS:
        return actor
    digest = hashlib.sha256(subject.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"oidc:sub#{digest}@{issuer}"


class KeySource(Protocol):
    async def key_for(self, kid: str | None) -> SigningKey:
        """The key a token's kid names; Unauthenticated when there is none,
        IdentityProviderUnavailable when the issuer's keys cannot be had now."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class StaticJwks:
    """Keys read once from a file."""

    keys: KeySet

    async def key_for(self, kid: str | None) -> SigningKey:
        key = self.keys.select(kid)
        if key is None:
            raise Unauthenticated("no single key of the JWKS matches the token's kid")
        return key

    async def aclose(self) -> None:
        return None


@dataclass
class OidcVerifier:
    issuer: str
    audience: str
    algorithms: list[str]
    roles_claim: str
    role_map: dict[str, Role]
    leeway_sec: int
    keys: KeySource

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        clock: Clock | None = None,
        counters: JwksCounters | None = None,
    ) -> OidcVerifier | None:
        """The verifier the settings describe (None: OIDC is off); nothing is fetched
        here; `counters` count the JWKS fetches and the keys they skip."""
        if not settings.oidc_enabled:
            return None
        if not settings.oidc_audience:
            raise ConfigError("OIDC needs an audience (CANARY_OIDC_AUDIENCE)")
        if bool(settings.oidc_jwks_url) == bool(settings.oidc_jwks_file):
            raise ConfigError("OIDC needs one of CANARY_OIDC_JWKS_URL or CANARY_OIDC_JWKS_FILE")
        algorithms = parse_algorithms(settings.oidc_algorithms)
        issuer_host(settings.oidc_issuer)
        keys: KeySource
        if settings.oidc_jwks_url:
            keys = RemoteJwks(
                jwks_url(settings.oidc_jwks_url),
                clock=clock or SystemClock(),
                policy=FetchPolicy(timeout_sec=settings.oidc_jwks_timeout_sec),
                counters=counters,
            )
        else:
            keys = StaticJwks(load_jwks_file(Path(settings.oidc_jwks_file)))
        return cls(
            issuer=settings.oidc_issuer,
            audience=settings.oidc_audience,
            algorithms=algorithms,
            roles_claim=settings.oidc_roles_claim,
            role_map=parse_role_map(settings.oidc_role_map),
            leeway_sec=settings.oidc_leeway_sec,
            keys=keys,
        )

    async def verify(self, token: str) -> Principal:
        """The caller the token names. Unauthenticated when anything does not hold;
        IdentityProviderUnavailable when the issuer's keys cannot be had. Everything
        but waiting for the JWKS fetch runs inline: one signature check is cheaper than
        handing it to a thread."""
        if len(token) > MAX_JWT_CHARS:
            raise Unauthenticated("token too long")
        try:
            header = jwt.get_unverified_header(token)
            kid = token_kid(header)
        except (jwt.PyJWTError, ValueError) as exc:
            raise Unauthenticated(f"malformed token: {exc}") from None
        if header.get("alg") not in self.algorithms:
            alg = str(header.get("alg"))[:20]
            raise Unauthenticated(f"token algorithm {alg!r} is not accepted")
        key = await self.keys.key_for(kid)
        if header["alg"] not in key.algorithms:
            raise Unauthenticated("the token's algorithm does not fit the key its kid names")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway_sec,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"token rejected: {exc}") from None
        actor = actor_of(claims, issuer_host(self.issuer))
        return Principal(actor, role_of(claims, self.roles_claim, self.role_map))


def jwks_url(text: str) -> str:
    """The JWKS URL, checked once at start; plain HTTP beyond loopback is warned about:
    whoever can answer for it can mint any token."""
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ConfigError(f"CANARY_OIDC_JWKS_URL is not a URL: {exc}") from None
    host = url.raw_host.decode("ascii")
    if url.scheme not in ("http", "https") or not re.fullmatch(r"[A-Za-z0-9.:-]+", host):
        raise ConfigError("CANARY_OIDC_JWKS_URL must be an http(s) URL with a plain host")
    if url.scheme == "http" and host not in ("localhost", "127.0.0.1", "::1"):
        log.warning(
            "OIDC: the JWKS URL %s is plain HTTP: anyone on the path can replace the "
            "issuer's keys and sign any token; use https://",
            text,
        )
    return text


def load_jwks_file(path: Path) -> KeySet:
    data = read_bounded_file(path, what="JWKS file", max_bytes=MAX_JWKS_BYTES)
    try:
        return parse_jwks(data)
    except JwksFailure as exc:
        raise ConfigError(f"the JWKS file {path} is not a valid JWKS: {exc}") from None
