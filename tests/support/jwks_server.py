"""A JWKS server on a real socket whose answers a test scripts: it can hold a request
unanswered until told, answer garbage, or answer keys; it counts its connections."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


def http_answer(
    body: bytes, status: int = 200, content_type: str = "application/json", length: bool = True
) -> bytes:
    head = [f"HTTP/1.1 {status} X", f"Content-Type: {content_type}", "Connection: close"]
    if length:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass
class Issuer:
    """A JWKS server on a real socket. It reads a request, writes `first`; with `hold`
    it then waits until the test sets `release`; then it writes `answer`."""

    answer: bytes = b""
    first: bytes = b""
    hold: bool = False
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    answered: int = 0
    accepted: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.accepted.set()
            writer.write(self.first)
            if self.hold:
                await self.release.wait()
            writer.write(self.answer)
            await writer.drain()
            self.answered += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open_now -= 1
            writer.close()

    def answer_now(self, answer: bytes) -> None:
        self.answer = answer
        self.release.set()


@asynccontextmanager
async def serving(issuer: Issuer) -> AsyncIterator[Issuer]:
    """The issuer listening on a free loopback port (its `url` set) until the block ends."""
    server = await asyncio.start_server(issuer.handle, "127.0.0.1", 0)
    issuer.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/jwks.json"
    try:
        yield issuer
    finally:
        issuer.release.set()
        server.close()
        await server.wait_closed()
