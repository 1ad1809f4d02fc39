"""Which methods a path answers, read from the app's routes: OPTIONS lists them, any
other method is 405 with the same `Allow`, before a write's content type is looked at.

Starlette's router answers a method it lacks with the `Allow` of the first route whose
path matches, and a path is often served by several routes (GET and POST of a
collection), so that `Allow` would name one of them; and the JSON-writes check, which
runs before routing, would answer an undeclared PUT with a body 415. A path that no
route with methods matches (an unknown path, a mounted directory) is left to the app.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fastapi.routing import iter_route_contexts
from starlette._utils import get_route_path  # the path as the router matches it
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.api.hygiene import Reject, refuse


@dataclass(frozen=True)
class ServedPath:
    path: str  # the route's template, e.g. /v1/experiments/{experiment_id}
    pattern: re.Pattern[str]
    methods: frozenset[str]


def served_paths(routes: Sequence[BaseRoute]) -> list[ServedPath]:
    """Each path template the routes serve with declared methods (routers included),
    with the union of those methods."""
    found: dict[str, ServedPath] = {}
    for context in iter_route_contexts(routes):
        pattern = getattr(context, "path_regex", None)
        if context.path is None or pattern is None or not context.methods:
            continue  # a mount or a websocket: its own app answers methods
        known = found.get(context.path)
        methods = frozenset(context.methods) | (known.methods if known else frozenset())
        found[context.path] = ServedPath(context.path, pattern, methods)
    return list(found.values())


def allowed_methods(served: Iterable[ServedPath], path: str) -> frozenset[str] | None:
    """Every method declared for `path`, or None when no served path matches it."""
    methods = frozenset().union(*(s.methods for s in served if s.pattern.match(path)))
    return methods or None


def allow_header(methods: frozenset[str]) -> str:
    """The `Allow` of a path: its routes' methods and OPTIONS, which this answers."""
    return ", ".join(sorted(methods | {"OPTIONS"}))


async def _answer_options(send: Send, allow: str) -> None:
    headers = [(b"allow", allow.encode("latin-1")), (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


class MethodsMiddleware:
    """Reads `routes` when built: Starlette builds its middleware at the first request,
    when every route is in."""

    def __init__(self, app: ASGIApp, *, routes: Sequence[BaseRoute], reject: Reject) -> None:
        self.app = app
        self.served = served_paths(routes)
        self.reject = reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        methods = allowed_methods(self.served, get_route_path(scope))
        method = scope["method"]
        if methods is None or method in methods:
            await self.app(scope, receive, send)
            return
        allow = allow_header(methods)
        if method == "OPTIONS":
            await _answer_options(send, allow)
            return
        self.reject("method_not_allowed")
        await refuse(
            scope, receive, send, 405,
            f"{method} is not allowed here; this path answers {allow}",
            "method-not-allowed", headers={"Allow": allow},
        )  # fmt: skip
