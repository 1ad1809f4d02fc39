"""An HTTP/2 client on a raw socket that sends what it is told, malformed included.

The `h2` state machine frames and encodes, with its outbound checks off, so a test
can send what httpx or grpcio would refuse to: a content-length its DATA disagrees
with, pseudo-fields with spaces or bytes past ASCII, trailers naming any field.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

Pair = tuple[bytes, bytes]


@dataclass
class Outcome:
    """How one stream ended, as the client saw it."""

    status: int | None = None
    body: bytes = b""
    trailers: list[Pair] = field(default_factory=list)
    reset: h2.errors.ErrorCodes | int | None = None  # the proxy's RST_STREAM code
    goaway: h2.errors.ErrorCodes | int | None = None  # the connection ended instead
    ended: bool = False


class RawH2Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.h2 = h2.connection.H2Connection(config)
        self.h2.initiate_connection()
        self.outcomes: dict[int, Outcome] = {}
        self.closed = False
        self.pong = False

    @classmethod
    async def open(cls, port: int) -> RawH2Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def request(
        self,
        path: bytes = b"/",
        *,
        method: bytes = b"GET",
        end: bool = True,
        fields: tuple[Pair, ...] = (),
        pseudo: dict[bytes, bytes] | None = None,
    ) -> int:
        """HEADERS for a new stream; `pseudo` replaces pseudo-field values."""
        sid = self.h2.get_next_available_stream_id()
        head = {b":method": method, b":scheme": b"http", b":authority": b"svc", b":path": path}
        head.update(pseudo or {})
        headers = list(head.items()) + list(fields)
        self.h2.send_headers(sid, headers, end_stream=end)
        self.outcomes[sid] = Outcome()
        return sid

    def data(self, sid: int, data: bytes, *, end: bool = False) -> None:
        self.h2.send_data(sid, data, end_stream=end)

    def trailers(self, sid: int, fields: list[Pair]) -> None:
        self.h2.send_headers(sid, fields, end_stream=True)

    async def send(self) -> None:
        self.writer.write(self.h2.data_to_send())
        await self.writer.drain()

    async def outcome(self, sid: int, timeout: float = 5, *, head: bool = False) -> Outcome:
        """Read until stream `sid` has ended (answer, reset, or the connection), or
        with `head`, until its response head is in."""
        wanted = self.outcomes[sid]
        async with asyncio.timeout(timeout):
            while not (wanted.ended or self.closed or (head and wanted.status is not None)):
                await self._read()
        return wanted

    async def ping(self, timeout: float = 5) -> None:
        """Until a PING is answered: the peer has read every frame sent before it."""
        self.pong = False
        self.h2.ping(b"canary!!")
        await self.send()
        async with asyncio.timeout(timeout):
            while not (self.pong or self.closed):
                await self._read()

    async def _read(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            self.closed = True
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.closed = True
            return
        for event in events:
            self._handle(event)
        self.writer.write(self.h2.data_to_send())

    def _handle(self, event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", 0)
        out = self.outcomes.get(sid)
        if isinstance(event, h2.events.ResponseReceived) and out is not None:
            out.status = int(dict(event.headers)[b":status"])
        elif isinstance(event, h2.events.DataReceived) and out is not None:
            out.body += event.data
            self.h2.acknowledge_received_data(event.flow_controlled_length, sid)
        elif isinstance(event, h2.events.TrailersReceived) and out is not None:
            out.trailers = list(event.headers)
        elif isinstance(event, h2.events.StreamEnded) and out is not None:
            out.ended = True
        elif isinstance(event, h2.events.StreamReset) and out is not None:
            out.reset = event.error_code
            out.ended = True
        elif isinstance(event, h2.events.PingAckReceived):
            self.pong = True
        elif isinstance(event, h2.events.ConnectionTerminated):
            for waiting in self.outcomes.values():
                if not waiting.ended:
                    waiting.goaway = event.error_code
            self.closed = True

    def close(self) -> None:
        self.writer.close()
