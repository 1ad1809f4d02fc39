"""An HTTP/2 upstream (h2c, prior knowledge) driven by hand with the `h2` library.

A real HTTP/2 peer whose every frame the test controls, for what a framework would
hide: GOAWAY at a chosen moment, a stream limit, a stream that is never answered.

Paths:
- `/echo`: 200 with a JSON body saying what arrived (method, path, fields, body length);
- `/download/<n>`: n bytes, sent within the proxy's flow-control windows;
- `/trailers`: a body, then the trailers `x-checksum: <body length>` and `grpc-status: 0`;
- `/hang`: the head is read, nothing is ever answered.
- `/lying-length`: HEADERS with `content-length: 189` and END_STREAM, no DATA;
- `/short-length`: `content-length: 100`, 10 bytes of DATA, then trailers.

A request with a body and `expect: 100-continue` is answered 100 (informational
HEADERS) as soon as its head arrives.

`goaway_after`: once that many streams have started, the next request head is
answered (once) with GOAWAY whose last stream id is the stream before it, and the
connection closes: that stream was not processed and may be retried elsewhere, the
ones before it were (and must not be).
`max_streams`: the MAX_CONCURRENT_STREAMS it advertises.
`extra_trailers`: fields added to the trailers of `/trailers`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings


@dataclass
class Seen:
    method: str
    path: str
    fields: list[tuple[str, str]]
    body_len: int = 0
    trailers: list[tuple[str, str]] = field(default_factory=list)


class H2Upstream:
    def __init__(self, *, max_streams: int = 100, goaway_after: int | None = None) -> None:
        self.max_streams = max_streams
        self.goaway_after = goaway_after
        self.extra_trailers: list[tuple[str, str]] = []
        self.port = 0
        self.connections = 0
        self.started = 0  # streams whose head arrived, on every connection
        self.paths: list[str] = []  # the paths of those heads, in order
        self.answered: list[Seen] = []
        self._arrived = asyncio.Event()
        self.open_streams = 0
        self.peak_streams = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"h2c://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def wait_started(self, count: int) -> None:
        """Until `count` request heads have arrived (at most 10 s)."""
        async with asyncio.timeout(10):
            while self.started < count:
                self._arrived.clear()
                await self._arrived.wait()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.max_streams},
        )
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        streams: dict[int, Seen] = {}
        pending: dict[int, bytes] = {}  # response bytes waiting for the proxy's windows
        ends: dict[int, list[tuple[str, str]] | None] = {}
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        if self.goaway_after is not None and self.started >= self.goaway_after:
                            self.goaway_after = None
                            conn.close_connection(last_stream_id=event.stream_id - 2)
                            writer.write(conn.data_to_send())
                            await writer.drain()
                            writer.close()
                            return
                        self.started += 1
                        self._arrived.set()
                        self.open_streams += 1
                        self.peak_streams = max(self.peak_streams, self.open_streams)
                        head = dict(event.headers)
                        self.paths.append(head[":path"])
                        streams[event.stream_id] = Seen(
                            head[":method"],
                            head[":path"],
                            [(k, v) for k, v in event.headers if not k.startswith(":")],
                        )
                        if event.stream_ended is not None:
                            self._answer(conn, event.stream_id, streams, pending, ends)
                        elif head.get("expect", "").lower() == "100-continue":
                            conn.send_headers(event.stream_id, [(":status", "100")])
                    elif isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                        if event.stream_id in streams:
                            streams[event.stream_id].body_len += len(event.data)
                    elif isinstance(event, h2.events.TrailersReceived):
                        if event.stream_id in streams:
                            streams[event.stream_id].trailers = list(event.headers)
                    elif isinstance(event, h2.events.StreamEnded):
                        if event.stream_id in streams:
                            self._answer(conn, event.stream_id, streams, pending, ends)
                    elif isinstance(event, h2.events.StreamReset):
                        if streams.pop(event.stream_id, None) is not None:
                            self.open_streams -= 1
                        pending.pop(event.stream_id, None)
                self._pump(conn, pending, ends)
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            self.open_streams -= len(streams)  # started, never answered nor reset
            self._writers.discard(writer)
            writer.close()

    def _answer(
        self,
        conn: h2.connection.H2Connection,
        sid: int,
        streams: dict[int, Seen],
        pending: dict[int, bytes],
        ends: dict[int, list[tuple[str, str]] | None],
    ) -> None:
        seen = streams[sid]
        if seen.path == "/hang":
            return
        streams.pop(sid)
        self.open_streams -= 1
        self.answered.append(seen)
        if seen.path.startswith("/download/"):
            body = b"d" * int(seen.path.rsplit("/", 1)[1])
            conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(body)))])
            pending[sid], ends[sid] = body, None
        elif seen.path == "/lying-length":
            conn.send_headers(sid, [(":status", "200"), ("content-length", "189")], end_stream=True)
        elif seen.path == "/short-length":
            conn.send_headers(sid, [(":status", "200"), ("content-length", "100")])
            pending[sid], ends[sid] = b"s" * 10, [("x-checksum", "10")]
        elif seen.path == "/trailers":
            body = b"t" * 1000
            conn.send_headers(sid, [(":status", "200"), ("content-type", "text/plain")])
            pending[sid] = body
            ends[sid] = [
                ("x-checksum", str(len(body))), ("grpc-status", "0"), *self.extra_trailers
            ]  # fmt: skip
        else:
            body = json.dumps(
                {"method": seen.method, "path": seen.path, "fields": seen.fields,
                 "body_len": seen.body_len, "trailers": seen.trailers}
            ).encode()  # fmt: skip
            conn.send_headers(
                sid,
                [(":status", "200"), ("content-type", "application/json"),
                 ("content-length", str(len(body)))],
            )  # fmt: skip
            pending[sid], ends[sid] = body, None

    def _pump(
        self,
        conn: h2.connection.H2Connection,
        pending: dict[int, bytes],
        ends: dict[int, list[tuple[str, str]] | None],
    ) -> None:
        for sid in list(pending):
            body = pending[sid]
            while body:
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                if room <= 0:
                    break
                conn.send_data(sid, body[:room])
                body = body[room:]
            if body:
                pending[sid] = body
                continue
            del pending[sid]
            trailers = ends.pop(sid, None)
            if trailers:
                conn.send_headers(sid, trailers, end_stream=True)
            else:
                conn.end_stream(sid)
