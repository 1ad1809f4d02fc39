"""One HTTP/2 client connection: the `h2` state machine between a transport and streams.

Created when `ClientConnection` hands its transport over (the preface arrived, or TLS
ALPN chose h2). Bytes in go to `H2Connection.receive_data`; its events start, feed
and end `H2Stream`s; what the state machine has to send leaves once per read (or per
upstream read that touched this connection, see `H2Hub.flush`).

Limits, all advertised in SETTINGS and enforced by `h2` (refused and counted):
concurrent streams, header list size (`max_head_bytes`), frame size, flow-control
windows; beyond them the reset budget (`guard.ResetBudget`) and the field count of a
header block (`max_header_count`: 431, or the stream reset for trailers). A protocol error closes
the connection with GOAWAY, never the process. While the transport's write buffer is
full, the connection is not read either: a client that does not read cannot make the
proxy queue answers (PING, SETTINGS acknowledgements) without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from sidecar.proxy.h2.fields import BadRequest, Request, read_request
from sidecar.proxy.h2.guard import ResetBudget
from sidecar.proxy.h2.stream import H2Stream

if TYPE_CHECKING:
    from sidecar.proxy.server import ProxyServer

log = logging.getLogger(__name__)

_DEFAULT_WINDOW = 65_535  # RFC 9113 §6.9.2: every window starts here


def refusal_reason(exc: h2.exceptions.ProtocolError) -> str:
    """The label a refused connection is counted under."""
    if isinstance(exc, h2.exceptions.TooManyStreamsError):
        return "h2_too_many_streams"
    if isinstance(exc, h2.exceptions.FrameTooLargeError):
        return "h2_frame_too_large"
    if isinstance(exc, h2.exceptions.DenialOfServiceError):
        return "h2_header_list_too_large"
    if isinstance(exc, h2.exceptions.FlowControlError):
        return "h2_flow_control"
    return "h2_protocol_error"


class H2ClientConnection(asyncio.Protocol):
    """One client's HTTP/2 connection."""

    def __init__(self, server: ProxyServer, transport: asyncio.Transport, client_ip: bytes) -> None:
        opts = server.options
        self.server = server
        self.transport = transport
        self.client_ip = client_ip
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config)
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: opts.h2_max_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: opts.max_head_bytes,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: opts.h2_stream_window,
            },
        )
        # h2 applies a header list limit once it is acknowledged; ours holds from the start
        self.h2.decoder.max_header_list_size = opts.max_head_bytes
        self.streams: dict[int, H2Stream] = {}
        self.closed = False
        self.write_paused = False
        self.going_away = False  # GOAWAY sent or received: no new streams
        self.idle_since = server.time()
        self.resets = ResetBudget(opts.h2_max_resets, 1.0)

    # --- lifecycle -----------------------------------------------------------------

    def start(self, initial: bytes) -> None:
        """Take over the transport; `initial`: the bytes read so far (the preface...)."""
        self.h2.initiate_connection()
        window = self.server.options.h2_connection_window
        if window > _DEFAULT_WINDOW:
            self.h2.increment_flow_control_window(window - _DEFAULT_WINDOW)
        if initial:
            self.data_received(initial)
        else:
            self.flush()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        pass  # the transport is handed over already made (see H2Hub.take_over)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        streams = list(self.streams.values())
        self.streams.clear()
        for stream in streams:
            stream.client_lost()
        self.server.h2.connection_closed(self)
        self.server.h2.flush()

    def pause_writing(self) -> None:
        self.write_paused = True
        if not self.closed:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.closed:
            return
        self.transport.resume_reading()
        for stream in list(self.streams.values()):
            stream.pump()
        self.server.h2.flush()

    # --- bytes in --------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self.refuse(refusal_reason(exc), exc)
            return
        for event in events:
            if self.closed:
                break
            self._handle(event)
        self.flush()
        self.server.h2.flush()

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.request_data(event.data, event.flow_controlled_length)
            else:
                self.ack(event.stream_id, event.flow_controlled_length)
        elif isinstance(event, h2.events.RequestReceived):
            self._open(event.stream_id, event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.request_end()
        elif isinstance(event, h2.events.TrailersReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                if len(event.headers) > self.server.options.max_header_count:
                    self._too_many_trailers(stream)
                    return
                stream.req_trailers = list(event.headers)
        elif isinstance(event, h2.events.WindowUpdated):
            if event.stream_id == 0:
                for waiting in list(self.streams.values()):
                    waiting.pump()
            else:
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.pump()
        elif isinstance(event, h2.events.StreamReset):
            self._client_reset(event.stream_id)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            for waiting in list(self.streams.values()):
                waiting.pump()  # a larger initial window opens every stream's
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.going_away = True
            if not self.streams:
                self.close()

    def _open(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self.going_away:
            self.reset(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        limit = self.server.options.max_header_count
        if len(headers) > limit and field_count(headers) > limit:
            self.server.metrics.reject("h2_too_many_headers")
            stream = H2Stream(self, stream_id, read_request_lenient(headers))
            self.streams[stream_id] = stream
            stream.answer_locally(431, f"more than {limit} header fields", 431)
            return
        try:
            request = read_request(headers)
        except BadRequest as exc:
            self.server.metrics.reject("h2_bad_request")
            stream = H2Stream(self, stream_id, read_request_lenient(headers))
            self.streams[stream_id] = stream
            stream.answer_locally(exc.status, exc.detail, exc.status)
            return
        stream = H2Stream(self, stream_id, request)
        self.streams[stream_id] = stream
        stream.start()

    def _too_many_trailers(self, stream: H2Stream) -> None:
        """The request is cut: its body may be upstream already, so no answer is owed."""
        self.server.metrics.reject("h2_too_many_trailers")
        if self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]
        stream.client_lost()
        self.reset(stream.stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)

    def _client_reset(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            stream.client_lost()
        if not self.resets.spend(self.server.time()):
            # streams opened and reset at once cost upstream work without counting
            # against the stream limit: past the budget the client is cut off
            self.refuse("h2_rapid_reset", None, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    # --- used by streams -------------------------------------------------------------

    def ack(self, stream_id: int, size: int) -> None:
        """The client may send `size` more bytes: they were passed on (or dropped)."""
        if self.closed or size <= 0:
            return
        try:
            self.h2.acknowledge_received_data(size, stream_id)
        except h2.exceptions.ProtocolError:
            return  # the stream is gone; h2 has reopened the connection window
        self.dirty()

    def reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        if self.closed:
            return
        try:
            self.h2.reset_stream(stream_id, code)
        except h2.exceptions.ProtocolError:
            return  # already closed
        self.dirty()

    def stream_finished(self, stream: H2Stream) -> None:
        """The stream's response is out (or cut). A request still arriving is not
        wanted any more: RST_STREAM(NO_ERROR) tells the client (RFC 9113 §8.1)."""
        if stream.done and not stream.req_ended:
            leg = stream.leg
            stream.leg = None
            if leg is not None:
                # the upstream's half of the stream would otherwise hold its slot
                # until the upstream ends it
                leg.cancel()
            self.reset(stream.stream_id, h2.errors.ErrorCodes.NO_ERROR)
        if self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]
        if not self.streams:
            self.idle_since = self.server.time()
            if self.going_away:
                self.close()

    def dirty(self) -> None:
        self.server.h2.dirty.add(self)

    def flush(self) -> None:
        if self.closed:
            return
        data = self.h2.data_to_send()
        if data:
            self.transport.write(data)

    # --- endings ---------------------------------------------------------------------

    def refuse(
        self,
        reason: str,
        exc: Exception | None,
        code: h2.errors.ErrorCodes = h2.errors.ErrorCodes.PROTOCOL_ERROR,
    ) -> None:
        """The client broke the protocol or a limit: GOAWAY, counted, closed."""
        self.server.metrics.reject(reason)
        self.server.h2.refusals.warning("HTTP/2 client refused (%s): %s", reason, exc)
        if exc is None:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.close_connection(code)
        # on a ProtocolError h2 has queued the GOAWAY itself
        self.flush()
        self.close()

    def drain(self) -> None:
        """Shutdown: GOAWAY (streams already open finish), close once none is left."""
        if self.closed or self.going_away:
            return
        self.going_away = True
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.close_connection(
                h2.errors.ErrorCodes.NO_ERROR, last_stream_id=self.h2.highest_inbound_stream_id
            )
        self.flush()
        if not self.streams:
            self.close()

    def sweep(self, now: float, idle_timeout: float) -> None:
        if not self.streams and not self.closed and self.idle_since < now - idle_timeout:
            self.drain()

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.closed = True  # nothing more is written; connection_lost cleans up
            self.transport.close()

    def abort(self) -> None:
        self.closed = True
        self.transport.abort()


def field_count(headers: list[tuple[bytes, bytes]]) -> int:
    """The fields of a request header block, its pseudo-fields left out."""
    return sum(1 for name, _ in headers if not name.startswith(b":"))


def read_request_lenient(headers: list[tuple[bytes, bytes]]) -> Request:
    """A refused request's head as far as it goes: only its answer needs it."""
    fields = tuple(pair for pair in headers if not pair[0].startswith(b":"))
    return Request(b"GET", b"http", None, b"/", fields)
