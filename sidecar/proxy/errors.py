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
) -> bytes:
    """A complete HTTP/1.1 response, head and body."""
    phrase = HTTPStatus(status).phrase
    problem: dict[str, object] = {
        "type": "about:blank",
        "title": phrase,
        "status": status,
        "detail": detail,
    }
    if variant is not None:
        problem["variant"] = variant
    if experiment is not None:
        problem["experiment"] = experiment
    body = json.dumps(problem, separators=(",", ":")).encode()
    head = [
        f"HTTP/1.1 {status} {phrase}",
        "Content-Type: application/problem+json",
        f"Content-Length: {len(body)}",
    ]
    if variant is not None:
        head.append(f"X-Canary-Variant: {variant}")
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


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


def bad_request(detail: str) -> bytes:
    return problem_response(400, detail, variant=None, experiment=None, close=True)


def head_too_large(limit: int) -> bytes:
    return problem_response(
        431,
        f"request line and headers exceed {limit} bytes",
        variant=None,
        experiment=None,
        close=True,
    )
