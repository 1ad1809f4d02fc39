"""One request and its response through the proxy.

An `Exchange` asks the `Chooser` for a variant, takes a pooled upstream connection
(or opens one) and from then on parser callbacks on either side write straight to the
other transport: request body chunks from its `ClientConnection`, the response head,
body and end from its `UpstreamConnection`. It answers 502/503/504 itself when no
upstream does, replays an idempotent request once on a fresh connection when a pooled
one turns out closed, and records one sample once the response is out. A variant
whose upstream speaks HTTP/2 only is reached through an `H2Relay` instead of a pooled
connection (`h2/relay.py`): the same response callbacks, from a stream.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, TIMEOUT
from sidecar.choice import Choice, NoRoute
from sidecar.proxy import errors
from sidecar.proxy.headers import (
    Header,
    HeaderView,
    ResponseFields,
    interim_head,
    request_head,
    response_head,
)
from sidecar.proxy.pausing import UPSTREAM_FULL, WAIT_UPSTREAM
from sidecar.proxy.upstream import (
    CHUNKED,
    UNTIL_CLOSE,
    UpstreamConnection,
    UpstreamPool,
)

if TYPE_CHECKING:
    from sidecar.proxy.client import ClientConnection
    from sidecar.proxy.h2.relay import H2Relay

log = logging.getLogger(__name__)

# RFC 9110 §9.2.2; only these may be replayed on a fresh connection
_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
_LAST_CHUNK = b"0\r\n\r\n"
_CRLF = b"\r\n"


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
        "relay",
        "req_complete",
        "resp_chunked",
        "resp_done",
        "resp_started",
        "retried",
        "status",
        "t0",
        "t_sent",
        "target",
        "trailers",
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
        self.relay: H2Relay | None = None  # the stream to an HTTP/2 upstream, if any
        self.trailers = b""  # the response's trailer section, when it has one

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
        if choice.upstream.http2:
            self.relay = server.h2.relay(self, choice)
            return
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
        if self.relay is not None:
            self.relay.request_data(chunk)
            return
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
        self.client.block(WAIT_UPSTREAM)

    def request_complete(self) -> None:
        self.req_complete = True
        if self.resp_done:
            self.client.exchange_finished(self)
            return
        if self.relay is not None:
            self.relay.request_end()
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
            self.client.unblock(WAIT_UPSTREAM)
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

    def response_trailers(self, section: bytes) -> None:
        """Trailer field lines (`name: value\\r\\n` each) to end a chunked response
        with; dropped when the response is not chunked (RFC 9110 §6.5.1)."""
        self.trailers = section

    def response_complete(self, reusable: bool, outcome: int | None = None) -> None:
        """The response is all in; `outcome`: the sample's, when not the status (a
        gRPC call's)."""
        if self.resp_chunked:
            trailers = self.trailers
            self.client.write(b"0\r\n" + trailers + _CRLF if trailers else _LAST_CHUNK)
        self.resp_done = True
        conn = self.upstream
        self.upstream = None
        if conn is not None:
            # a request still being sent cannot share its connection with the next one
            conn.release(reusable and self.req_complete)
        if self.client.read_block:
            self.client.unblock(UPSTREAM_FULL | WAIT_UPSTREAM)
        self._record(self.status if outcome is None else outcome)
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
        self.client.unblock(UPSTREAM_FULL)
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
        self.client.unblock(UPSTREAM_FULL)
        if self.resp_started:
            self._abort(TIMEOUT)
            return
        timeout = self.client.server.options.read_timeout
        self._fail(504, TIMEOUT, f"no response within {timeout:g} s")

    def upstream_failed(self, status: int, outcome: int, reason: str) -> None:
        """The relay's stream failed: answer `status`, or cut a response under way."""
        if self.resp_started:
            if not self.resp_done:
                self._abort(outcome)
            return
        self._fail(status, outcome, reason)

    def upstream_pause_writing(self) -> None:
        self.client.block(UPSTREAM_FULL)

    def upstream_resume_writing(self) -> None:
        self.client.unblock(UPSTREAM_FULL)

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
        elif status == 502:
            body = errors.bad_gateway(choice.variant, choice.experiment, reason, close=close)
        else:  # 503: an HTTP/2 upstream's queue of requests waiting for a stream is full
            detail = f"upstream of variant {choice.variant!r} failed: {reason}"
            body = errors.problem_response(
                status, detail, variant=choice.variant, experiment=choice.experiment, close=close
            )
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
        if self.relay is not None:
            self.relay.cancel()
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
        if self.relay is not None:
            self.relay.cancel()
        if not self.resp_done and self.choice is not None:
            self.resp_done = True
            self._record(ABORTED)

    def _record(self, outcome: int) -> None:
        """After the response went out: metrics and one sample."""
        if self.choice is not None and not self.client.record_after_flush(self, outcome):
            self.client.server.finished([(self, outcome)])
