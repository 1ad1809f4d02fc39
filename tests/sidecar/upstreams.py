"""Real upstream HTTP servers for the proxy tests, on free ports of 127.0.0.1.

Plain asyncio streams and a hand-rolled HTTP/1.1 reader, so the upstream shares
nothing with the proxy it tests. Paths:

    /echo…          200 JSON: method, target, headers (in order), body length
    /status/<n>     answers status n
    /download/<n>   n bytes, chunked (or with Content-Length when ?length=1)
    /until-close/<n> n bytes without a length, ended by closing the connection
    /upload         reads the body, reports its length; `upload_started` is set on the
                    first body byte
    /slow           answers only when `release` is set
    /close          closes the connection without answering
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

_CHUNK = 64 * 1024


@dataclass
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


@dataclass
class Upstream:
    name: str
    host: str = "127.0.0.1"
    port: int = 0
    connections: int = 0  # connections accepted so far
    requests: list[Request] = field(default_factory=list)
    upload_started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # a request head came in
    download_sent: int = 0
    tls: ssl.SSLContext | None = None  # serve https with this context
    close_next: int = 0  # close the connection on this many next request heads
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            # handlers see their connection gone and return; none is left pending
            if self._handlers:
                await asyncio.wait(self._handlers, timeout=5)
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            self._handlers.discard(task)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = [(k, v.strip()) for k, v in (line.split(":", 1) for line in lines[1:] if line)]
        request = Request(method, target, headers)
        self.requests.append(request)
        self.arrived.set()
        path = urlsplit(target).path
        if path == "/close":
            return False
        if self.close_next:
            self.close_next -= 1
            return False
        body_len = 0
        async for chunk in _body(reader, request):
            if path == "/upload" and not self.upload_started.is_set():
                self.upload_started.set()
            body_len += len(chunk)
        if path == "/slow":
            await self.release.wait()
        if path.startswith("/until-close/"):
            # no length, no chunks: the body ends when the connection does
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            writer.write(b"c" * int(path.rsplit("/", 1)[1]))
            await writer.drain()
            return False
        if path.startswith("/download/"):
            await self._download(writer, int(path.rsplit("/", 1)[1]), target)
            return True
        status = int(path.rsplit("/", 1)[1]) if path.startswith("/status/") else 200
        payload = {
            "upstream": self.name,
            "method": method,
            "target": target,
            "headers": headers,
            "body_len": body_len,
        }
        body = json.dumps(payload).encode()
        extra = [
            ("Content-Type", "application/json"),
            ("X-Upstream", self.name),
            ("Keep-Alive", "timeout=5"),
            ("Connection", "keep-alive, x-upstream-hop"),
            ("X-Upstream-Hop", "drop me"),
            ("X-Canary-Variant", "spoofed-by-upstream"),
        ]
        out = [f"HTTP/1.1 {status} Whatever"] + [f"{k}: {v}" for k, v in extra]
        if method == "HEAD":
            out.append(f"Content-Length: {len(body)}")
            body = b""
        elif status not in (204, 304):
            out.append(f"Content-Length: {len(body)}")
        else:
            body = b""
        writer.write(("\r\n".join(out) + "\r\n\r\n").encode() + body)
        await writer.drain()
        return True

    async def _download(self, writer: asyncio.StreamWriter, size: int, target: str) -> None:
        with_length = parse_qs(urlsplit(target).query).get("length") == ["1"]
        framing = f"Content-Length: {size}" if with_length else "Transfer-Encoding: chunked"
        writer.write(f"HTTP/1.1 200 OK\r\n{framing}\r\n\r\n".encode())
        piece = b"x" * _CHUNK
        self.download_sent = 0
        while self.download_sent < size:
            data = piece[: min(_CHUNK, size - self.download_sent)]
            writer.write(data if with_length else b"%x\r\n%s\r\n" % (len(data), data))
            self.download_sent += len(data)
            await writer.drain()  # the proxy's flow control shows up here
        if not with_length:
            writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _body(reader: asyncio.StreamReader, request: Request) -> AsyncIterator[bytes]:
    if (request.header("transfer-encoding") or "").lower().endswith("chunked"):
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                return
            remaining = size
            while remaining:
                chunk = await reader.read(min(remaining, _CHUNK))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(chunk)
                yield chunk
            await reader.readexactly(2)
    else:
        remaining = int(request.header("content-length") or 0)
        while remaining:
            chunk = await reader.read(min(remaining, _CHUNK))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(chunk)
            yield chunk
