"""Bodies larger than the limit are refused with 413, never held in memory.

A Content-Length over the limit is refused before a byte is read; a chunked body is
counted as it streams and refused at the chunk that crosses the limit. The crossing
is raised from `receive` as an HTTPException, which FastAPI passes on to the app's
problem+json handler; if it escapes the app instead, it is answered here.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.api.hygiene import Reject, header, refuse


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the body is larger than {limit} bytes")


class BodyLimitMiddleware:
    """`limit` for every path, except the paths in `larger`, which name their own
    (the one-shot judge takes whole sample sets, megabytes of JSON)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        reject: Reject,
        larger: dict[str, int] | None = None,
    ) -> None:
        self.app = app
        self.default_limit = limit
        self.larger = larger or {}
        self.reject = reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = max(self.default_limit, self.larger.get(scope.get("path", ""), 0))
        declared = header(scope, b"content-length")
        if declared is not None:
            text = declared.strip()
            if not text.isdigit() or len(text) > 20:
                self.reject("bad_content_length")
                await refuse(scope, receive, send, 400, "malformed Content-Length", "bad-request")
                return
            if int(text) > limit:
                self.reject("body_too_large")
                await refuse(scope, receive, send, 413, BodyTooLarge(limit).detail,
                             "body-too-large")  # fmt: skip
                return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    self.reject("body_too_large")
                    raise BodyTooLarge(limit)
            return message

        async def noting(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, noting)
        except BodyTooLarge as exc:
            if started:
                raise
            await refuse(scope, receive, send, 413, exc.detail, "body-too-large")
