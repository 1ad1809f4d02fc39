"""One request and its response through the proxy.

An `Exchange` asks the `Chooser` for a variant, takes a pooled upstream connection
(or opens one) and from then on parser callbacks on either side write straight to the
other transport: request body chunks from its `ClientConnection`, the response head,
body and end from its `UpstreamConnection`. It answers 502/503/504 itself when no
upstream does, replays an idempotent request once on a fresh connection when a pooled
one turns out closed, and records one sample once the response is out.

A request asking to upgrade (`upgrade`: the protocols asked for) is forwarded with its
Upgrade when a tunnel can be had; a valid 101 makes both connections a `Tunnel` and
its sample measures the time to the 101. Trailer fields of chunked bodies travel on
with the last chunk, both ways (`trailers`).
A variant whose upstream speaks HTTP/2 only is reached through an `H2Relay` instead of
a pooled connection (`h2/relay.py`): the same response callbacks, from a stream.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, TIMEOUT
from sidecar.choice import Choice, NoRoute
from sidecar.proxy import errors, upgrades
from sidecar.proxy.headers import (
    Header,
    HeaderView,
    ResponseFields,
    interim_head,
    request_head,
    request_tail,
    response_head,
    switching_head,
)
from sidecar.proxy.pausing import UPSTREAM_FULL, WAIT_UPSTREAM
from sidecar.proxy.trailers import request_last_chunk, response_trailers
from sidecar.proxy.upstream import (
    CHUNKED,
    UNTIL_CLOSE,
    UpstreamConnection,
    UpstreamPool,
)

if TYPE_CHECKING:
    from sidecar.overload.gate import UpstreamGate
    from sidecar.proxy.client import ClientConnection
    from sidecar.proxy.h2.relay import H2Relay
    from sidecar.proxy.tracing import RequestTrace

log = logging.getLogger(__name__)

# RFC 9110 §9.2.2; only these may be replayed on a fresh connection
_IDEMPOTENT: Final = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
# variants whose tags a connection keeps (ClientConnection.tags): a route has a few;
# names come from routes and choosers, so the dict starts afresh past this many
TAGS_KEPT: Final = 16
_LAST_CHUNK: Final = b"0\r\n\r\n"
_CRLF: Final = b"\r\n"


def _chunk(data: bytes) -> list[bytes]:
    return [b"%x\r\n" % len(data), data, _CRLF]


class Exchange:
    """One request and its response through the proxy."""

    __slots__ = (
        "answered_early",
        "body_sent",
        "choice",
        "chunked",
        "client",
        "close_after",
        "connect_task",
        "gate",
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
        "req_trailers",
        "reserved",
        "resp_chunked",
        "resp_done",
        "resp_started",
        "retried",
        "status",
        "switching",
        "t0",
        "t_admit",
        "t_first",
        "t_sent",
        "target",
        "trace",
        "trailers",
        "ts",
        "upgrade",
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
        server = client.server
        self.t0 = server.monotonic()
        self.ts = server.wall()
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
        self.answered_early = False  # the response head came before the request's end
        self.resp_started = False
        self.resp_done = False
        self.resp_chunked = False
        self.body_sent = False
        self.retried = False
        self.status = 0
        self.t_sent: float | None = None
        # when the response head went to the client: the first byte (an upgrade's 101,
        # an h2 stream's HEADERS, set where they are written, end up here too)
        self.t_first: float | None = None
        # the protocols a request asking to upgrade names, when it is to be tunnelled
        self.upgrade: tuple[bytes, ...] | None = None
        self.reserved = False  # holds a place among the server's tunnels
        # an accepted 101 (status line, fields, scan, protocol) until it is sent
        self.switching: tuple[bytes, bytes, ResponseFields, bytes] | None = None
        self.req_trailers: list[Header] | None = None
        self.trailers: bytes | None = None  # the response's, to send with its last chunk
        self.relay: H2Relay | None = None  # the stream to an HTTP/2 upstream, if any
        # the overload gate that admitted it (or holds it in its queue), and when
        self.gate: UpstreamGate | None = None
        self.t_admit = 0.0
        self.trace: RequestTrace | None = None

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
        client = self.client
        known = client.tags
        tags = known.get(choice.variant)
        if tags is None or tags[0] != choice.experiment:
            variant = choice.variant.encode()
            experiment = None if choice.experiment is None else choice.experiment.encode()
            tail = request_tail(client.client_ip, server.forwarded_proto, variant, experiment)
            if len(known) >= TAGS_KEPT:
                known.clear()
            tags = known[choice.variant] = (choice.experiment, variant, experiment, tail)
        self.variant = tags[1]
        if choice.upstream.http2:
            guard = server.overload
            if guard is not None:  # admit() opens the stream, now or from the queue
                guard.enter(self, choice.upstream, choice.variant, self.headers, self.target)
                return
            self.relay = server.h2.relay(self, choice)
            return
        try:
            pool = self.pool = server.pool_for(choice.upstream)
        except Exception as exc:  # e.g. an Upstream built by hand with a bad host name
            log.exception("no pool for upstream %s", choice.upstream)
            self._fail(502, 502, f"unusable upstream {choice.upstream}: {exc}")
            return
        if self.upgrade is not None:
            if not server.reserve_tunnel():
                limit = server.options.tunnel_limit
                refusal = errors.too_many_tunnels(limit, draining=server.draining)
                self.close_after = True  # what follows its head is not HTTP
                self._local_answer(refusal, 503)
                return
            self.reserved = True
        if server.tracing is not None:  # rewrites the traceparent sent upstream
            self.trace = server.tracing.h1(self.headers, self.method)
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
            experiment=tags[2],
            chunked=self.chunked,
            named=self.named,
            tail=tags[3],
        )
        if self.reserved:
            assert self.upgrade is not None  # no body: the head ends with its blank line
            protocols = b", ".join(self.upgrade)
            self.head = self.head[:-2] + b"Connection: upgrade\r\nUpgrade: %s\r\n\r\n" % protocols
        guard = server.overload
        if guard is not None:  # admit() goes on, now or from the queue, or shed() answers
            guard.enter(self, choice.upstream, choice.variant, self.headers, self.target)
            return
        self._forward(pool)

    def _forward(self, pool: UpstreamPool) -> None:
        conn = pool.acquire()
        if conn is not None:
            self._attach(conn)
        else:
            self._connect(pool)

    # --- overload protection (sidecar.overload) -----------------------------------

    def admit(self, gate: UpstreamGate, degrade: bool) -> None:
        self.gate = gate
        self.t_admit = gate.monotonic()
        if self.client.closed or self.resp_done:
            self.gate = None
            gate.release(self.t_admit, sample=False)
            return
        choice = self.choice
        if choice is not None and choice.upstream.http2:
            self._relay_admitted(choice, degrade)
            return
        if degrade:
            self.head = self.head[:-2] + b"X-Canary-Degrade: 1\r\n\r\n"
        pool = self.pool
        assert pool is not None
        self._forward(pool)

    def _relay_admitted(self, choice: Choice, degrade: bool) -> None:
        """The stream to an HTTP/2 upstream opens; what of the body arrived while the
        request waited goes on it."""
        relay = self.relay = self.client.server.h2.relay(self, choice, degrade=degrade)
        pending, self.pending = self.pending, None
        for chunk in pending or ():
            relay.request_data(chunk)
        if self.req_complete:
            relay.request_end()
        if self.client.read_block & WAIT_UPSTREAM:
            self.client.unblock(WAIT_UPSTREAM)

    def shed(self, gate: UpstreamGate, reason: str) -> None:
        """Answered for the upstream, which never sees it: no sample, a count."""
        guard = self.client.server.overload
        choice = self.choice
        if choice is not None:
            self.client.server.shed(choice)
        if guard is None or choice is None or self.resp_done or self.client.closed:
            return
        if self.reserved:
            self.reserved = False
            self.client.server.tunnel_refused()
        if not self.req_complete and self.has_body:
            self.close_after = True  # do not read a body nobody wants
        response, status = guard.shed_response(
            reason, choice.variant, choice.experiment, close=self._must_close()
        )
        self._local_answer(response, status, choice.variant)

    def _release_gate(self) -> None:
        gate = self.gate
        if gate is not None:
            self.gate = None
            t_sent, t_first = self.t_sent, self.t_first
            upstream = None if t_sent is None or t_first is None else max(0.0, t_first - t_sent)
            gate.release(self.t_admit, upstream_sec=upstream)

    def _leave_queue(self) -> bool:
        """A request still waiting for its gate leaves it; True when it was waiting."""
        guard = self.client.server.overload
        if self.gate is not None or guard is None or self.choice is None:
            return False
        gate = guard.gates.get(self.choice.upstream)
        if gate is None or self not in gate.waiting:
            return False
        gate.leave(self)
        self.client.server.shed(self.choice)  # abandoned in the queue: shed all the same
        if self.reserved:
            self.reserved = False
            self.client.server.tunnel_refused()
        self.resp_done = True
        return True

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

    def request_trailers(self, trailers: list[Header]) -> None:
        self.req_trailers = trailers

    def _last_chunk(self) -> bytes:
        trailers = self.req_trailers
        if trailers is None:
            return _LAST_CHUNK
        last, dropped = request_last_chunk(trailers, self.named)
        self.client.server.metrics.trailer_fields_dropped += dropped
        return last

    def cancel_upgrade(self) -> None:
        """httptools did not take the request as an upgrade after all: no 101 counts."""
        self.upgrade = None
        if self.reserved:
            self.reserved = False
            self.client.server.tunnel_refused()

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
                conn.write(self._last_chunk())
            conn.arm_read_timeout()

    def _attach(self, conn: UpstreamConnection) -> None:
        self.upstream = conn
        conn.attach(self, self)
        client = self.client
        if self.has_body:
            # the head and what the same read brings of the body leave in one send
            client.cork_upstream(conn)
        if client.write_paused:
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
                parts.append(self._last_chunk())
            conn.writelines(parts)
        elif self.req_complete and self.chunked:
            conn.writelines([self.head, self._last_chunk()])
        else:
            conn.write(self.head)
        self.t_sent = client.server.monotonic()
        if client.read_block:
            client.unblock(WAIT_UPSTREAM)
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
            client.write(interim_head(status_line, fields, scan))
            return
        self.status = status
        if not self.req_complete:
            # answered before the request was all in: the connection cannot be trusted
            # to frame what follows, so it closes after this response; so does the
            # upstream's, which may not have read the body it answered and would take
            # it for the next request (response-queue poisoning)
            self.close_after = True
            self.answered_early = True
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
        self.t_first = client.server.monotonic()
        self.resp_started = True

    def response_switching(
        self, status_line: bytes, fields: bytes, scan: ResponseFields
    ) -> str | None:
        """A 101 head: why it cannot be accepted, or None (it is sent once httptools
        confirms the switch, see `upstream_switched`)."""
        error = upgrades.check_switch(self.upgrade if self.reserved else None, fields)
        if error is None:
            chosen = b", ".join(upgrades.protocols(upgrades.field_values(fields, b"upgrade")))
            self.switching = (status_line, fields, scan, chosen)
        return error

    def upstream_switched(self, conn: UpstreamConnection, rest: bytes) -> None:
        """The upstream switched protocols (`rest`: what it sent past its 101): the 101
        goes to the client, one sample records the time to it, a tunnel takes over."""
        switching = self.switching
        assert switching is not None and conn is self.upstream
        status_line, fields, scan, chosen = switching
        self.upstream = None
        self.status = 101
        self.resp_started = self.resp_done = True
        self.reserved = False  # the place becomes the tunnel's
        client = self.client
        head = switching_head(status_line, fields, scan, upgrade=chosen, variant=self.variant)
        client.write(head)
        client.start_tunnel(conn, rest)
        self._record(101)

    def response_trailers(self, section: bytes | None, named: frozenset[bytes] | None) -> None:
        """The trailer fields ending a chunked response (None: too large to pass on)."""
        if section is None or not self.resp_chunked:
            # an HTTP/1.0 client reads no chunks, so no trailers either; trailer fields
            # may be dropped (RFC 9110 §6.5.1), the body is whole without them
            self.client.server.metrics.trailers_dropped += 1
            return
        self.trailers, dropped = response_trailers(section, named)
        self.client.server.metrics.trailer_fields_dropped += dropped

    def response_body(self, chunk: bytes) -> None:
        if self.resp_chunked:
            self.client.writelines(_chunk(chunk))
        else:
            self.client.write(chunk)

    def relay_trailers(self, lines: bytes) -> None:
        """An HTTP/2 upstream's trailers as field lines (`name: value\\r\\n` each),
        under the same rules as an HTTP/1.1 upstream's."""
        self.response_trailers(lines, None)

    def response_complete(self, reusable: bool, outcome: int | None = None) -> None:
        """The response is all in; `outcome`: the sample's, when not the status (a
        gRPC call's)."""
        client = self.client
        if self.resp_chunked:
            trailers = self.trailers
            client.write(_LAST_CHUNK if trailers is None else b"0\r\n%s\r\n" % trailers)
        self.resp_done = True
        conn = self.upstream
        self.upstream = None
        if conn is not None:
            # a request still being sent, or answered before it was, cannot share its
            # connection with the next one
            conn.release(reusable and self.req_complete and not self.answered_early)
        if client.read_block:
            client.unblock(UPSTREAM_FULL | WAIT_UPSTREAM)
        self._record(self.status if outcome is None else outcome)
        if self.req_complete:
            client.exchange_finished(self)
        else:
            client.linger()

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

    def _local_answer(self, response: bytes, status: int, variant: str = "none") -> None:
        """Answer from the proxy itself (no route, load shed)."""
        self.status = status
        if not self.req_complete and self.has_body:
            # do not read a body nobody wants; a request without one ends with its head
            # (its end is parsed right after), so the connection stays open
            self.close_after = True
        self.resp_done = True
        self.client.write(response)
        self.client.server.metrics.observe(variant, status, None)
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
        if self._leave_queue():
            self.pending = None
            self.close_after = True
            return
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
        if self._leave_queue():
            return
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
        if self.gate is not None:
            self._release_gate()
        if self.reserved:  # an upgrade that did not happen
            self.reserved = False
            self.client.server.tunnel_refused()
        if self.choice is not None and not self.client.record_after_flush(self, outcome):
            self.client.server.finished([(self, outcome)])
