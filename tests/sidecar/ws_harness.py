"""WebSocket servers as the two variants of a route, and the sidecar's proxy with its
own route table (50/50, sticky by `x-user-id`) in front of them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from websockets.asyncio.client import connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants
from sidecar.assignment import bucket
from sidecar.proxy import ProxyOptions, ProxyServer
from sidecar.routing import RouteTable
from tests.sidecar.proxy_harness import ListRecorder

SALT = "ws-exp"
BIG = 8 * 1024 * 1024


@dataclass
class WsUpstream:
    """A websockets server that greets with its name and echoes what it receives."""

    name: str
    server: Server | None = None
    closes: list[tuple[int, str]] | None = None
    flood: int = 0  # bytes of 256 KiB messages to send after the greeting
    flood_sent: int = 0

    async def start(self) -> None:
        self.closes = []
        self.server = await serve(
            self._handle, "127.0.0.1", 0, max_size=BIG + 1024, compression=None
        )

    @property
    def url(self) -> str:
        assert self.server is not None
        port = next(iter(self.server.sockets)).getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _handle(self, ws: ServerConnection) -> None:
        assert self.closes is not None
        await ws.send(f"hello from {self.name}")
        piece = b"f" * (256 * 1024)
        while self.flood_sent < self.flood:
            await ws.send(piece)  # returns once the transport takes it: backpressure
            self.flood_sent += len(piece)
        try:
            async for message in ws:
                if message == "close-from-server":
                    await ws.close(4001, "server says bye")
                    break
                await ws.send(message)
        except ConnectionClosed:
            pass
        if ws.close_code is not None:
            self.closes.append((ws.close_code, ws.close_reason or ""))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def user_for(variant: str) -> str:
    """A user the 50/50 route sends to `variant` (assignment is a published hash)."""
    for i in range(1000):
        user = f"user-{i}"
        if (bucket(SALT, user) < 5000) == (variant == "canary"):
            return user
    raise AssertionError("no user found")


@dataclass
class Setup:
    baseline: WsUpstream
    canary: WsUpstream
    proxy: ProxyServer
    recorder: ListRecorder

    def connect(self, user: str, **kwargs: object) -> connect:
        return connect(
            f"ws://127.0.0.1:{self.proxy.port}/chat",
            additional_headers={"x-user-id": user},
            proxy=None,
            ping_interval=None,
            max_size=BIG + 1024,
            compression=None,  # the bytes counted are the bytes sent
            **kwargs,  # type: ignore[arg-type]
        )


@asynccontextmanager
async def setup(options: ProxyOptions | None = None) -> AsyncIterator[Setup]:
    baseline, canary = WsUpstream("baseline"), WsUpstream("canary")
    await baseline.start()
    await canary.start()
    table = RouteTable()
    table.apply(
        Route(
            experiment="ws-1",
            revision=1,
            salt=SALT,
            sticky=Sticky(header="x-user-id"),
            variants=two_way_variants(baseline.url, canary.url, 5000),
            state=RouteState.RUNNING,
        )
    )
    recorder = ListRecorder()
    proxy = ProxyServer(table, recorder, options=options or ProxyOptions(read_timeout=10))
    await proxy.start("127.0.0.1", 0)
    try:
        yield Setup(baseline, canary, proxy, recorder)
    finally:
        await proxy.stop(timeout=2)
        await baseline.stop()
        await canary.stop()
