"""Requests with more header fields than the limit are refused with 431.

The server bounds a request head's bytes before the app sees it (`canary serve` runs
uvicorn's h11 parser with a size limit, see controlplane/cli/server.py); within
those bytes a head could still carry thousands of tiny fields, each one work for
every layer that scans them. This counts them once, before authentication.
"""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.api.hygiene import Reject, refuse

MAX_HEADER_FIELDS: Final = 100


class HeaderCountMiddleware:
    def __init__(self, app: ASGIApp, *, reject: Reject, limit: int = MAX_HEADER_FIELDS) -> None:
        self.app = app
        self.reject = reject
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and len(scope.get("headers", ())) > self.limit:
            self.reject("too_many_headers")
            if scope["type"] == "http":
                detail = f"more than {self.limit} header fields"
                await refuse(scope, receive, send, 431, detail, "too-many-headers")
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        await self.app(scope, receive, send)
