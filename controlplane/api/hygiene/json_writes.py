"""Writes (POST, PUT, PATCH, DELETE) must be JSON, so a web page cannot forge them.

A cross-site page can send text/plain, form-encoded or multipart bodies without the
browser asking the server first; application/json, or an Authorization header, makes
the browser send a CORS preflight this API never approves. So:

- a Content-Type other than application/json -> 415;
- no Content-Type: only with an empty body AND a bearer token (a token is not ambient:
  a page cannot make the browser attach it) -> else 415; where every route needs
  credentials, an empty body without any goes on to be refused by the guard (401), so
  an anonymous caller learns that it needs a token, not a content type;
- `Sec-Fetch-Site: cross-site` on a write (a browser telling us so) -> 403.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.api.hygiene import Reject, header, refuse

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def has_body(scope: Scope) -> bool:
    if header(scope, b"transfer-encoding") is not None:
        return True
    length = header(scope, b"content-length")
    return length is not None and length.strip() != "0"


def write_refusal(
    scope: Scope, *, credentials_required: bool = True
) -> tuple[int, str, str] | None:
    """(status, kind, detail) when the write must be refused, else None.

    credentials_required: the routes behind refuse callers without credentials (False
    only when the API runs without authentication)."""
    if (header(scope, b"sec-fetch-site") or "").strip().lower() == "cross-site":
        return 403, "cross-site", "a cross-site request may not change anything"
    content_type = header(scope, b"content-type")
    if content_type is not None:
        if media_type(content_type) != "application/json":
            return 415, "unsupported-media-type", "the body must be application/json"
        return None
    authorization = header(scope, b"authorization")
    if authorization is None and credentials_required and not has_body(scope):
        return None  # the route's guard answers 401
    bearer = (authorization or "").lower().startswith("bearer ")
    if has_body(scope) or not bearer:
        return (
            415,
            "unsupported-media-type",
            "a write needs Content-Type: application/json (or no body and a bearer token)",
        )
    return None


class JsonWritesMiddleware:
    def __init__(self, app: ASGIApp, *, reject: Reject, credentials_required: bool = True) -> None:
        self.app = app
        self.reject = reject
        self.credentials_required = credentials_required

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in WRITES:
            refusal = write_refusal(scope, credentials_required=self.credentials_required)
            if refusal is not None:
                status, kind, detail = refusal
                self.reject(kind.replace("-", "_"))
                await refuse(scope, receive, send, status, detail, kind)
                return
        await self.app(scope, receive, send)
