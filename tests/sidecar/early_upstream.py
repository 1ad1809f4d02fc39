"""An HTTP/1.1 upstream that answers a request as soon as its head is in, as Go's
net/http, Node and nginx do for a handler that does not read the body, and then
reads on from where the request's own framing says the next message starts.

`drains=True` (the default): it then reads the declared body (Content-Length bytes,
or the chunked body and its trailers) and discards it, whatever bytes those are;
a request whose declared length exceeds what the proxy sends swallows the next
request's head as its body. `drains=False`: it ignores bodies altogether and parses
the bytes behind a head as the next request, so a body that is a request is answered
as one.

Every head it parses is recorded (`heads`, in order), with the trailers of a chunked
body. Each answer is `200`, Content-Length, the body `answer to <target>`; the target
`/trailers` is answered chunked with `response_trailers` as its trailer section.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Head:
    method: bytes
    target: bytes
    fields: list[tuple[bytes, bytes]]  # names lower-case
    body: bytes = b""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def all(self, name: bytes) -> list[bytes]:
        return [value for low, value in self.fields if low == name]


@dataclass
class EarlyUpstream:
    drains: bool = True
    response_trailers: bytes = b""
    port: int = 0
    heads: list[Head] = field(default_factory=list)
    connections: int = 0
    closed: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    hold: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def targets(self) -> list[bytes]:
        return [head.target for head in self.heads]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.hold.set()
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=5)
            await self._server.wait_closed()
            self._server = None

    async def wait_heads(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.heads) < count:
                self.arrived.clear()
                await self.arrived.wait()

    async def wait_closed(self, count: int) -> None:
        async with asyncio.timeout(5):
            while self.closed < count:
                await asyncio.sleep(0.01)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while True:
                raw = await reader.readuntil(b"\r\n\r\n")
                head = _parse(raw)
                self.heads.append(head)
                self.arrived.set()
                answer = self._answer(head.target)
                if head.target == b"/held":
                    at = answer.index(b"\r\n\r\n") + 4
                    writer.write(answer[:at])
                    await self.hold.wait()
                    answer = answer[at:]
                writer.write(answer)
                await writer.drain()
                if self.drains:
                    await _drain(reader, head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        except (ValueError, asyncio.CancelledError):
            pass  # a head it cannot parse ends the connection, as a real server's would
        finally:
            self.closed += 1
            self._tasks.discard(task)
            writer.close()

    def _answer(self, target: bytes) -> bytes:
        body = b"answer to " + target
        if target == b"/trailers":
            head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            return head + b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, self.response_trailers)
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def _parse(raw: bytes) -> Head:
    lines = raw[:-4].split(b"\r\n")
    method, target, version = lines[0].split(b" ")
    if not version.startswith(b"HTTP/1."):
        raise ValueError(version)
    fields = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields.append((name.strip().lower(), value.strip()))
    return Head(method, target, fields)


async def _drain(reader: asyncio.StreamReader, head: Head) -> None:
    """Read the body the head declares, and nothing else."""
    if b"chunked" in b",".join(head.all(b"transfer-encoding")).lower():
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                break
            head.body += (await reader.readexactly(size + 2))[:-2]
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line[:-2].partition(b":")
            head.trailers.append((name.strip().lower(), value.strip()))
        return
    lengths = head.all(b"content-length")
    if lengths:
        head.body = await reader.readexactly(int(lengths[0]))
