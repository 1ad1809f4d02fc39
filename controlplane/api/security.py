"""Who may call which route: every route declares one guard, `require(role)` or
`public()`, and `check_guarded(app)` refuses to build an app with a route that has
none. The verified caller lands on `request.state.principal`; the audit trail's actor
comes from there (`ActorDep`), never from a header the client chose.

Credentials, in order: an API token (`cnry_…`, looked up by its hash), else an OIDC JWT
when OIDC is configured. The API-token path never touches the issuer's keys, and the
OIDC path never takes a worker thread (decision 0041). An insecure app (`canary serve
--insecure`) lets a request without credentials act as `anonymous` with the admin role,
and still verifies the credentials a request does carry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import Counter

from controlplane.api.deps import get_backends
from controlplane.api.problems import PROBLEM_JSON
from controlplane.auth.oidc import OidcVerifier
from controlplane.auth.roles import Principal, Role
from controlplane.auth.tokens import PREFIX, looks_like_token
from controlplane.db.tokens import find_live_token
from controlplane.kernel.clock import utc_now
from controlplane.kernel.errors import (
    ConfigError,
    Forbidden,
    IdentityProviderUnavailable,
    Unauthenticated,
)

ANONYMOUS = Principal("anonymous", Role.ADMIN)
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

bearer = HTTPBearer(auto_error=False, description="an API token (cnry_…) or an OIDC JWT")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


@dataclass
class Authenticator:
    """What the guards consult, kept on `app.state.auth`."""

    insecure: bool
    oidc: OidcVerifier | None
    failures: Counter

    async def identify(self, request: Request, credentials: str | None) -> Principal:
        if credentials is None:
            if self.insecure:
                return ANONYMOUS
            self.failures.labels("missing").inc()
            raise Unauthenticated("a bearer token is required")
        if credentials.startswith(PREFIX):
            return await self._api_token(request, credentials)
        if self.oidc is not None:
            # on the event loop: no thread, so a slow issuer holds no database worker
            try:
                return await self.oidc.verify(credentials)
            except Unauthenticated:
                self.failures.labels("oidc").inc()
                raise
            except IdentityProviderUnavailable:
                self.failures.labels("oidc_unavailable").inc()
                raise
        self.failures.labels("malformed").inc()
        raise Unauthenticated("the bearer token is not a canary API token")

    async def aclose(self) -> None:
        if self.oidc is not None:
            await self.oidc.keys.aclose()

    async def _api_token(self, request: Request, token: str) -> Principal:
        if not looks_like_token(token):
            self.failures.labels("malformed").inc()
            raise Unauthenticated("the bearer token is malformed")
        backends = get_backends(request)
        found = await backends.database.read(
            find_live_token, token=token, now=utc_now(backends.clock)
        )
        if found is None:
            self.failures.labels("unknown_or_revoked").inc()
            raise Unauthenticated("the bearer token is unknown or revoked")
        return Principal(f"token:{found.name}", found.role)


Guard = Callable[..., Awaitable[Principal]]


def require(role: Role) -> Any:
    """The dependency of a route that needs `role` (or a higher one)."""

    async def guard(request: Request, credentials: Credentials) -> Principal:
        auth: Authenticator = request.app.state.auth
        try:
            principal = await auth.identify(
                request, credentials.credentials if credentials else None
            )
        except Unauthenticated as exc:
            raise Unauthenticated(
                f"{exc}; this needs the {role.value} role", required_role=role.value
            ) from None
        if not principal.may(role):
            has = principal.role.value if principal.role else "no role"
            raise Forbidden(
                f"this needs the {role.value} role; {principal.actor} has {has}",
                required_role=role.value,
            )
        request.state.principal = principal
        return principal

    guard.required_role = role  # type: ignore[attr-defined]
    return Depends(guard)


def public() -> Any:
    """The dependency of a route anyone may call (health checks)."""

    async def guard() -> None:
        return None

    guard.required_role = None  # type: ignore[attr-defined]
    return Depends(guard)


def get_actor(request: Request) -> str:
    """The verified caller the audit trail names (set by the route's guard)."""
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None:
        # a writing route without a guard would be a bug; check_guarded prevents it
        raise ConfigError("no verified caller on a route that records an actor")
    return principal.actor


ActorDep = Annotated[str, Depends(get_actor)]

_MISSING = object()


def _role_of(dependant: Any) -> Role | object | None:
    """The role a route's guard needs, None for a public route, _MISSING for none."""
    for dependency in getattr(dependant, "dependencies", ()):
        role = getattr(dependency.call, "required_role", _MISSING)
        if role is not _MISSING:
            return role
    return _MISSING


def api_routes(app: FastAPI) -> list[RouteContext]:
    """Every API route as served (with its routers' dependencies and prefixes)."""
    return [c for c in iter_route_contexts(app.routes) if isinstance(c.original_route, APIRoute)]


def route_roles(app: FastAPI) -> dict[tuple[str, str], Role | None]:
    """(method, path) -> the role it needs (None: public), for every API route."""
    roles: dict[tuple[str, str], Role | None] = {}
    for context in api_routes(app):
        role = _role_of(context.dependant)
        if role is _MISSING:
            raise ConfigError(f"route {context.path} declares no role (require or public)")
        assert role is None or isinstance(role, Role)
        for method in context.methods or ():
            roles[(method, str(context.path))] = role
    return roles


def check_guarded(app: FastAPI, open_paths: Iterable[str]) -> None:
    """Refuse an app with a route that declares no role; other routes (the docs pages)
    must be among `open_paths`."""
    allowed = set(open_paths)
    for context in iter_route_contexts(app.routes):
        if not isinstance(context.original_route, APIRoute) and context.path not in allowed:
            raise ConfigError(f"route {context.path} is neither an API route nor an open page")
    route_roles(app)


PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "required_role": {"type": "string"},
    },
}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {PROBLEM_JSON: {"schema": PROBLEM_SCHEMA}}}


def document(app: FastAPI) -> None:
    """Add the statuses the guards and the request-hygiene middleware answer with to
    every route's OpenAPI responses."""
    for context in api_routes(app):
        extra = {400: _problem("the Host header names no trusted host")}
        if _role_of(context.dependant) is not None:
            extra[401] = _problem("no credentials, or ones that do not verify")
            extra[403] = _problem("the caller lacks the role this route needs")
        if (context.methods or set()) & WRITE_METHODS:
            extra[413] = _problem("the body is larger than the configured limit")
            extra[415] = _problem("the body is not application/json")
            extra[403] = _problem("the caller lacks the role, or the request is cross-site")
        # the served route's responses are a copy of the declared route's: set both
        declared: dict[int | str, Any] = getattr(context.original_route, "responses", {})
        for responses in (context.responses, declared):
            for status, response in extra.items():
                responses.setdefault(status, response)
