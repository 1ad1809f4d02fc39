"""Every error as RFC 7807 application/problem+json, mapped in one place.

    kernel error / request error      status
    ValidationFailed, bad request      422   errors: [{loc, msg}]
    Unauthenticated                    401   required_role; WWW-Authenticate: Bearer
    Forbidden                          403   required_role
    NotFound, unknown route            404
    NotEnoughHistory                   409   service, windows_found, windows_needed
    Conflict, IllegalTransition        409   current_state when known
    StoredValueInvalid                 502   errors: the stored value's fields
    IdentityProviderUnavailable        503   (no OIDC keys to verify a token with)
    BackendUnavailable                 503
    other BackendError                 502
    anything else (a bug)              500   generic detail + correlation_id (logged)

`problem_responses(...)` is how routes declare these in the OpenAPI document: every
status a route can answer with, as application/problem+json with the `Problem` schema.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.decision.recommend import NotEnoughHistory
from controlplane.experiments.service_configs import StoredValueInvalid
from controlplane.kernel.errors import (
    BackendError,
    BackendUnavailable,
    CanaryError,
    ConfigError,
    Conflict,
    FieldError,
    Forbidden,
    IdentityProviderUnavailable,
    IllegalTransition,
    NotFound,
    Unauthenticated,
    ValidationFailed,
    plain_message,
)

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
PROBLEM_BASE = "urn:canary:problem:"  # a name, not a page to fetch

_STATUS: list[tuple[type[CanaryError], int, str]] = [
    (ValidationFailed, 422, "validation-failed"),
    (Unauthenticated, 401, "unauthenticated"),
    (Forbidden, 403, "forbidden"),
    (NotFound, 404, "not-found"),
    (NotEnoughHistory, 409, "insufficient-history"),
    (IllegalTransition, 409, "illegal-transition"),
    (Conflict, 409, "conflict"),
    (StoredValueInvalid, 502, "stored-value-invalid"),
    (IdentityProviderUnavailable, 503, "identity-provider-unavailable"),
    (BackendUnavailable, 503, "backend-unavailable"),
    (BackendError, 502, "backend-error"),
    (ConfigError, 500, "configuration-error"),
]

TITLES = {
    400: "Bad request",
    401: "Unauthenticated",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Content too large",
    415: "Unsupported media type",
    422: "Invalid request",
    500: "Internal error",
    502: "Bad gateway",
    503: "Service unavailable",
}


class ProblemFieldError(BaseModel):
    loc: list[str | int]
    msg: str


class Problem(BaseModel):
    """RFC 7807 problem details; some problems carry more members (current_state, …)."""

    model_config = ConfigDict(extra="allow", title="Problem")

    type: str = Field(examples=["urn:canary:problem:validation-failed"])
    title: str
    status: int = Field(ge=100, le=599)
    detail: str
    instance: str | None = None
    errors: list[ProblemFieldError] | None = Field(
        default=None, description="the fields at fault, for 422 and stored-value errors"
    )
    correlation_id: str | None = Field(
        default=None, description="on 500: quote it to operators, it is in their logs"
    )


_DESCRIPTIONS = {
    400: "malformed request",
    404: "no such resource",
    409: "not allowed in the current state, or a concurrent change",
    413: "request body too large",
    415: "request body is not JSON",
    422: "invalid parameters or body (the fields are named)",
    500: "unexpected error (a correlation id is logged with it)",
    502: "a stored value or a backend answer is invalid",
    503: "a backend is unavailable; nothing was changed",
}

# Statuses any route may answer with. Authentication adds 401 and 403 here.
ALWAYS: tuple[int, ...] = (400, 404, 422, 500, 503)
# ... and routes that take a request body.
WITH_BODY: tuple[int, ...] = (413, 415)

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def problem_responses(
    *statuses: int, body: bool = False, notes: dict[int, str] | None = None
) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route: ALWAYS, WITH_BODY when `body`, plus `statuses`."""
    codes = sorted({*ALWAYS, *(WITH_BODY if body else ()), *statuses})
    notes = notes or {}
    return {
        code: {
            "description": notes.get(code, _DESCRIPTIONS.get(code, TITLES.get(code, "error"))),
            "content": {PROBLEM_JSON: {"schema": PROBLEM_REF}},
        }
        for code in codes
    }


def problem(
    status: int,
    *,
    detail: str,
    kind: str = "about:blank",
    instance: str | None = None,
    errors: Sequence[FieldError] | None = None,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": kind if kind == "about:blank" else PROBLEM_BASE + kind,
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    if errors is not None:
        body["errors"] = [{"loc": list(e.loc), "msg": e.msg} for e in errors]
    body.update(extensions)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def canary_error_response(exc: CanaryError, instance: str | None) -> JSONResponse:
    status, kind = 500, "internal-error"
    for cls, code, name in _STATUS:
        if isinstance(exc, cls):
            status, kind = code, name
            break
    extensions: dict[str, Any] = {}
    current = getattr(exc, "current", None)
    if isinstance(exc, Conflict) and isinstance(current, str):
        extensions["current_state"] = current
    # machine-readable numbers an error carries beyond its text (e.g. windows found)
    more = getattr(exc, "problem_extensions", None)
    if isinstance(more, dict):
        extensions.update(more)
    role = getattr(exc, "required_role", None)
    if isinstance(role, str):
        extensions["required_role"] = role
    headers: dict[str, str] | None = None
    if status == 503:
        retry = getattr(exc, "retry_after_sec", 1)
        headers = {"Retry-After": str(retry if isinstance(retry, int) and retry > 0 else 1)}
    elif status == 401:
        # RFC 6750: the scheme, and whether the credentials given were wrong
        headers = {"WWW-Authenticate": 'Bearer realm="canary"'}
    errors = getattr(exc, "errors", None)
    if status >= 500:
        log.warning("%s answered %d: %s", instance, status, exc)
    detail = exc.message if isinstance(exc, ValidationFailed) else str(exc)
    return problem(
        status,
        detail=detail,
        kind=kind,
        instance=instance,
        errors=list(errors) if errors is not None else None,
        headers=headers,
        **extensions,
    )


class CatchAll:
    """ASGI middleware: an exception nothing else handled becomes a problem+json 500.

    The client gets a generic detail and a correlation id; the log gets the same id with
    the traceback. Nothing of the exception (SQL, constraint names, values) is sent.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            correlation = uuid.uuid4().hex
            path = str(scope.get("path", ""))
            log.exception("internal error %s on %s %s", correlation, scope.get("method"), path)
            if started:
                raise  # too late for an answer: the server drops the connection
            response = problem(
                500,
                detail=f"internal error; correlation id {correlation}",
                kind="internal-error",
                instance=path,
                headers={"X-Correlation-Id": correlation},
                correlation_id=correlation,
            )
            await response(scope, receive, send)


def install(app: FastAPI) -> None:
    """Register the handlers; the rest of the API only raises kernel errors."""

    async def on_canary_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, CanaryError)
        return canary_error_response(exc, request.url.path)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = [
            FieldError(tuple(err.get("loc", ())), plain_message(err.get("msg", "invalid")))
            for err in exc.errors()
        ]
        paths = ", ".join(e.path for e in errors[:5])
        return problem(
            422,
            detail=f"invalid request: {paths}",
            kind="validation-failed",
            instance=request.url.path,
            errors=errors,
        )

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return problem(
            exc.status_code,
            detail=str(exc.detail),
            instance=request.url.path,
            headers=dict(exc.headers) if exc.headers else None,
        )

    app.add_exception_handler(CanaryError, on_canary_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_middleware(CatchAll)
    _document(app)


def _document(app: FastAPI) -> None:
    """Put the Problem schema into the document's components (routes refer to it)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            problem_schema = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in problem_schema.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components["Problem"] = problem_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
