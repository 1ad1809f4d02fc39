"""HTTP/2 upstreams: one multiplexed connection per upstream, a stream per request.

`H2UpstreamPool` keeps one connection to an upstream marked `h2c://` (clear text,
prior knowledge) or `h2://` (TLS, ALPN h2) and starts each `H2Leg` on it as a new
stream while the upstream's MAX_CONCURRENT_STREAMS allows; beyond that legs wait in
order (at most `h2_max_waiting`, then 503). A GOAWAY from the upstream retires the
connection: new streams go to a fresh one, streams it did not process (above its
last stream id, or refused with REFUSED_STREAM) are started again there when no
body byte of theirs was sent yet, and the rest finish where they are.

Flow control: request bytes leave within the upstream's windows (the rest waits in
the leg, and the client's window reopens only for bytes sent); response bytes are
acknowledged to the upstream only once the client stream has passed them on, so
a slow client holds the upstream back instead of filling the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from typing import TYPE_CHECKING, Protocol

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from controlplane.kernel.codec import CONNECT_ERROR, TIMEOUT
from sidecar.choice import Upstream
from sidecar.proxy.h2.fields import Pair
from sidecar.proxy.h2.preface import ALPN_H2, negotiated_h2
from sidecar.proxy.h2.sending import send_head
from sidecar.proxy.upstream import MAX_RESPONSE_HEAD

if TYPE_CHECKING:
    from sidecar.proxy.h2.hub import H2Hub

log = logging.getLogger(__name__)

_DEFAULT_WINDOW = 65_535


class ResponseSink(Protocol):
    """What a leg answers to: the client stream (HTTP/2 or HTTP/1.1)."""

    def upstream_attached(self) -> None: ...
    def request_consumed(self, size: int) -> None: ...
    def response_head(self, status: int, fields: list[Pair], *, end: bool) -> None: ...
    def response_interim(self, status: int, fields: list[Pair]) -> None: ...
    def response_data(self, data: bytes) -> None: ...
    def response_trailers(self, trailers: list[Pair]) -> None: ...
    def response_end(self) -> None: ...
    def upstream_failed(self, status: int, outcome: int, reason: str) -> None: ...


class H2Leg:
    """One request as a stream on an HTTP/2 upstream connection."""

    __slots__ = (
        "body",
        "body_sent",
        "cancelled",
        "checked",
        "conn",
        "end_sent",
        "finished",
        "headers",
        "last_activity",
        "pool",
        "req_end",
        "req_trailers",
        "retried",
        "stream_id",
        "unacked",
        "user",
    )

    def __init__(
        self, pool: H2UpstreamPool, user: ResponseSink, headers: list[Pair], *, checked: bool
    ) -> None:
        self.pool = pool
        self.user = user
        self.headers = headers
        self.checked = checked  # the fields passed h2's checks on the way in (sending.py)
        self.conn: H2UpstreamConnection | None = None
        self.stream_id = 0
        self.body: deque[bytes] = deque()  # request bytes the upstream's window holds back
        self.body_sent = False
        self.req_end = False
        self.req_trailers: list[Pair] | None = None
        self.end_sent = False
        self.cancelled = False
        self.finished = False
        self.retried = False
        self.unacked = 0  # response bytes received, not yet passed on by the client
        self.last_activity = 0.0

    # --- UpstreamLeg ---------------------------------------------------------------

    def request_data(self, data: bytes) -> None:
        self.body.append(data)
        self.pump()

    def request_end(self, trailers: list[Pair] | None) -> None:
        self.req_end = True
        self.req_trailers = trailers
        self.pump()

    def response_consumed(self, size: int) -> None:
        self.unacked -= size
        conn = self.conn
        if conn is not None and not self.finished:
            conn.ack(self.stream_id, size)

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        conn = self.conn
        if conn is None:
            return
        if not self.finished:
            conn.reset(self.stream_id, h2.errors.ErrorCodes.CANCEL)
            conn.legs.pop(self.stream_id, None)
            self.pool.dispatch()
        elif not self.end_sent:
            # the upstream answered in full before the request was: closing our half
            # frees the stream slot (RFC 9113 §8.1)
            conn.reset(self.stream_id, h2.errors.ErrorCodes.NO_ERROR)

    # --- sending ---------------------------------------------------------------------

    def pump(self) -> None:
        """Send the request bytes the upstream's windows allow, then its end."""
        conn = self.conn
        if conn is None or self.finished or self.cancelled or conn.closed or conn.write_paused:
            return
        h2c = conn.h2
        sid = self.stream_id
        body = self.body
        sent = 0
        try:
            while body:
                window = h2c.local_flow_control_window(sid)
                if window <= 0:
                    break
                chunk = body[0]
                size = min(window, h2c.max_outbound_frame_size, len(chunk))
                if size < len(chunk):
                    h2c.send_data(sid, chunk[:size])
                    body[0] = chunk[size:]
                else:
                    body.popleft()
                    h2c.send_data(sid, chunk)
                sent += size
            if not body and self.req_end and not self.end_sent:
                self.end_sent = True
                if self.req_trailers:
                    send_head(h2c, sid, self.req_trailers, end_stream=True, checked=self.checked)
                else:
                    h2c.end_stream(sid)
                self.last_activity = self.pool.loop.time()
        except h2.exceptions.ProtocolError:
            return  # the upstream reset the stream meanwhile: its event says so
        finally:
            conn.dirty()
        if sent:
            self.body_sent = True
            self.user.request_consumed(sent)


class H2UpstreamConnection(asyncio.Protocol):
    """One HTTP/2 connection to an upstream, carrying many legs."""

    def __init__(self, pool: H2UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config)
        self.h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: pool.stream_window,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_RESPONSE_HEAD,
            },
        )
        self.h2.decoder.max_header_list_size = MAX_RESPONSE_HEAD
        self.legs: dict[int, H2Leg] = {}
        self.closed = False
        self.write_paused = False
        self.going_away = False
        self.idle_since = pool.loop.time()

    # --- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.h2.initiate_connection()
        window = self.pool.connection_window
        if window > _DEFAULT_WINDOW:
            self.h2.increment_flow_control_window(window - _DEFAULT_WINDOW)
        self.flush()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self.flush()  # the GOAWAY h2 queued
            self._lost(f"the upstream broke HTTP/2: {exc}")
            self.pool.hub.flush()
            return
        for event in events:
            self._handle(event)
        self.flush()
        self.pool.hub.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost("connection closed" if exc is None else f"connection lost: {exc}")
        self.pool.hub.flush()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        for leg in list(self.legs.values()):
            leg.pump()
        self.pool.hub.flush()

    # --- events ----------------------------------------------------------------------

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            leg = self.legs.get(event.stream_id)
            if leg is None:
                self.ack(event.stream_id, event.flow_controlled_length)
                return
            leg.last_activity = self.pool.loop.time()
            padding = event.flow_controlled_length - len(event.data)
            if padding:
                self.ack(event.stream_id, padding)
            if event.data:
                leg.unacked += len(event.data)
                leg.user.response_data(event.data)
        elif isinstance(event, h2.events.ResponseReceived):
            leg = self.legs.get(event.stream_id)
            if leg is not None:
                leg.last_activity = self.pool.loop.time()
                status, fields = _status_and_fields(event.headers)
                ended = event.stream_ended is not None
                if ended:
                    self._done(leg)
                leg.user.response_head(status, fields, end=ended)
        elif isinstance(event, h2.events.InformationalResponseReceived):
            leg = self.legs.get(event.stream_id)
            if leg is not None:  # e.g. 100 Continue to a request that expects it
                leg.last_activity = self.pool.loop.time()
                status, fields = _status_and_fields(event.headers)
                leg.user.response_interim(status, fields)
        elif isinstance(event, h2.events.TrailersReceived):
            leg = self.legs.get(event.stream_id)
            if leg is not None:
                self._done(leg)
                leg.user.response_trailers(list(event.headers))
                leg.user.response_end()
        elif isinstance(event, h2.events.StreamEnded):
            leg = self.legs.get(event.stream_id)
            if leg is not None:
                self._done(leg)
                leg.user.response_end()
        elif isinstance(event, h2.events.StreamReset):
            leg = self.legs.pop(event.stream_id, None)
            if leg is not None:
                leg.finished = True
                if event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM:
                    self.pool.retry(leg, "the upstream refused the stream")
                else:
                    leg.user.upstream_failed(
                        502, 502, f"the upstream reset the stream ({event.error_code!s})"
                    )
                self.pool.dispatch()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            for waiting in list(self.legs.values()):
                waiting.pump()
            self.pool.dispatch()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.going_away = True
            last = event.last_stream_id if event.last_stream_id is not None else 0
            for sid in [sid for sid in self.legs if sid > last]:
                leg = self.legs.pop(sid)
                leg.finished = True
                self.pool.retry(leg, "the upstream went away before the stream")
            self.pool.retire(self)
            if not self.legs:
                self.close()

    def _done(self, leg: H2Leg) -> None:
        """The upstream's side of the stream ended: the stream slot is free."""
        self.legs.pop(leg.stream_id, None)
        leg.finished = True
        if not self.legs:
            self.idle_since = self.pool.loop.time()
            if self.going_away:
                self.close()
        self.pool.dispatch()

    def _lost(self, reason: str) -> None:
        if self.closed and not self.legs:
            self.pool.retire(self)
            return
        self.closed = True
        self.pool.retire(self)
        legs = list(self.legs.values())
        self.legs.clear()
        for leg in legs:
            leg.finished = True
            leg.user.upstream_failed(502, 502, reason)
        if self.transport is not None:
            self.transport.close()
        self.pool.dispatch()

    # --- used by legs and the pool ---------------------------------------------------

    @property
    def can_open(self) -> bool:
        if self.closed or self.going_away:
            return False
        limit = self.h2.remote_settings.max_concurrent_streams
        return self.h2.open_outbound_streams < min(limit, self.pool.max_streams)

    def start(self, leg: H2Leg) -> bool:
        """Open the leg's stream; False when this connection cannot take it."""
        try:
            sid = self.h2.get_next_available_stream_id()
            end = leg.req_end and not leg.body and not leg.req_trailers
            send_head(self.h2, sid, leg.headers, end_stream=end, checked=leg.checked)
        except h2.exceptions.NoAvailableStreamIDError:
            self.going_away = True  # stream ids used up: a fresh connection takes over
            self.pool.retire(self)
            return False
        except h2.exceptions.ProtocolError as exc:
            leg.finished = True
            leg.user.upstream_failed(502, 502, f"request head not valid in HTTP/2: {exc}")
            return True
        leg.conn = self
        leg.stream_id = sid
        leg.end_sent = end
        leg.last_activity = self.pool.loop.time()
        self.legs[sid] = leg
        self.dirty()
        leg.user.upstream_attached()
        leg.pump()
        return True

    def ack(self, stream_id: int, size: int) -> None:
        if self.closed or size <= 0:
            return
        try:
            self.h2.acknowledge_received_data(size, stream_id)
        except h2.exceptions.ProtocolError:
            return
        self.dirty()

    def reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        if self.closed:
            return
        try:
            self.h2.reset_stream(stream_id, code)
        except h2.exceptions.ProtocolError:
            return
        self.dirty()

    def dirty(self) -> None:
        self.pool.hub.dirty.add(self)

    def flush(self) -> None:
        if self.closed or self.transport is None:
            return
        data = self.h2.data_to_send()
        if data:
            self.transport.write(data)

    def sweep(self, now: float, read_timeout: float, idle_timeout: float) -> None:
        timed_out = False
        for leg in list(self.legs.values()):
            # a leg whose response waits for a slow client is not the upstream's fault
            if leg.end_sent and not leg.unacked and leg.last_activity < now - read_timeout:
                self.legs.pop(leg.stream_id, None)
                leg.finished = True
                self.reset(leg.stream_id, h2.errors.ErrorCodes.CANCEL)
                leg.user.upstream_failed(504, TIMEOUT, f"no response within {read_timeout:g} s")
                timed_out = True
        if timed_out:
            if not self.legs:
                self.idle_since = now
            self.pool.dispatch()  # the reset streams' slots are free for waiting legs
        elif not self.legs and self.idle_since < now - idle_timeout:
            self.close()

    def close(self) -> None:
        """GOAWAY and close (streams still open are cut: callers close idle ones)."""
        if self.closed:
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.close_connection()
        self.flush()
        self._lost("the upstream connection was closed")


def _status_and_fields(headers: list[tuple[bytes, bytes]]) -> tuple[int, list[Pair]]:
    status = 0
    fields: list[Pair] = []
    for name, value in headers:
        if name == b":status":
            status = int(value)  # h2 has checked it is three digits
        elif not name.startswith(b":"):
            fields.append((name, value))
    return status, fields


class H2UpstreamPool:
    """The HTTP/2 connection to one upstream, and the legs waiting for a stream."""

    def __init__(
        self,
        hub: H2Hub,
        upstream: Upstream,
        *,
        connect_timeout: float,
        ssl_context: ssl.SSLContext | None,
        max_streams: int,
        max_waiting: int,
        stream_window: int,
        connection_window: int,
    ) -> None:
        self.hub = hub
        self.loop = hub.server.loop
        self.upstream = upstream
        self.connect_timeout = connect_timeout
        self.max_streams = max_streams
        self.max_waiting = max_waiting
        self.stream_window = stream_window
        self.connection_window = connection_window
        self.conn: H2UpstreamConnection | None = None
        self.retired: set[H2UpstreamConnection] = set()
        self.waiting: deque[H2Leg] = deque()
        self.connecting: asyncio.Task[None] | None = None
        self.closing = False
        self._ssl: ssl.SSLContext | None = None
        if upstream.scheme == "https":
            context = ssl_context if ssl_context is not None else ssl.create_default_context()
            context.set_alpn_protocols([ALPN_H2])
            self._ssl = context

    def open(
        self, user: ResponseSink, headers: list[Pair], *, checked: bool, ended: bool = False
    ) -> H2Leg:
        """A leg for `user`'s request: started at once, or when a stream is free.
        `checked`: the head's fields passed `h2`'s inbound checks (see sending.py);
        `ended`: the head is the whole request."""
        leg = H2Leg(self, user, headers, checked=checked)
        leg.req_end = ended
        if len(self.waiting) >= self.max_waiting:
            self.hub.server.metrics.reject("h2_upstream_queue_full")
            leg.finished = True
            self.loop.call_soon(
                self._refuse, leg, f"{self.max_waiting} requests already wait for a stream"
            )
            return leg
        self.waiting.append(leg)
        self.dispatch()
        return leg

    def _refuse(self, leg: H2Leg, reason: str) -> None:
        if not leg.cancelled:
            leg.user.upstream_failed(503, 503, reason)
            self.hub.flush()

    def retry(self, leg: H2Leg, reason: str) -> None:
        """A leg the upstream did not process: again on a fresh stream, once, if none of
        its body was sent (what was sent is not kept)."""
        if leg.cancelled:
            return
        if leg.body_sent or leg.retried:
            leg.user.upstream_failed(502, 502, reason)
            return
        leg.retried = True
        leg.finished = False
        leg.conn = None
        leg.end_sent = False
        self.hub.server.metrics.upstream_retries += 1
        self.waiting.appendleft(leg)

    def retire(self, conn: H2UpstreamConnection) -> None:
        """`conn` takes no new stream (GOAWAY, lost, ids used up)."""
        if self.conn is conn:
            self.conn = None
        if conn.closed:
            self.retired.discard(conn)
        else:
            self.retired.add(conn)

    def dispatch(self) -> None:
        """Start waiting legs while the connection has room; connect when there is none."""
        waiting = self.waiting
        while waiting and waiting[0].cancelled:
            waiting.popleft()
        if not waiting or self.closing:
            return
        conn = self.conn
        if conn is None:
            if self.connecting is None:
                self._connect()
            return
        while waiting and conn.can_open:
            leg = waiting.popleft()
            if not leg.cancelled and not conn.start(leg):
                waiting.appendleft(leg)
                self.dispatch()
                return

    def _connect(self) -> None:
        task = self.loop.create_task(self._open())
        self.connecting = task
        tasks = self.hub.server.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _open(self) -> None:
        up = self.upstream
        try:
            async with asyncio.timeout(self.connect_timeout):
                transport, conn = await self.loop.create_connection(
                    lambda: H2UpstreamConnection(self),
                    up.host,
                    up.port,
                    ssl=self._ssl,
                    server_hostname=up.host if self._ssl is not None else None,
                )
        except TimeoutError:
            self._fail_waiting(504, TIMEOUT, f"no connection within {self.connect_timeout:g} s")
            return
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            self._fail_waiting(502, CONNECT_ERROR, f"cannot connect to {up}: {reason}")
            return
        finally:
            self.connecting = None
        self.hub.server.metrics.upstream_connects += 1
        if self._ssl is not None and not negotiated_h2(transport.get_extra_info("ssl_object")):
            conn.close()
            self._fail_waiting(502, CONNECT_ERROR, f"{up} did not negotiate HTTP/2 (ALPN h2)")
            return
        if self.closing:
            conn.close()
            return
        self.conn = conn
        self.dispatch()
        self.hub.flush()

    def _fail_waiting(self, status: int, outcome: int, reason: str) -> None:
        waiting = list(self.waiting)
        self.waiting.clear()
        for leg in waiting:
            if not leg.cancelled:
                leg.finished = True
                leg.user.upstream_failed(status, outcome, reason)
        self.hub.flush()

    def connections(self) -> list[H2UpstreamConnection]:
        return ([self.conn] if self.conn is not None else []) + list(self.retired)

    def sweep(self, now: float, read_timeout: float, idle_timeout: float) -> None:
        for conn in self.connections():
            conn.sweep(now, read_timeout, idle_timeout)

    def close(self) -> None:
        self.closing = True
        if self.connecting is not None:
            self.connecting.cancel()
        for conn in self.connections():
            conn.close()
        self._fail_waiting(502, 502, "the proxy is shutting down")
