"""Keep-alive connections to the upstreams, one pool per `Upstream`.

An `UpstreamConnection` is an asyncio Protocol with an httptools response parser.
While an exchange holds it, every parser event goes straight to that exchange
(`UpstreamUser`), so a response streams to the client without a task or a queue in
between. Idle connections wait in their pool, most recently used first.

A chunked response's last bytes are kept (at most `trailers.TAIL_BYTES`) so that its
trailer fields can be passed on once httptools has accepted the message. A 101 to a
request asking to upgrade detaches the connection from its pool for good: its
transport becomes one end of a tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import TYPE_CHECKING, Final, Protocol, cast

import httptools

from sidecar.choice import Upstream
from sidecar.proxy.corking import CorkedWriter
from sidecar.proxy.head_cache import MAX_CACHED_HEAD, HeadCache, ParsedHead, WholeResponse
from sidecar.proxy.headers import ResponseFields
from sidecar.proxy.trailers import TAIL_BYTES, trailer_section

if TYPE_CHECKING:  # a cycle at run time: the exchange module imports this one
    from sidecar.proxy.exchange import Exchange
    from sidecar.proxy.metrics import ProxyMetrics

_NO_BODY_STATUSES: Final = frozenset({204, 304})
# a response head (status line and fields) larger than this is refused: without a
# limit an upstream could make the proxy hold any amount of memory
MAX_RESPONSE_HEAD: Final = 64 * 1024


class UpstreamUser(Protocol):
    """What an exchange offers the connection it holds."""

    def response_head(
        self,
        status: int,
        status_line: bytes,
        fields: bytes,
        scan: ResponseFields,
        framing: int,
    ) -> None: ...
    def response_body(self, chunk: bytes) -> None: ...
    def response_complete(self, reusable: bool) -> None: ...
    def upstream_lost(self, conn: UpstreamConnection, reason: str) -> None: ...
    def upstream_invalid(self, conn: UpstreamConnection, reason: str) -> None: ...
    def upstream_timeout(self, conn: UpstreamConnection) -> None: ...
    def upstream_pause_writing(self) -> None: ...
    def upstream_resume_writing(self) -> None: ...
    def response_switching(
        self, status_line: bytes, fields: bytes, scan: ResponseFields
    ) -> str | None: ...
    def upstream_switched(self, conn: UpstreamConnection, rest: bytes) -> None: ...
    def response_trailers(self, section: bytes | None, named: frozenset[bytes] | None) -> None: ...

    no_body: bool  # a response to HEAD: it ends with its head

    @property
    def client(self) -> Downstream:
        """Where the response goes."""
        ...


class Downstream(Protocol):
    """The client side as the upstream side sees it: what one read of a response
    produces (head, body) is held between `cork()` and `uncork()` and leaves in one
    send."""

    def cork(self) -> bool: ...
    def uncork(self) -> None: ...


# response framing as seen on the upstream side
LENGTH: Final = 0  # Content-Length
CHUNKED: Final = 1
UNTIL_CLOSE: Final = 2  # neither: the body ends when the upstream closes
EMPTY: Final = 3  # HEAD, 204, 304


class _InvalidResponse(Exception):
    """Raised from a parser callback; httptools wraps it in HttpParserCallbackError."""


# a response whose Connection names these would have them dropped on the way to the
# client while the body they frame is relayed: the client would misread the framing
_FRAMING: Final = frozenset({b"content-length", b"transfer-encoding"})


class UpstreamConnection(CorkedWriter, asyncio.Protocol):
    __slots__ = (
        "_body_seen",
        "_done_in_read",
        "_ending",
        "_head",
        "_head_parsed",
        "_head_seen",
        "_last_activity",
        "_loop",
        "_named",
        "_parser",
        "_recent",
        "_recent_len",
        "_reset_parser",
        "_status",
        "_timer",
        "_unsolicited",
        "_waiting",
        "_whole_keep_alive",
        "closed",
        "exchange",
        "framing",
        "got_data",
        "idle_since",
        "pool",
        "reading_paused",
        "reused",
        "transport",
        "user",
    )

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self._loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.user: UpstreamUser | None = None
        # `user` again when it is an HTTP/1.1 exchange (nearly always): typed as the
        # class, compiled code calls it natively instead of through a method lookup
        self.exchange: Exchange | None = None
        self.closed = False
        self.reused = False
        self.got_data = False
        self.reading_paused = False
        self.idle_since = 0.0
        self.framing = LENGTH
        # The bytes received since the current response head began, while one is
        # owed; None otherwise. httptools reports no field callbacks here (the head
        # is rewritten whole, see headers.response_head), only where the head ends.
        self._head: bytes | None = None
        self._status = 0
        self._reset_parser = False
        self._timer: asyncio.TimerHandle | None = None
        self._waiting = False
        self._last_activity = 0.0
        self._out: list[bytes] | None = None  # writes held for one send, see cork()
        # a chunked response: the last reads (for its trailers), what its Connection
        # names, and once it is complete, its user and keep-alive until the read ends
        self._recent: list[bytes] = []
        self._recent_len = 0
        self._named: frozenset[bytes] | None = None
        self._ending: tuple[UpstreamUser, bool] | None = None
        # what a response taken by the parser leaves for `HeadCache.learn_whole`: its
        # head (bytes, parsed), its body bytes, and its keep-alive (-1: not complete,
        # or not framed by a length)
        self._head_seen: bytes | None = None
        self._head_parsed: ParsedHead | None = None
        self._body_seen = 0
        self._whole_keep_alive = -1
        # a response owed completed in the read being parsed; a message began after it
        self._done_in_read = False
        self._unsolicited = False

    # --- asyncio.Protocol -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._last_activity = self._loop.time()
        user = self.user
        if user is None:
            # nothing is owed on an idle connection: the upstream misbehaves
            self.abort()
            return
        self.got_data = True
        self._done_in_read = False
        head = self._head
        exchange = self.exchange
        if head == b"" and exchange is not None and exchange is user and not exchange.no_body:
            # a response that starts with this read: if its head came whole before, with
            # as many body bytes, it is that response again (see HeadCache.learn_whole)
            end = data.find(b"\r\n\r\n")
            if 0 <= end <= MAX_CACHED_HEAD:
                whole = self.pool.heads.whole(data[:end])
                if whole is not None and len(data) == end + 4 + whole[4]:
                    self._take_whole(exchange, whole, data, end + 4)
                    return
        if head is not None:
            head = self._head = head + data if head else data
        # the response head and body of one read leave to the client in one send
        native = exchange.client if exchange is not None and exchange is user else None
        client = user.client if native is None else native
        corked = native.cork() if native is not None else client.cork()
        switched: bytes | None = None
        unsolicited = False  # bytes behind the response owed came in this read
        try:
            self._parser.feed_data(data)
            if self._unsolicited:
                unsolicited = True
                self._drop_unsolicited()
            elif self._whole_keep_alive >= 0:
                self._learn_whole(len(data))
            head = self._head
            if head is not None and len(head) > MAX_RESPONSE_HEAD:
                raise _InvalidResponse(f"response head larger than {MAX_RESPONSE_HEAD} bytes")
            if self.framing == CHUNKED and self.user is not None:
                self._keep_tail(data)
        except httptools.HttpParserUpgrade as exc:
            # a 101 the exchange accepted (see on_headers_complete): the rest is tunnelled
            switched = data[exc.args[0] :]
        except (httptools.HttpParserError, _InvalidResponse) as exc:
            # the response's framing is in doubt: this connection never carries another
            failed = self.user
            self.abort()
            if self._done_in_read:  # what followed the response owed did not parse
                unsolicited = True
                self._count_unsolicited()
            if failed is not None:
                if isinstance(exc, _InvalidResponse):
                    reason = str(exc)
                elif isinstance(exc.__context__, _InvalidResponse):
                    reason = str(exc.__context__)
                else:
                    reason = f"invalid response: {exc}"
                failed.upstream_invalid(self, reason)
        finally:
            ending = self._ending
            if ending is not None:
                self._ending = None
                # with bytes behind it in the read, its trailers cannot be told from them
                self._end_chunked(ending[0], ending[1], data, trailers=not unsolicited)
            if corked:
                if native is not None:
                    native.uncork()
                else:
                    client.uncork()
        if switched is not None:
            self._cancel_timer()
            self._waiting = False
            self.user = None
            self.exchange = None
            user.upstream_switched(self, switched)
            return
        if self._reset_parser:
            # a response to HEAD ends with its head, which httptools cannot be told
            self._reset_parser = False
            self._parser = httptools.HttpResponseParser(self)

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        user = self.user
        if user is None:
            self.pool.discard(self)
            return
        self.user = None
        self.exchange = None
        if self.framing == UNTIL_CLOSE and self._status >= 200:
            user.response_complete(False)
        else:
            user.upstream_lost(
                self, "connection closed" if exc is None else f"connection lost: {exc}"
            )

    def pause_writing(self) -> None:
        if self.user is not None:
            self.user.upstream_pause_writing()

    def resume_writing(self) -> None:
        if self.user is not None:
            self.user.upstream_resume_writing()

    # --- httptools callbacks ----------------------------------------------------

    def on_message_begin(self) -> None:
        if self._done_in_read:
            # bytes behind the response, in the same read, that no request asked for:
            # the parser is inside them now (see _drop_unsolicited)
            self._unsolicited = True

    def on_headers_complete(self) -> None:
        user = self.user
        if user is None:
            return
        exchange = self.exchange
        status = self._status = self._parser.get_status_code()
        received = self._head
        end = -1 if received is None else received.find(b"\r\n\r\n")
        if received is None or end < 0 or end > MAX_RESPONSE_HEAD:
            # httptools ends a head only at CRLF CRLF
            raise _InvalidResponse(f"response head larger than {MAX_RESPONSE_HEAD} bytes")
        # after an interim (1xx) response the next head starts right behind this one
        self._head = received[end + 4 :] if status < 200 else None
        seen = received[:end]
        heads = self.pool.heads
        parsed = heads.parse(seen)
        status_line, fields, scan = parsed
        # this head, for _learn_whole: only a final one, and only one seen before (a
        # head that never repeats is not worth keeping)
        if heads.hit and status >= 200:
            # a short head (the cache keeps none over 2 KiB), and the parse is the cache's
            self._head_seen, self._head_parsed = seen, parsed
        else:
            self._head_seen = self._head_parsed = None
        if scan.named is not None and scan.named & _FRAMING:
            raise _InvalidResponse("the response's Connection field names its framing")
        if status == 101:
            error = user.response_switching(status_line, fields, scan)
            if error is not None:
                raise _InvalidResponse(error)
            self.framing = EMPTY
            return
        if status < 200:
            framing = EMPTY
        elif exchange.no_body if exchange is not None and exchange is user else user.no_body:
            framing = EMPTY
            self._reset_parser = True
            self._done_in_read = True  # it ends here: a message after it was never owed
        elif status in _NO_BODY_STATUSES:
            framing = EMPTY
        else:
            coding = scan.coding
            if coding is None:
                framing = LENGTH if scan.has_length else UNTIL_CLOSE
            elif coding.endswith(b"chunked"):  # Transfer-Encoding wins over a length
                framing = CHUNKED
                self._named = scan.named
            else:
                framing = UNTIL_CLOSE
        self.framing = framing
        if exchange is not None and exchange is user:
            exchange.response_head(status, status_line, fields, scan, framing)
        else:
            user.response_head(status, status_line, fields, scan, framing)
        if self._reset_parser and self.user is user:
            self._finish(user, self._parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self._reset_parser:
            # a response to HEAD ends with its head: the parser, which cannot be told,
            # reads these bytes as its body. Never owed (see _drop_unsolicited)
            self._unsolicited = True
            return
        self._body_seen += len(body)
        user = self.user
        exchange = self.exchange
        if exchange is not None and exchange is user:
            exchange.response_body(body)
        elif user is not None:
            user.response_body(body)

    def on_message_complete(self) -> None:
        user = self.user
        if user is None or self._status < 200 or self._reset_parser:
            return  # 1xx interim responses are followed by the real one
        self._done_in_read = True
        if self.framing == CHUNKED:
            # its trailers are in the bytes of this read: finished when it is processed
            self.user = None
            self.exchange = None
            self._ending = (user, self._parser.should_keep_alive())
            return
        # _finish, inline: this runs once per response
        self._waiting = False
        self.user = None
        keep_alive = self._parser.should_keep_alive()
        if self.framing == LENGTH:
            self._whole_keep_alive = 1 if keep_alive else 0
        exchange = self.exchange
        if exchange is not None and exchange is user:
            self.exchange = None
            exchange.response_complete(keep_alive)
        else:
            user.response_complete(keep_alive)

    def _drop_unsolicited(self) -> None:
        """The upstream sent more than the response owed. Pooled, the connection would
        hand those bytes (and a parser inside them) to the next request: it is closed
        instead, and counted."""
        self._unsolicited = False
        self._count_unsolicited()
        user = self.user  # none: the next request has not been given the connection
        self.abort()
        if user is not None:
            user.upstream_invalid(self, "bytes after the previous response")

    def _count_unsolicited(self) -> None:
        metrics = self.pool.metrics
        if metrics is not None:
            metrics.upstream_unsolicited += 1

    def _learn_whole(self, received: int) -> None:
        """A response framed by its length completed in the read just parsed: if that
        read was exactly its head and body, the head cache learns it (`_take_whole`)."""
        keep_alive = self._whole_keep_alive
        self._whole_keep_alive = -1
        head, parsed = self._head_seen, self._head_parsed
        self._head_seen = self._head_parsed = None  # a pooled connection keeps neither
        if head is None or parsed is None or self._status < 200:
            return
        if received == len(head) + 4 + self._body_seen:
            self.pool.heads.learn_whole(
                head, parsed, self._status, self._body_seen, keep_alive == 1
            )

    def _take_whole(
        self, exchange: Exchange, whole: WholeResponse, data: bytes, start: int
    ) -> None:
        """The response in `data` is one the parser took whole before (same head, same
        length, body from `start`): the exchange gets what the parser's callbacks would
        have given it, without the parser."""
        status_line, fields, scan, status, body, keep_alive = whole
        self.pool.heads.whole_hits += 1
        self._head = None
        self._status = status
        self.framing = LENGTH
        client = exchange.client
        corked = client.cork()
        try:
            exchange.response_head(status, status_line, fields, scan, LENGTH)
            if body and self.exchange is exchange:
                exchange.response_body(data[start:])
            if self.exchange is exchange:
                self._waiting = False
                self.user = None
                self.exchange = None
                exchange.response_complete(keep_alive)
        except Exception as exc:  # as a parser callback's error would be: cut, report
            failed = self.user  # the exchange, or one that took the connection after it
            self.abort()
            if failed is not None:
                failed.upstream_invalid(self, f"invalid response: {exc}")
        finally:
            if corked:
                client.uncork()

    def _keep_tail(self, data: bytes) -> None:
        """Keep the last reads of a chunked response, enough to hold its trailers."""
        if len(data) > TAIL_BYTES:
            data = data[-TAIL_BYTES:]  # a copy, so that a large read is not held whole
        recent = self._recent
        recent.append(data)
        self._recent_len += len(data)
        while self._recent_len - len(recent[0]) >= TAIL_BYTES:
            self._recent_len -= len(recent.pop(0))

    def _end_chunked(
        self, user: UpstreamUser, keep_alive: bool, data: bytes, *, trailers: bool = True
    ) -> None:
        """A chunked response is complete: pass its trailers on (unless `trailers` is
        false: none are looked for), then finish it."""
        recent = self._recent
        if trailers and not data.endswith(b"\r\n0\r\n\r\n"):  # the usual end, none
            tail = b"".join([*recent, data]) if recent else data
            section = trailer_section(tail[-TAIL_BYTES:])
            if section != b"":
                user.response_trailers(section, self._named)
        if recent:
            self._recent = []
            self._recent_len = 0
        self._named = None
        self._finish(user, keep_alive)

    def _finish(self, user: UpstreamUser, keep_alive: bool) -> None:
        self._waiting = False
        self.user = None
        self.exchange = None
        user.response_complete(keep_alive)

    # --- used by the exchange ---------------------------------------------------

    def detach(self) -> asyncio.Transport:
        """Give up the transport for good (a tunnel takes it over after a 101)."""
        assert self.transport is not None
        self.user = None
        self.exchange = None
        self._cancel_timer()
        self.closed = True  # never pooled, never closed from here
        return self.transport

    def attach(self, user: UpstreamUser, exchange: Exchange | None = None) -> None:
        """`exchange`: `user` itself when it is one (see `self.exchange`)."""
        self.user = user
        self.exchange = exchange
        self._head_seen = None
        self._head_parsed = None
        self._body_seen = 0
        self._whole_keep_alive = -1
        self.got_data = False
        self._status = 0
        self.framing = LENGTH
        self._head = b""  # the response starts with the next byte received

    def uncork(self) -> None:
        self.send_held()

    def arm_read_timeout(self) -> None:
        """Start (or keep) the read timeout: it fires after `read_timeout` seconds
        without a byte from the upstream while a response is owed. One timer per
        connection is re-armed lazily instead of one per request."""
        self._waiting = True
        self._last_activity = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_later(self.pool.read_timeout, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self._waiting or self.user is None or self.closed:
            return
        if self.reading_paused:
            # the client is slow to take the response; that is not the upstream's fault
            self._timer = self._loop.call_later(self.pool.read_timeout, self._on_timer)
            return
        remaining = self._last_activity + self.pool.read_timeout - self._loop.time()
        if remaining > 0:
            self._timer = self._loop.call_later(remaining, self._on_timer)
            return
        user = self.user
        self.user = None
        self.exchange = None
        self.abort()
        user.upstream_timeout(self)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused:
            self.reading_paused = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()

    def release(self, reusable: bool) -> None:
        """Give the connection back after a complete exchange."""
        self.user = None
        self.exchange = None
        self._waiting = False
        if self.reading_paused:
            self.resume_reading()
        if reusable and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    def close(self) -> None:
        self.user = None
        self.exchange = None
        self._cancel_timer()
        if self._out is not None:
            self.uncork()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def abort(self) -> None:
        self.user = None
        self.exchange = None
        self._cancel_timer()
        self._out = None
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()


class UpstreamPool:
    """Idle keep-alive connections to one upstream; at most `max_idle` are kept."""

    __slots__ = (
        "_closing",
        "_idle",
        "_ssl",
        "base_path",
        "connect_timeout",
        "heads",
        "host_header",
        "loop",
        "max_idle",
        "metrics",
        "read_timeout",
        "upstream",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        upstream: Upstream,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_idle: int,
        ssl_context: ssl.SSLContext | None,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.loop = loop
        self.metrics = metrics
        self.upstream = upstream
        # computed once per upstream rather than per request
        self.host_header = upstream.authority.encode("idna")
        self.base_path = upstream.base_path.encode()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle = max_idle
        self.heads = HeadCache()  # the response heads this upstream repeats
        self._idle: list[UpstreamConnection] = []
        self._closing = False
        self._ssl: ssl.SSLContext | None = None
        if upstream.scheme == "https":
            self._ssl = ssl_context if ssl_context is not None else ssl.create_default_context()

    def __len__(self) -> int:
        return len(self._idle)

    def acquire(self) -> UpstreamConnection | None:
        """The most recently used idle connection, or None: the caller connects."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        return None

    async def connect(self) -> UpstreamConnection:
        """A fresh connection; raises TimeoutError or OSError (ssl.SSLError included)."""
        up = self.upstream
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await self.loop.create_connection(
                lambda: UpstreamConnection(self),
                up.host,
                up.port,
                ssl=self._ssl,
                server_hostname=up.host if self._ssl is not None else None,
            )
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        if self._closing or len(self._idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        self._idle.append(conn)

    def discard(self, conn: UpstreamConnection) -> None:
        """An idle connection closed by the upstream leaves the pool."""
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)

    def sweep(self, idle_timeout: float) -> None:
        """Close connections idle for longer than `idle_timeout` (oldest are first)."""
        cutoff = self.loop.time() - idle_timeout
        idle = self._idle
        while idle and idle[0].idle_since < cutoff:
            idle.pop(0).close()

    def close(self) -> None:
        self._closing = True
        while self._idle:
            self._idle.pop().close()
