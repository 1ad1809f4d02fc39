"""The proxy's own answers: short RFC 9457 problem+json bodies naming the variant."""

from __future__ import annotations

import json
from http import HTTPStatus


def problem_response(
    status: int,
    detail: str,
    *,
    variant: str | None,
    experiment: str | None,
    close: bool,
    extra: tuple[str, ...] = (),
) -> bytes:
    """A complete HTTP/1.1 response, head and body; `extra`: more "Name: value" fields."""
    phrase = HTTPStatus(status).phrase
    body = problem_body(status, detail, variant=variant, experiment=experiment)
    head = [
        f"HTTP/1.1 {status} {phrase}",
        "Content-Type: application/problem+json",
        f"Content-Length: {len(body)}",
    ]
    if variant is not None:
        head.append(f"X-Canary-Variant: {variant}")
    head += extra
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def problem_body(status: int, detail: str, *, variant: str | None, experiment: str | None) -> bytes:
    """The problem+json body of an answer from the proxy itself."""
    problem: dict[str, object] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if variant is not None:
        problem["variant"] = variant
    if experiment is not None:
        problem["experiment"] = experiment
    return json.dumps(problem, separators=(",", ":")).encode()


def bad_gateway(variant: str, experiment: str | None, reason: str, *, close: bool) -> bytes:
    return problem_response(
        502,
        f"upstream of variant {variant!r} failed: {reason}",
        variant=variant,
        experiment=experiment,
        close=close,
    )


def gateway_timeout(variant: str, experiment: str | None, reason: str, *, close: bool) -> bytes:
    return problem_response(
        504,
        f"upstream of variant {variant!r} timed out: {reason}",
        variant=variant,
        experiment=experiment,
        close=close,
    )


def no_route(detail: str, *, close: bool) -> bytes:
    return problem_response(
        503,
        detail or "no route for this service and no default upstream",
        variant=None,
        experiment=None,
        close=close,
    )


# RFC 9110 §15.5.6: a 405 names the methods that are allowed
_ALLOW = "Allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE"


def rejected(status: int, detail: str) -> bytes:
    """A request the proxy refuses to forward; the connection closes after it."""
    extra = (_ALLOW,) if status == 405 else ()
    return problem_response(status, detail, variant=None, experiment=None, close=True, extra=extra)


def too_many_connections(limit: int, retry_after: int) -> bytes:
    return problem_response(
        503,
        f"the sidecar holds its maximum of {limit} client connections; retry later",
        variant=None,
        experiment=None,
        close=True,
        extra=(f"Retry-After: {retry_after}",),
    )


def too_many_client_connections(limit: int) -> bytes:
    return problem_response(
        503,
        f"this client holds the maximum of {limit} connections; close one or retry later",
        variant=None,
        experiment=None,
        close=True,
        extra=("Retry-After: 1",),
    )


def head_timeout(seconds: float) -> bytes:
    return problem_response(
        408,
        f"the request head did not arrive within {seconds:g} s",
        variant=None,
        experiment=None,
        close=True,
    )


def too_many_tunnels(limit: int, *, draining: bool) -> bytes:
    """An upgrade refused before it reaches an upstream; the connection closes."""
    detail = (
        "the sidecar is shutting down and opens no more tunnels"
        if draining
        else f"the sidecar holds its maximum of {limit} upgraded connections; retry later"
    )
    return problem_response(
        503, detail, variant=None, experiment=None, close=True, extra=("Retry-After: 1",)
    )
