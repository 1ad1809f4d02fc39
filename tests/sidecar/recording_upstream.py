"""An upstream that records exactly what reached it, parsed by h11 (not by httptools,
which the proxy uses): every complete request, every request head whose body never
completed, and the raw bytes of each connection.

It answers each request `200` with the body `answer to <target>`, keep-alive. Targets
starting with `/slow` are answered only once `release` is set. `early` maps a target to
raw bytes sent as soon as its head is in, before its body (which is then drained);
`canned` maps a target to raw bytes sent instead of the normal answer; the connection
then only waits for the proxy to close it (`closed` counts that).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import h11


@dataclass
class Received:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    complete: bool = False

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name.lower()]


@dataclass
class RecordingUpstream:
    port: int = 0
    heads: list[Received] = field(default_factory=list)  # in arrival order
    raw: list[bytearray] = field(default_factory=list)  # bytes per connection
    errors: list[str] = field(default_factory=list)  # what h11 refused
    closed: int = 0  # connections that ended
    release: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    early: dict[str, bytes] = field(default_factory=dict)
    canned: dict[str, bytes] = field(default_factory=dict)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def complete(self) -> list[Received]:
        return [r for r in self.heads if r.complete]

    @property
    def connections(self) -> int:
        return len(self.raw)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=5)
            await self._server.wait_closed()
            self._server = None

    async def wait_closed(self, count: int) -> None:
        """Until `count` connections have ended."""
        async with asyncio.timeout(5):
            while self.closed < count:
                await asyncio.sleep(0.01)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        raw = bytearray()
        self.raw.append(raw)
        conn = h11.Connection(h11.SERVER)
        current: Received | None = None
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    raw += data
                    conn.receive_data(data)
                    if not data:
                        return
                    continue
                if isinstance(event, h11.Request):
                    current = Received(
                        event.method.decode(),
                        event.target.decode("latin-1"),
                        [(k.decode(), v.decode("latin-1")) for k, v in event.headers],
                    )
                    self.heads.append(current)
                    self.arrived.set()
                    early = self.early.get(current.target)
                    if early is not None:
                        writer.write(early)
                        await writer.drain()
                elif isinstance(event, h11.Data) and current is not None:
                    current.body += bytes(event.data)
                elif isinstance(event, h11.EndOfMessage) and current is not None:
                    current.complete = True
                    if current.target in self.early:
                        return  # answered already, and said it closes
                    if not await self._answer(current, conn, reader, writer):
                        return
                    conn.start_next_cycle()
                    current = None
                elif isinstance(event, h11.ConnectionClosed):
                    return
        except h11.RemoteProtocolError as exc:
            self.errors.append(str(exc))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.closed += 1
            self._tasks.discard(task)
            writer.close()

    async def _answer(
        self,
        request: Received,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer; False when the connection closes after it (canned answers)."""
        if request.target.startswith("/slow"):
            await self.release.wait()
        canned = self.canned.get(request.target)
        if canned is not None:
            writer.write(canned)
            await writer.drain()
            while await reader.read(65536):  # the connection ends when the proxy ends it
                pass
            return False
        body = f"answer to {request.target}".encode()
        head = h11.Response(status_code=200, headers=[("Content-Length", str(len(body)))])
        for event in (head, h11.Data(data=body), h11.EndOfMessage()):
            writer.write(conn.send(event) or b"")
        await writer.drain()
        return True
