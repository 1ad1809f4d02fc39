"""An HTTP/2 client's stream to an HTTP/1.1 upstream, through the keep-alive pools.

`H1Leg` is the `UpstreamUser` of one pooled `UpstreamConnection`: it writes the
request as HTTP/1.1 and turns the parsed response into the stream's head, data and
end. The request's framing is the proxy's own, from the bytes it holds, never the
client's content-length (which the stream checks against its DATA, decision 0037):
no body when the stream ended with its HEADERS (`Content-Length: 0` where the method
gives a body meaning); `Content-Length` of the body when the whole of it is in by
the time the head is written (the body is written at the end of each client read,
`flush`, so a request that arrives in one read goes whole); chunked otherwise, or
when trailers come with it (as the chunked trailer section).

Flow control: request bytes are acknowledged to the client as they are written,
except while the upstream's write buffer is full; response bytes past `_HELD` not yet
taken by the client pause reading from the upstream.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from controlplane.kernel.codec import CONNECT_ERROR, TIMEOUT
from sidecar.proxy.h2.fields import (
    Forwarding,
    Pair,
    Request,
    h1_request,
    h1_response_fields,
    trailer_section,
)
from sidecar.proxy.headers import ResponseFields
from sidecar.proxy.trailers import response_trailers
from sidecar.proxy.upstream import EMPTY, LENGTH, UpstreamConnection, UpstreamPool

if TYPE_CHECKING:
    from sidecar.proxy.h2.upstream import ResponseSink
    from sidecar.proxy.server import ProxyServer

# response bytes the client has not taken yet before the upstream is not read
_HELD = 256 * 1024
_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
# methods whose request content has no defined meaning: no framing for an empty body
# (RFC 9110 §8.6: Content-Length when the method defines a meaning for content)
_NO_CONTENT = frozenset({b"GET", b"HEAD", b"DELETE", b"OPTIONS", b"TRACE"})


class H1Leg:
    """One HTTP/2 stream's request on an HTTP/1.1 upstream connection."""

    __slots__ = (
        "acks_held",
        "answered_early",
        "body",
        "body_sent",
        "cancelled",
        "chunked",
        "conn",
        "connect_task",
        "end_sent",
        "fwd",
        "head",
        "head_sent",
        "no_body",
        "pool",
        "req_end",
        "req_trailers",
        "request",
        "retried",
        "server",
        "unsent",
        "user",
        "write_paused",
    )

    def __init__(
        self, server: ProxyServer, user: ResponseSink, request: Request, fwd: Forwarding
    ) -> None:
        self.server = server
        self.user = user
        self.request = request
        self.fwd = fwd
        self.no_body = request.method == b"HEAD"  # its response ends with its head
        self.pool: UpstreamPool | None = None
        self.conn: UpstreamConnection | None = None
        self.connect_task: asyncio.Task[None] | None = None
        self.head: bytes | None = None  # framed once the proxy knows what body follows
        self.chunked = False
        self.head_sent = False
        self.body: list[bytes] = []  # request bytes received, not yet written upstream
        self.end_sent = False  # the chunked body's last chunk is written
        self.answered_early = False  # the response head came before the request's end
        self.req_end = False
        self.req_trailers: list[Pair] | None = None
        self.body_sent = False
        self.cancelled = False
        self.retried = False
        self.write_paused = False
        self.acks_held = 0
        self.unsent = 0  # response bytes handed to the stream, not yet taken by the client

    def start(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self._open_when_framed()

    def _open_when_framed(self) -> None:
        """Take a connection only once the request head can be written. A pooled one
        taken earlier would hand this stream whatever its last exchange still sends
        (an upstream answering a smuggled body late) as a response it never asked
        for; and a stream that sends only its HEADERS holds no upstream connection."""
        pool = self.pool
        if (
            pool is None
            or self.conn is not None
            or self.connect_task is not None
            or self.cancelled
            or self.head_sent
            or not (self.body or self.req_end)
        ):
            return
        conn = pool.acquire()
        if conn is not None:
            self._attach(conn)
        else:
            self._connect()

    # --- UpstreamLeg -----------------------------------------------------------------

    def request_data(self, data: bytes) -> None:
        self.body.append(data)
        self.server.h2.dirty.add(self)  # written at the end of this read (`flush`)

    def request_end(self, trailers: list[Pair] | None) -> None:
        self.req_end = True
        self.req_trailers = trailers
        self._send()
        if self.conn is not None:
            self.conn.arm_read_timeout()

    def flush(self) -> None:
        """The hub's flush: the request bytes of this read go upstream in one write."""
        if not self.cancelled:
            self._send()

    def response_consumed(self, size: int) -> None:
        self.unsent -= size
        conn = self.conn
        if conn is not None and conn.reading_paused and self.unsent <= _HELD // 2:
            conn.resume_reading()

    def cancel(self) -> None:
        self.cancelled = True
        task = self.connect_task
        if task is not None:
            task.cancel()
            self.connect_task = None
        conn = self.conn
        self.conn = None
        if conn is not None:
            conn.abort()  # mid-exchange: its state is unknown, never pool it

    # --- sending ---------------------------------------------------------------------

    def _send(self) -> None:
        """Write what is held once the connection is there and the framing is known;
        the client's window reopens for the body bytes written."""
        conn = self.conn
        if conn is None:
            self._open_when_framed()  # attaching sends what is held
            return
        if conn.closed:
            return
        body = self.body
        if self.head is None:
            if not body and not self.req_end:
                return  # whether a body follows is not known yet
            self.head = self._frame()
        parts: list[bytes] = []
        if not self.head_sent:
            self.head_sent = True
            parts.append(self.head)
            self.user.upstream_attached()
        size = 0
        for chunk in body:
            size += len(chunk)
            if self.chunked:
                parts += [b"%x\r\n" % len(chunk), chunk, b"\r\n"]
            else:
                parts.append(chunk)
        self.body = []
        if self.chunked and self.req_end and not self.end_sent:
            self.end_sent = True
            trailers = self.req_trailers
            parts += [b"0\r\n", trailer_section(trailers) if trailers else b"", b"\r\n"]
        if parts:
            conn.writelines(parts)
        if size:
            self.body_sent = True
            self._ack(size)

    def _all_sent(self) -> bool:
        return self.req_end and not self.body and (self.end_sent or not self.chunked)

    def _frame(self) -> bytes:
        """The request head, framed by what the proxy holds: the whole body (its
        length), none, or a body still arriving or with trailers (chunked)."""
        request = self.request
        if self.req_end and not self.req_trailers:
            size = sum(len(chunk) for chunk in self.body)
            if size == 0 and request.method in _NO_CONTENT:
                return h1_request(request, self.fwd, chunked=False, length=None)
            return h1_request(request, self.fwd, chunked=False, length=size)
        self.chunked = True
        return h1_request(request, self.fwd, chunked=True, length=None)

    def _ack(self, size: int) -> None:
        if self.write_paused:
            self.acks_held += size
            return
        total = size + self.acks_held
        self.acks_held = 0
        if total:
            self.user.request_consumed(total)

    def _attach(self, conn: UpstreamConnection) -> None:
        self.conn = conn
        conn.attach(self)
        self._send()
        if self.req_end:
            conn.arm_read_timeout()

    def _connect(self) -> None:
        task = self.server.loop.create_task(self._open())
        self.connect_task = task
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _open(self) -> None:
        pool = self.pool
        assert pool is not None
        try:
            conn = await pool.connect()
        except TimeoutError:
            self.connect_task = None
            self._failed(504, TIMEOUT, f"no connection within {pool.connect_timeout:g} s")
            return
        except OSError as exc:
            self.connect_task = None
            reason = exc.strerror or str(exc) or type(exc).__name__
            self._failed(502, CONNECT_ERROR, f"cannot connect to {pool.upstream}: {reason}")
            return
        self.connect_task = None
        self.server.metrics.upstream_connects += 1
        if self.cancelled:
            pool.release(conn)
            return
        self._attach(conn)
        self.server.h2.flush()

    def _failed(self, status: int, outcome: int, reason: str) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.user.upstream_failed(status, outcome, reason)
            self.server.h2.flush()

    # --- UpstreamUser (called by the UpstreamConnection) ----------------------------

    @property
    def client(self) -> H1Leg:
        return self  # what one upstream read produces leaves with the hub's flush

    def cork(self) -> bool:
        return True

    def uncork(self) -> None:
        self.server.h2.flush()

    def response_head(
        self, status: int, status_line: bytes, fields: bytes, scan: ResponseFields, framing: int
    ) -> None:
        if status < 200:
            return  # interim answers stay here
        self.answered_early = not self._all_sent()
        pairs = h1_response_fields(fields, scan.named, keep_length=framing in (LENGTH, EMPTY))
        self.user.response_head(status, pairs, end=False)

    def response_switching(
        self, status_line: bytes, fields: bytes, scan: ResponseFields
    ) -> str | None:
        # HTTP/2 has no Upgrade: the request never asked to switch protocols
        return "a 101 to a request that did not ask to upgrade"

    def upstream_switched(self, conn: UpstreamConnection, rest: bytes) -> None:
        # unreachable: every 101 is refused above, which ends the response as invalid
        conn.abort()
        self.upstream_lost(conn, "the upstream switched protocols unasked")

    def response_trailers(self, section: bytes | None, named: frozenset[bytes] | None) -> None:
        """A chunked response's trailer section becomes the stream's trailing HEADERS."""
        if section is None:
            self.server.metrics.trailers_dropped += 1
            return
        lines, dropped = response_trailers(section, named)
        self.server.metrics.trailer_fields_dropped += dropped
        pairs: list[Pair] = []
        for line in lines.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if sep:
                pairs.append((name.strip().lower(), value.strip()))
        if pairs:
            self.user.response_trailers(pairs)

    def response_body(self, chunk: bytes) -> None:
        self.unsent += len(chunk)
        self.user.response_data(chunk)
        conn = self.conn
        if conn is not None and self.unsent > _HELD:
            conn.pause_reading()

    def response_complete(self, reusable: bool) -> None:
        conn = self.conn
        self.conn = None
        if conn is not None:
            # answered before the request was all written: the upstream may not have
            # read it and take the rest for a request of its own (response-queue
            # poisoning), so the connection carries no other
            conn.release(reusable and not self.answered_early and self._all_sent())
        self.user.response_end()

    def upstream_invalid(self, conn: UpstreamConnection, reason: str) -> None:
        self.upstream_lost(conn, reason)

    def upstream_lost(self, conn: UpstreamConnection, reason: str) -> None:
        if conn is not self.conn:
            return
        self.conn = None
        pool = self.pool
        if (
            conn.reused
            and not conn.got_data
            and not self.body_sent
            and not self.retried
            and self.request.method in _IDEMPOTENT
            and pool is not None
        ):
            # a pooled connection the upstream had closed: replay once on a fresh one
            self.retried = True
            self.head_sent = False
            self.end_sent = False
            self.server.metrics.upstream_retries += 1
            self._connect()
            return
        self._failed(502, 502, reason)

    def upstream_timeout(self, conn: UpstreamConnection) -> None:
        if conn is not self.conn:
            return
        self.conn = None
        self._failed(504, TIMEOUT, f"no response within {self.server.options.read_timeout:g} s")

    def upstream_pause_writing(self) -> None:
        self.write_paused = True

    def upstream_resume_writing(self) -> None:
        self.write_paused = False
        self._ack(0)
        self.server.h2.flush()
