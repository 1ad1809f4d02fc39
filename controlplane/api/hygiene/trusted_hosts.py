"""Answer only requests whose Host names a trusted host.

A DNS-rebinding page makes a browser send requests to 127.0.0.1 under the attacker's
host name; the Host header still carries that name, so refusing unknown names closes
it. Starlette's TrustedHostMiddleware does the same with a plain-text answer; this
one answers problem+json and counts the refusal.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.api.hygiene import Reject, header, refuse

MAX_HOST_CHARS = 255


def host_name(value: str) -> str | None:
    """'Example.com:8080' -> 'example.com', '[::1]:80' -> '::1'; None if malformed."""
    value = value.strip().lower()
    if not value or len(value) > MAX_HOST_CHARS:
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        rest = value[end + 1 :]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
        return value[1:end]
    name, sep, port = value.partition(":")
    if sep and not port.isdigit():
        return None
    return name.rstrip(".") or None


def host_allowed(name: str, trusted: Iterable[str]) -> bool:
    for pattern in trusted:
        if pattern == "*" or pattern == name:
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]) and len(name) > len(pattern) - 1:
            return True
    return False


class TrustedHostsMiddleware:
    def __init__(self, app: ASGIApp, *, trusted: Iterable[str], reject: Reject) -> None:
        self.app = app
        self.trusted = [t.strip("[]").lower() for t in trusted]
        self.reject = reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        name = host_name(header(scope, b"host") or "")
        if name is None or not host_allowed(name, self.trusted):
            self.reject("untrusted_host")
            await refuse(
                scope, receive, send, 400,
                "the Host header names no trusted host (see CANARY_TRUSTED_HOSTS)",
                "untrusted-host",
            )  # fmt: skip
            return
        await self.app(scope, receive, send)
