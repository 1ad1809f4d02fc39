"""Every error as RFC 7807 application/problem+json, mapped in one place.

kernel error / request error      status
ValidationFailed, bad request      422   errors: [{loc, msg}]
Unauthenticated                    401   required_role; WWW-Authenticate: Bearer
Forbidden                          403   required_role
NotFound, unknown route            404
NotEnoughHistory                   409   service, windows_found, windows_needed
Conflict, IllegalTransition        409   current_state when known
StoredValueInvalid                 502   errors: the stored value's fields
BackendUnavailable                 503
other BackendError                 502
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from controlplane.decision.recommend import NotEnoughHistory
from controlplane.experiments.service_rules import StoredValueInvalid
from controlplane.kernel.errors import (
    BackendError,
    BackendUnavailable,
    CanaryError,
    ConfigError,
    Conflict,
    FieldError,
    Forbidden,
    IllegalTransition,
    NotFound,
    Unauthenticated,
    ValidationFailed,
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
        headers = {"Retry-After": "1"}
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


def install(app: FastAPI) -> None:
    """Register the handlers; the rest of the API only raises kernel errors."""

    async def on_canary_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, CanaryError)
        return canary_error_response(exc, request.url.path)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = [
            FieldError(tuple(err.get("loc", ())), str(err.get("msg", "invalid")))
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
