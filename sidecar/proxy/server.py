"""The client-facing side of the proxy and the exchange that ties both sides together.

One `ClientConnection` per client socket parses requests with httptools. Each request
becomes an `Exchange`: it asks the `Chooser` for a variant, takes a pooled upstream
connection (or opens one) and from then on parser callbacks on either side write
straight to the other transport. No task and no queue sits on the data path; a task
exists only while a fresh upstream connection is being opened.

Flow control: a full upstream write buffer pauses reading from the client, a full
client write buffer pauses reading from the upstream, so a body of any size streams
through with at most a few transport buffers in memory.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, TIMEOUT
from sidecar.choice import Choice, Chooser, NoRoute, Recorder, Sample, Upstream
from sidecar.proxy import conformance, errors
from sidecar.proxy.conformance import Rejected
from sidecar.proxy.corking import CorkedWriter
from sidecar.proxy.headers import (
    PLAIN_CONNECTION,
    Header,
    HeaderView,
    ResponseFields,
    connection_options,
    interim_head,
    request_head,
    response_head,
)
from sidecar.proxy.limits import RateLimitedLog
from sidecar.proxy.metrics import ProxyMetrics
from sidecar.proxy.upstream import (
    CHUNKED,
    UNTIL_CLOSE,
    UpstreamConnection,
    UpstreamPool,
)

log = logging.getLogger(__name__)

# RFC 9110 §9.2.2; only these may be replayed on a fresh connection
_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
_LAST_CHUNK = b"0\r\n\r\n"
_CRLF = b"\r\n"

# why reading from a client is paused: a bit each, reading resumes when none is left
_UPSTREAM_FULL = 1  # the upstream's write buffer is above its high-water mark
_WAIT_UPSTREAM = 2  # body bytes arrive while no upstream connection is ready
_PIPELINED = 4  # a pipelined request waits for the one before it
_STOPPED = 8  # nothing more will be read (upgrade requested, parse error)


# after an upstream answered before the request body was all in, the rest of the body
# is read and dropped for at most this long, so the close does not reset the answer
_LINGER = 2.0


@dataclass(frozen=True, slots=True)
class ProxyOptions:
    connect_timeout: float = 2.0  # seconds to open an upstream connection (→ 504)
    read_timeout: float = 30.0  # seconds without a byte while a response is owed (→ 504)
    max_pool_per_upstream: int = 256  # idle keep-alive connections kept per upstream
    pool_idle_timeout: float = 60.0  # idle upstream connections older than this are closed
    client_idle_timeout: float = 75.0  # idle keep-alive client connections are closed
    shutdown_timeout: float = 10.0  # stop(): in-flight requests get this long to finish
    forwarded_proto: str = "http"  # X-Forwarded-Proto: the scheme clients used
    preserve_host: bool = False  # pass the client's Host instead of the upstream's
    ssl_context: ssl.SSLContext | None = None  # for https upstreams; default: system CAs
    backlog: int = 1024
    max_head_bytes: int = 64 * 1024  # request line + headers; larger answers 431
    # client connections held at once; more are answered 503 and closed at once
    max_connections: int = 10_000
    # seconds for a request head to arrive in full, from its first byte (from the
    # connection's opening for its first request); then 408 and close
    head_timeout: float = 10.0
    # the listener's TLS (clients speak HTTPS to the sidecar); X-Forwarded-Proto then
    # says https
    listen_tls: ssl.SSLContext | None = None


# finished requests are handed to the recorder when this many wait, or this long after
# the first of them: bulk is cheaper, and a few milliseconds do not matter to windows
# of seconds
SAMPLE_FLUSH_COUNT = 256
SAMPLE_FLUSH_DELAY = 0.005


def _chunk(data: bytes) -> list[bytes]:
    return [b"%x\r\n" % len(data), data, _CRLF]


class Exchange:
    """One request and its response through the proxy."""

    __slots__ = (
        "body_sent",
        "choice",
        "chunked",
        "client",
        "close_after",
        "connect_task",
        "has_body",
        "head",
        "headers",
        "http_1_0",
        "method",
        "named",
        "no_body",
        "pending",
        "pool",
        "req_complete",
        "resp_chunked",
        "resp_done",
        "resp_started",
        "retried",
        "status",
        "t0",
        "t_sent",
        "target",
        "ts",
        "upstream",
        "variant",
    )

    def __init__(
        self,
        client: ClientConnection,
        method: bytes,
        target: bytes,
        headers: list[Header],
        keep_alive: bool,
        http_1_0: bool,
        chunked: bool,
        named: frozenset[bytes] | None,
        has_body: bool,
    ) -> None:
        clock = client.server.clock
        self.t0 = clock.monotonic()
        self.ts = clock.now()
        self.client = client
        self.method = method
        self.no_body = method == b"HEAD"  # the response ends with its head
        self.target = target
        self.headers = headers
        self.close_after = not keep_alive
        self.http_1_0 = http_1_0
        self.chunked = chunked
        self.has_body = has_body  # chunked or a non-zero Content-Length
        self.named = named  # header names the client's Connection header lists
        self.choice: Choice | None = None
        self.variant = b""
        self.pool: UpstreamPool | None = None
        self.upstream: UpstreamConnection | None = None
        self.connect_task: asyncio.Task[None] | None = None
        self.pending: list[bytes] | None = None
        self.head = b""
        self.req_complete = False
        self.resp_started = False
        self.resp_done = False
        self.resp_chunked = False
        self.body_sent = False
        self.retried = False
        self.status = 0
        self.t_sent: float | None = None

    # --- request side -----------------------------------------------------------

    def start(self) -> None:
        """Choose the variant and send the head upstream (the exchange is current)."""
        server = self.client.server
        try:
            choice = server.chooser.choose(HeaderView(self.headers))
        except NoRoute as exc:
            self._local_answer(errors.no_route(str(exc), close=self._must_close()), 503)
            return
        except Exception:
            log.exception("the chooser failed; answering 503")
            self._local_answer(
                errors.no_route("routing failed in the sidecar", close=self._must_close()), 503
            )
            return
        self.choice = choice
        self.variant = choice.variant.encode()
        try:
            pool = self.pool = server.pool_for(choice.upstream)
        except Exception as exc:  # e.g. an Upstream built by hand with a bad host name
            log.exception("no pool for upstream %s", choice.upstream)
            self._fail(502, 502, f"unusable upstream {choice.upstream}: {exc}")
            return
        opts = server.options
        host = pool.host_header
        if opts.preserve_host:
            host = next((v for low, _, v in self.headers if low == b"host"), host)
        target = self.target
        base = pool.base_path
        self.head = request_head(
            self.method,
            base + target if base and target != b"*" else target,
            self.headers,
            host=host,
            client_ip=self.client.client_ip,
            proto=server.forwarded_proto,
            variant=self.variant,
            experiment=None if choice.experiment is None else choice.experiment.encode(),
            chunked=self.chunked,
            named=self.named,
        )
        conn = pool.acquire()
        if conn is not None:
            self._attach(conn)
        else:
            self._connect(pool)

    def request_body(self, chunk: bytes) -> None:
        if self.resp_done:
            return  # answered already (error, or the upstream did not wait): discard
        conn = self.upstream
        if conn is not None:
            if self.chunked:
                conn.writelines(_chunk(chunk))
            else:
                conn.write(chunk)
            self.body_sent = True
            return
        if self.pending is None:
            self.pending = []
        self.pending.append(chunk)
        self.client.block(_WAIT_UPSTREAM)

    def request_complete(self) -> None:
        self.req_complete = True
        if self.resp_done:
            self.client.exchange_finished(self)
            return
        conn = self.upstream
        if conn is not None:
            if self.chunked:
                conn.write(_LAST_CHUNK)
            conn.arm_read_timeout()

    def _attach(self, conn: UpstreamConnection) -> None:
        self.upstream = conn
        conn.attach(self)
        if self.has_body:
            # the head and what the same read brings of the body leave in one send
            self.client.cork_upstream(conn)
        if self.client.write_paused:
            conn.pause_reading()
        pending = self.pending
        if pending:
            parts = [self.head]
            for chunk in pending:
                if self.chunked:
                    parts += _chunk(chunk)
                else:
                    parts.append(chunk)
            self.pending = None
            self.body_sent = True
            if self.req_complete and self.chunked:
                parts.append(_LAST_CHUNK)
            conn.writelines(parts)
        elif self.req_complete and self.chunked:
            conn.writelines([self.head, _LAST_CHUNK])
        else:
            conn.write(self.head)
        self.t_sent = self.client.server.clock.monotonic()
        if self.client.read_block:
            self.client.unblock(_WAIT_UPSTREAM)
        if self.req_complete:
            conn.arm_read_timeout()

    def _connect(self, pool: UpstreamPool) -> None:
        server = self.client.server
        task = server.loop.create_task(self._open(pool))
        self.connect_task = task
        server.tasks.add(task)
        task.add_done_callback(server.tasks.discard)

    async def _open(self, pool: UpstreamPool) -> None:
        try:
            conn = await pool.connect()
        except TimeoutError:
            self.connect_task = None
            self._fail(504, TIMEOUT, f"no connection within {pool.connect_timeout:g} s")
            return
        except OSError as exc:
            self.connect_task = None
            reason = exc.strerror or str(exc) or type(exc).__name__
            self._fail(502, CONNECT_ERROR, f"cannot connect to {pool.upstream}: {reason}")
            return
        self.connect_task = None
        self.client.server.metrics.upstream_connects += 1
        if self.client.closed or self.resp_done:
            pool.release(conn)  # unused and healthy: keep it for the next request
            return
        self._attach(conn)

    # --- response side (called by UpstreamConnection) ---------------------------

    def response_head(
        self,
        status: int,
        status_line: bytes,
        fields: bytes,
        scan: ResponseFields,
        framing: int,
    ) -> None:
        client = self.client
        if status < 200:
            if status != 101:  # upgrades are not tunnelled: Upgrade was not forwarded
                client.write(interim_head(status_line, fields, scan))
            return
        self.status = status
        if not self.req_complete:
            # answered before the request was all in: the connection cannot be trusted
            # to frame what follows, so it closes after this response
            self.close_after = True
        if framing in (CHUNKED, UNTIL_CLOSE):
            if self.http_1_0:
                self.close_after = True  # an HTTP/1.0 client reads to the end instead
            else:
                self.resp_chunked = True
        close = self.close_after or client.server.draining
        client.write(
            response_head(
                status_line,
                fields,
                scan,
                variant=self.variant,
                chunked=self.resp_chunked,
                close=close,
                keep_alive_1_0=self.http_1_0 and not close,
            )
        )
        self.resp_started = True

    def response_body(self, chunk: bytes) -> None:
        if self.resp_chunked:
            self.client.writelines(_chunk(chunk))
        else:
            self.client.write(chunk)

    def response_complete(self, reusable: bool) -> None:
        if self.resp_chunked:
            self.client.write(_LAST_CHUNK)
        self.resp_done = True
        conn = self.upstream
        self.upstream = None
        if conn is not None:
            # a request still being sent cannot share its connection with the next one
            conn.release(reusable and self.req_complete)
        if self.client.read_block:
            self.client.unblock(_UPSTREAM_FULL | _WAIT_UPSTREAM)
        self._record(self.status)
        if self.req_complete:
            self.client.exchange_finished(self)
        else:
            self.client.linger()

    def upstream_invalid(self, conn: UpstreamConnection, reason: str) -> None:
        """The upstream's response is malformed or badly framed: neither connection
        can be trusted to carry another message."""
        self.close_after = True
        self.upstream_lost(conn, reason)

    def upstream_lost(self, conn: UpstreamConnection, reason: str) -> None:
        if conn is not self.upstream:
            return
        self.upstream = None
        self.client.unblock(_UPSTREAM_FULL)
        if self.resp_started:
            self._abort(502)  # the status is out: all that is left is to cut the client
            return
        pool = self.pool
        if (
            conn.reused
            and not conn.got_data
            and not self.body_sent
            and not self.retried
            and self.method in _IDEMPOTENT
            and pool is not None
        ):
            # a pooled connection the upstream had closed: replay once on a fresh one
            self.retried = True
            self.client.server.metrics.upstream_retries += 1
            self._connect(pool)
            return
        self._fail(502, 502, reason)

    def upstream_timeout(self, conn: UpstreamConnection) -> None:
        if conn is not self.upstream:
            return
        self.upstream = None
        self.client.unblock(_UPSTREAM_FULL)
        if self.resp_started:
            self._abort(TIMEOUT)
            return
        timeout = self.client.server.options.read_timeout
        self._fail(504, TIMEOUT, f"no response within {timeout:g} s")

    def upstream_pause_writing(self) -> None:
        self.client.block(_UPSTREAM_FULL)

    def upstream_resume_writing(self) -> None:
        self.client.unblock(_UPSTREAM_FULL)

    # --- endings ----------------------------------------------------------------

    def _must_close(self) -> bool:
        return self.close_after or self.client.server.draining

    def _local_answer(self, response: bytes, status: int) -> None:
        """Answer from the proxy itself (no route)."""
        self.status = status
        if not self.req_complete:
            self.close_after = True  # do not read a body nobody wants
        self.resp_done = True
        self.client.write(response)
        self.client.server.metrics.observe("none", status, None)
        if self.req_complete:
            self.client.exchange_finished(self)
        elif self.close_after:
            self.client.close()

    def _fail(self, status: int, outcome: int, reason: str) -> None:
        """Answer 502/504 for an upstream that could not be reached or did not answer."""
        if self.resp_done or self.client.closed:
            return
        choice = self.choice
        assert choice is not None
        if not self.req_complete:
            self.close_after = True
        close = self._must_close()
        if status == 504:
            body = errors.gateway_timeout(choice.variant, choice.experiment, reason, close=close)
        else:
            body = errors.bad_gateway(choice.variant, choice.experiment, reason, close=close)
        self.status = status
        self.resp_done = True
        self.client.write(body)
        self._record(outcome)
        if self.req_complete:
            self.client.exchange_finished(self)
        elif close:
            self.client.close()

    def _abort(self, outcome: int) -> None:
        """The response broke after its head went out: cut the client connection."""
        self.resp_done = True
        self.client.abort()
        self._record(outcome)

    def request_broken(self) -> None:
        """The request's body broke its framing part-way: the upstream holds part of a
        request, so its connection is cut, never pooled."""
        task = self.connect_task
        if task is not None:
            task.cancel()
            self.connect_task = None
        conn = self.upstream
        self.upstream = None
        self.pending = None
        self.close_after = True
        if conn is not None:
            conn.abort()
        if not self.resp_done and self.choice is not None:
            self.resp_done = True
            self._record(ABORTED if self.resp_started else 400)
        self.resp_done = True

    def client_lost(self) -> None:
        task = self.connect_task
        if task is not None:
            task.cancel()
            self.connect_task = None
        conn = self.upstream
        self.upstream = None
        if conn is not None:
            conn.abort()  # mid-exchange: its state is unknown, never pool it
        if not self.resp_done and self.choice is not None:
            self.resp_done = True
            self._record(ABORTED)

    def _record(self, outcome: int) -> None:
        """After the response went out: metrics and one sample."""
        if self.choice is not None and not self.client.record_after_flush(self, outcome):
            self.client.server.finished([(self, outcome)])


class ClientConnection(CorkedWriter, asyncio.Protocol):
    """One client socket: parses requests, runs their exchanges in order."""

    __slots__ = (
        "_after_flush",
        "_chunked",
        "_corked_upstreams",
        "_has_length",
        "_head_budget",
        "_headers",
        "_host",
        "_named",
        "_rejection",
        "_url",
        "client_ip",
        "closed",
        "current",
        "head_since",
        "idle_since",
        "parser",
        "parsing",
        "queue",
        "read_block",
        "refused",
        "server",
        "transport",
        "write_paused",
    )

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.client_ip = b"unknown"
        self.closed = False
        self.current: Exchange | None = None
        self.parsing: Exchange | None = None
        self.queue: deque[Exchange] = deque()
        self.read_block = 0
        self.write_paused = False
        self.idle_since = 0.0
        # when the request head being received began (0.0: none is), see on_message_begin
        self.head_since = 0.0
        self.refused = False  # closed at once: the connection cap was reached
        self._rejection: bytes | None = None  # sent once the requests before it are answered
        self._url = b""
        self._headers: list[Header] = []
        self._host: bytes | None = None
        self._chunked = False
        self._has_length = False
        self._named: frozenset[bytes] | None = None
        self._head_budget = server.options.max_head_bytes
        # Writes collected while one read is processed leave in one send: syscalls,
        # not Python, are most of a small request's cost.
        self._out: list[bytes] | None = None
        self._after_flush: list[tuple[Exchange, int]] = []
        self._corked_upstreams: list[UpstreamConnection] | None = None

    # --- asyncio.Protocol -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.client_ip = str(peer[0]).encode()
        self.idle_since = self.head_since = self.server.time()
        self.server.connection_opened(self)

    def data_received(self, data: bytes) -> None:
        corked: list[UpstreamConnection] = []
        self._corked_upstreams = corked
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # the request went on as a plain one (Upgrade is hop-by-hop and dropped);
            # what follows is another protocol, so the connection ends after it
            last = self.parsing or (self.queue[-1] if self.queue else self.current)
            if last is not None:
                last.close_after = True
            self.block(_STOPPED)
        except httptools.HttpParserError as exc:
            self.refuse(exc)
        finally:
            self._corked_upstreams = None
            for upstream in corked:
                upstream.uncork()

    def refuse(self, exc: httptools.HttpParserError) -> None:
        """A request was refused, by httptools or by the checks in `conformance`.

        Nothing after it on this connection is read: its framing is in doubt. A
        request whose body was being read when it broke has its upstream connection
        cut. Complete requests before it are answered first, then the error, then
        the connection closes."""
        self.block(_STOPPED)
        cause = exc.__context__
        if isinstance(cause, Rejected):
            status, reason, detail = cause.status, cause.reason, cause.detail
        else:
            status, reason = 400, conformance.parser_error_reason(exc)
            detail = f"malformed request: {exc}"
        self.server.metrics.reject(reason)
        response = (
            errors.head_too_large(self.server.options.max_head_bytes)
            if status == 431
            else errors.rejected(status, detail)
        )
        broken = self.parsing
        self.parsing = None
        if broken is not None:
            broken.request_broken()
            if broken is self.current:
                self.current = None
                if broken.resp_started:
                    self.abort()  # part of its response is out: all that is left is to cut
                    return
            else:  # queued behind the current request and never started
                self.queue.remove(broken)
        if self.current is None:
            self.write(response)
            self.close()
        else:
            self._rejection = response  # after the responses still owed

    def linger(self) -> None:
        """The response went out before its request was all in: the rest of the
        request is read and dropped, then the connection closes (at the latest after
        `_LINGER` seconds; closing with unread data would reset the response)."""
        if not self.closed:
            self.server.loop.call_later(_LINGER, self.close)

    def cork_upstream(self, upstream: UpstreamConnection) -> None:
        """While this read is processed, hold what goes to `upstream` for one send."""
        corked = self._corked_upstreams
        if corked is not None and upstream.cork():
            corked.append(upstream)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        current = self.current
        self.current = None
        self.queue.clear()
        if current is not None:
            current.client_lost()
        if not self.refused:
            self.server.connection_closed(self)

    def pause_writing(self) -> None:
        self.write_paused = True
        current = self.current
        if current is not None and current.upstream is not None:
            current.upstream.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        current = self.current
        if current is not None and current.upstream is not None:
            current.upstream.resume_reading()

    # --- httptools callbacks ----------------------------------------------------

    # httptools sets no limit on a request head: without one a client could make the
    # proxy hold any amount of memory. `_head_budget` is what is left of the limit.

    def on_message_begin(self) -> None:
        if not self.head_since:  # a new connection's head is timed from its opening
            self.head_since = self.server.time()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_budget -= len(url)
        if self._head_budget < 0:
            raise self._too_large()

    def _too_large(self) -> Rejected:
        limit = self.server.options.max_head_bytes
        return Rejected(431, "head_too_large", f"request line and headers exceed {limit} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        budget = self._head_budget = self._head_budget - len(name) - len(value) - 4
        if budget < 0:
            raise self._too_large()
        lower = name.lower()
        if lower == b"host":
            if self._host is not None:
                raise conformance.duplicate_host()
            self._host = value
        elif lower == b"content-length":
            # httptools has checked it is one decimal number, at most surrounded by OWS
            self._has_length = value.strip().lstrip(b"0") != b""
        elif lower == b"transfer-encoding":
            if self._chunked:
                raise conformance.duplicate_transfer_encoding()
            conformance.check_transfer_coding(value)
            self._chunked = True
        elif lower == b"connection" and value not in PLAIN_CONNECTION:
            conformance.check_connection(value)
            options = connection_options(value)
            if options is not None:
                self._named = options if self._named is None else self._named | options
        self._headers.append((lower, name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        version = parser.get_http_version()
        method = parser.get_method()
        if version != "1.1":
            if version != "1.0":
                raise conformance.unsupported_version(version)
            if self._chunked:  # RFC 9112 §6.1: an HTTP/1.0 message's framing is faulty
                raise Rejected(400, "framing", "Transfer-Encoding in an HTTP/1.0 request")
        elif self._host is None:
            raise conformance.missing_host()
        if method == b"CONNECT":
            raise conformance.connect_refused()
        target = self._url
        if not target.startswith(b"/"):
            target = conformance.request_target(method, target, self._host)
        self.head_since = 0.0
        exchange = Exchange(
            self,
            method,
            target,
            self._headers,
            parser.should_keep_alive(),  # keep_alive
            version == "1.0",  # http_1_0
            self._chunked,
            self._named,
            self._chunked or self._has_length,  # has_body
        )
        # what the next request's head is gathered into
        self._url = b""
        self._headers = []
        self._host = None
        self._chunked = self._has_length = False
        self._named = None
        self._head_budget = self.server.options.max_head_bytes
        self.parsing = exchange
        if self.current is None:
            self.current = exchange
            exchange.start()
        else:
            self.queue.append(exchange)
            self.block(_PIPELINED)

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange is not None:
            exchange.request_body(body)

    def on_message_complete(self) -> None:
        exchange = self.parsing
        self.parsing = None
        if exchange is not None:
            exchange.request_complete()

    # --- used by exchanges ------------------------------------------------------

    def exchange_finished(self, exchange: Exchange) -> None:
        if exchange is not self.current:
            return
        self.current = None
        if exchange.close_after or self.server.draining:
            self.close()
            return
        if self.queue:
            following = self.queue.popleft()
            if not self.queue:
                self.unblock(_PIPELINED)
            self.current = following
            following.start()
        elif self._rejection is not None:
            self.write(self._rejection)
            self.close()
        else:
            self.idle_since = self.server.time()

    @property
    def idle(self) -> bool:
        return self.current is None and self.parsing is None

    def uncork(self) -> None:
        """Send what was collected in one go, then record what finished meanwhile."""
        self.send_held()
        if self._after_flush:
            finished, self._after_flush = self._after_flush, []
            self.server.finished(finished)

    def record_after_flush(self, exchange: Exchange, outcome: int) -> bool:
        """Defer a record until the response bytes are handed to the transport."""
        if self._out is None:
            return False
        self._after_flush.append((exchange, outcome))
        return True

    def block(self, reason: int) -> None:
        if not self.read_block and not self.closed and self.transport is not None:
            self.transport.pause_reading()
        self.read_block |= reason

    def unblock(self, reasons: int) -> None:
        if self.read_block & reasons:
            self.read_block &= ~reasons
            if not self.read_block and not self.closed and self.transport is not None:
                self.transport.resume_reading()

    def close(self) -> None:
        if self._out is not None:
            self.uncork()  # what was collected goes out before the close
        if not self.closed and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self._out is not None:
            self._out = []
            self.uncork()  # nothing to send, but deferred records still run
        if not self.closed and self.transport is not None:
            self.transport.abort()


class ProxyServer:
    """The reverse proxy: `await start(host, port)`, `await stop()`.

    `chooser` says where each request goes, `recorder` hears how it went (after the
    response is out). Counters are in `metrics`; export them with
    `ProxyMetricsCollector`.
    """

    def __init__(
        self,
        chooser: Chooser,
        recorder: Recorder,
        *,
        options: ProxyOptions | None = None,
        clock: Clock | None = None,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.chooser = chooser
        self.recorder = recorder
        self.options = options if options is not None else ProxyOptions()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.metrics = metrics if metrics is not None else ProxyMetrics()
        proto = "https" if self.options.listen_tls is not None else self.options.forwarded_proto
        self.forwarded_proto = proto.encode()
        self.draining = False
        # the loop's clock once started (idle times are measured on it)
        self.time: Callable[[], float] = time.monotonic
        self.tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._pools: dict[Upstream, UpstreamPool] = {}
        self._pools_by_id: dict[int, tuple[Upstream, UpstreamPool]] = {}
        self._connections: set[ClientConnection] = set()
        self._all_closed: asyncio.Event | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        # finished requests wait here for `flush_samples`: the recorder and the
        # metrics take them in bulk, a C loop per column instead of calls per request
        self._samples: list[Sample] = []
        self._overheads: list[float] = []
        self._flush_timer: asyncio.TimerHandle | None = None
        self._refusals = RateLimitedLog(log, lambda: self.time())
        self._accept_errors = RateLimitedLog(log, lambda: self.time())

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the proxy is not started"
        return self._loop

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port (port 0: any free port, see `port`)."""
        self._loop = asyncio.get_running_loop()
        self.time = self._loop.time
        self._all_closed = asyncio.Event()
        self._server = await self._loop.create_server(
            lambda: ClientConnection(self),
            host,
            port,
            backlog=self.options.backlog,
            reuse_address=True,
            ssl=self.options.listen_tls,
        )
        self._sweeper = self._loop.call_later(self._sweep_interval(), self._sweep)

    @property
    def port(self) -> int:
        """The port actually bound."""
        assert self._server is not None, "the proxy is not started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish within `timeout` (default
        `options.shutdown_timeout`), then cut what is left and close the pools."""
        if self._server is None:
            return
        self.draining = True
        self._server.close()
        for conn in list(self._connections):
            if conn.idle:
                conn.close()
        assert self._all_closed is not None
        if self._connections:
            self._all_closed.clear()  # it may be set from an earlier moment without clients
            deadline = self.options.shutdown_timeout if timeout is None else timeout
            try:
                async with asyncio.timeout(deadline):
                    await self._all_closed.wait()
            except TimeoutError:
                log.warning("%d connections still busy at shutdown: cut", len(self._connections))
                for conn in list(self._connections):
                    conn.abort()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        await self._server.wait_closed()
        self.flush_samples()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._pools_by_id.clear()
        # let the transports' close callbacks run before the loop may be closed
        await asyncio.sleep(0)
        self._server = None

    # --- samples ----------------------------------------------------------------

    def finished(self, done: list[tuple[Exchange, int]]) -> None:
        """Exchanges whose response went out (outcome: status or failure kind)."""
        end = self.clock.monotonic()
        samples = self._samples
        overheads = self._overheads
        for exchange, outcome in done:
            choice = exchange.choice
            if choice is None:
                continue
            t0 = exchange.t0
            samples.append(
                (
                    exchange.ts,
                    choice.experiment,
                    choice.variant,
                    int((end - t0) * 1e6),
                    outcome,
                    choice.unit_hash,
                )
            )
            t_sent = exchange.t_sent
            overheads.append(-1.0 if t_sent is None else t_sent - t0)
        if len(samples) >= SAMPLE_FLUSH_COUNT:
            self.flush_samples()
        elif self._flush_timer is None and self._loop is not None:
            self._flush_timer = self._loop.call_later(SAMPLE_FLUSH_DELAY, self.flush_samples)

    def flush_samples(self) -> None:
        """Hand what finished since the last flush to the metrics and the recorder."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        samples = self._samples
        if not samples:
            return
        overheads = self._overheads
        self._samples = []
        self._overheads = []
        self.metrics.observe_many(samples, overheads)
        try:
            self.recorder.record_many(samples)
        except Exception:  # a recorder must not raise; if one does, the requests are done
            log.exception("the sample recorder raised")

    # --- used by connections ----------------------------------------------------

    def pool_for(self, upstream: Upstream) -> UpstreamPool:
        # A chooser hands out the same Upstream objects until its routes change: look
        # them up by identity first, which spares hashing a dataclass per request. The
        # entry holds the object, so its id cannot be reused while the entry lives.
        cached = self._pools_by_id.get(id(upstream))
        if cached is not None and cached[0] is upstream:
            return cached[1]
        pool = self._pools.get(upstream)
        if pool is None:
            opts = self.options
            pool = self._pools[upstream] = UpstreamPool(
                self.loop,
                upstream,
                connect_timeout=opts.connect_timeout,
                read_timeout=opts.read_timeout,
                max_idle=opts.max_pool_per_upstream,
                ssl_context=opts.ssl_context,
            )
        if len(self._pools_by_id) >= 1024:
            self._pools_by_id.clear()  # routes changed many times: start the cache afresh
        self._pools_by_id[id(upstream)] = (upstream, pool)
        return pool

    def connection_opened(self, conn: ClientConnection) -> None:
        limit = self.options.max_connections
        if len(self._connections) >= limit:
            # answered and closed at once: the descriptor is free again right away
            conn.refused = True
            conn.write(errors.too_many_connections(limit, retry_after=1))
            conn.block(_STOPPED)
            conn.close()
            self.metrics.connections_refused += 1
            self._refusals.warning(
                "refusing client connections: %d open, the maximum (--max-connections)",
                limit,
            )
            return
        self._connections.add(conn)
        self.metrics.connections += 1
        if self.draining:
            conn.close()

    def connection_closed(self, conn: ClientConnection) -> None:
        self._connections.discard(conn)
        self.metrics.connections -= 1
        if not self._connections and self._all_closed is not None:
            self._all_closed.set()

    def accept_failed(self, exc: BaseException | None) -> None:
        """accept() failed (e.g. EMFILE: out of descriptors): say so, not too often."""
        self._accept_errors.warning(
            "accepting a client connection failed (%s) with %d open", exc, len(self._connections)
        )

    def _sweep_interval(self) -> float:
        opts = self.options
        return max(
            0.05,
            min(
                1.0,
                opts.client_idle_timeout / 4,
                opts.pool_idle_timeout / 4,
                opts.head_timeout / 4,
            ),
        )

    def _sweep(self) -> None:
        """Close idle client connections and idle upstream connections past their time,
        and answer 408 to connections whose request head is overdue."""
        loop = self.loop
        now = loop.time()
        cutoff = now - self.options.client_idle_timeout
        head_cutoff = now - self.options.head_timeout
        overdue, idle = [], []
        for conn in self._connections:
            if conn.current is not None:
                continue  # a response is owed: the head after it is timed once it is out
            if conn.head_since:
                if conn.head_since < head_cutoff:
                    overdue.append(conn)
            elif conn.parsing is None and conn.idle_since < cutoff:
                idle.append(conn)
        for conn in idle:
            conn.close()
        for conn in overdue:
            self.metrics.reject("head_timeout")
            conn.block(_STOPPED)
            conn.write(errors.head_timeout(self.options.head_timeout))
            conn.close()
        for pool in self._pools.values():
            pool.sweep(self.options.pool_idle_timeout)
        self._sweeper = loop.call_later(self._sweep_interval(), self._sweep)
