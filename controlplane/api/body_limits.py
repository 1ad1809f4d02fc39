"""Request bodies the API takes: JSON only, at most MAX_BODY_BYTES.

An ASGI middleware rather than per-route checks, so a large or non-JSON body is
refused (413, 415 as problem+json) before anything parses it. The body is read up to
the limit, counted whatever Content-Length claims, and replayed to the app.
"""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.api.problems import problem

MAX_BODY_BYTES: Final = 256 * 1024  # an experiment with 100 steps is under 10 KiB
_WITH_BODY: Final = frozenset({"POST", "PUT", "PATCH"})


def is_json(content_type: str) -> bool:
    """application/json or any application/*+json, parameters ignored."""
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


class BodyLimits:
    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in _WITH_BODY:
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        declared = headers.get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send, path)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send, path)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        if body and not is_json(content_type):
            response = problem(
                415,
                detail="request bodies are JSON (Content-Type: application/json)",
                kind="unsupported-media-type",
                instance=path,
            )
            await response(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        response = problem(
            413,
            detail=f"request body larger than {self.max_bytes} bytes",
            kind="content-too-large",
            instance=path,
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)
