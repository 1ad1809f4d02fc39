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
    def __init__(self, app: ASGIApp, *, limit: int, reject: Reject) -> None:
        self.app = app
        self.limit = limit
        self.reject = reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = header(scope, b"content-length")
        if declared is not None:
            text = declared.strip()
            if not text.isdigit() or len(text) > 20:
                self.reject("bad_content_length")
                await refuse(scope, receive, send, 400, "malformed Content-Length", "bad-request")
                return
            if int(text) > self.limit:
                self.reject("body_too_large")
                await refuse(scope, receive, send, 413, BodyTooLarge(self.limit).detail,
                             "body-too-large")  # fmt: skip
                return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    self.reject("body_too_large")
                    raise BodyTooLarge(self.limit)
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
