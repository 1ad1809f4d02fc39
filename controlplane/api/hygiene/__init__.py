"""Request hygiene, one pure ASGI middleware per concern (decision 0008):

    trusted_hosts   a Host header naming no trusted host -> 400 (DNS rebinding)
    methods         OPTIONS -> 204 with the path's Allow; a method the path lacks -> 405
    json_writes     a write that is not application/json -> 415, a cross-site one -> 403
    body_limit      a body over the limit -> 413, refused while it streams
    header_count    more header fields than the limit -> 431

Each refusal is problem+json and counted in `canary_api_rejected_requests{reason}`.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import Receive, Scope, Send

from controlplane.api.problems import problem

Reject = Callable[[str], None]


async def refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    detail: str,
    kind: str,
    headers: dict[str, str] | None = None,
) -> None:
    response = problem(
        status, detail=detail, kind=kind, instance=scope.get("path"), headers=headers
    )
    await response(scope, receive, send)


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a header, as latin-1 text (how HTTP/1.1 defines its bytes)."""
    for key, value in scope.get("headers", ()):
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return None
