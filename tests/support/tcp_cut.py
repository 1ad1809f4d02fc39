"""A TCP relay a test can cut and heal: a network partition between one client and a server.

Bytes pass through unchanged; `cut()` drops every open connection and refuses new
ones (the port closes), `heal()` listens again on the same port. Used to lose a
client's etcd watch while the test goes on writing to etcd directly.
"""

from __future__ import annotations

import asyncio
import contextlib

from tests.support.processes import free_port

_CHUNK = 65_536


class TcpCut:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.StreamWriter] = set()
        self._relays: set[asyncio.Task[None]] = set()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def heal(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        # closed as a dropped peer closes them; the relays end with their sockets
        for writer in list(self._transports):
            writer.close()
        self._transports.clear()
        relays, self._relays = set(self._relays), set()
        await asyncio.gather(*relays, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._relays.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._transports.update((writer, up_writer))
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )
        for w in (writer, up_writer):
            self._transports.discard(w)
            w.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(_CHUNK):
                writer.write(chunk)
                await writer.drain()
        finally:
            writer.close()
