"""Headers that lock the dashboard's and the docs' pages to this origin.

The Content-Security-Policy allows scripts, styles and fetches from this origin only
and no inline script: an injected `<script>` or event handler does not run, so a
string an attacker managed to store (an experiment name, an event reason) cannot
reach the token in sessionStorage. Images may also be data: URIs (Swagger UI's icons).
The page may not be framed (clickjacking on the action buttons).
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}


class PageHeadersMiddleware:
    def __init__(self, app: ASGIApp, *, prefixes: Iterable[str]) -> None:
        self.app = app
        self.prefixes = tuple(prefixes)

    def _covers(self, path: str) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._covers(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
                headers.setdefault("Cache-Control", "no-cache")
            await send(message)

        await self.app(scope, receive, send_with_headers)
