"""`CanaryMiddleware`: samples from inside an ASGI app, without a proxy hop.

For a FastAPI/Starlette service deployed behind a sidecar (or a gateway) that
already assigned the variant: the middleware times the wrapped app, takes the
variant and experiment from the incoming `X-Canary-Variant` / `X-Canary-Experiment`
headers, and records one sample per HTTP request through a `Recorder` (normally the
same `SampleReporter` a sidecar uses). The status is the one the app started its
response with; an app that raises is recorded as a 500 and the error propagates.

    app.add_middleware(CanaryMiddleware, reporter=reporter, service="checkout")
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.codec import ABORTED
from sidecar.choice import Recorder

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

VARIANT_HEADER = b"x-canary-variant"
EXPERIMENT_HEADER = b"x-canary-experiment"
UNTAGGED_VARIANT = "untagged"


class CanaryMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        reporter: Recorder,
        service: str,
        default_variant: str = UNTAGGED_VARIANT,
        clock: Clock | None = None,
    ) -> None:
        self.app = app
        self.reporter = reporter
        self.service = service
        self.default_variant = default_variant
        self.clock: Clock = clock or SystemClock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        variant = self.default_variant
        experiment: str | None = None
        for name, value in scope.get("headers", ()):
            # ASGI servers hand header names over lower-cased
            if name == VARIANT_HEADER:
                variant = value.decode("latin-1") or variant
            elif name == EXPERIMENT_HEADER:
                experiment = value.decode("latin-1") or None

        status = 500  # what is recorded when the app fails before it starts a response
        clock = self.clock
        started = clock.monotonic()
        ts = clock.now()
        first_byte: float | None = None

        async def send_with_status(message: Message) -> None:
            nonlocal status, first_byte
            if message["type"] == "http.response.start":
                status = int(message["status"])
                await send(message)
                first_byte = clock.monotonic()
                return
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        except asyncio.CancelledError:
            status = ABORTED  # the server gave up on the request (client gone)
            raise
        except Exception:
            status = 500
            raise
        finally:
            rt_us = int((clock.monotonic() - started) * 1_000_000)
            first_us = None if first_byte is None else int((first_byte - started) * 1_000_000)
            self.reporter.record(ts, experiment, variant, rt_us, status, 0, first_us)
