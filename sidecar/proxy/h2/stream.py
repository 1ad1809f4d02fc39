"""One HTTP/2 stream of a client: its request, the variant chosen, its response.

An `H2Stream` is to an HTTP/2 client what an `Exchange` is to an HTTP/1.1 one: it asks
the `Chooser` for a variant, opens an `UpstreamLeg` (an HTTP/2 stream upstream, or an
HTTP/1.1 exchange through `bridge`), and relays both ways under flow control:

- request body: acknowledged to the client (its window reopened) only once the leg
  has passed it on upstream, so a stream buffers at most the window the proxy gave;
- response body: sent within the client's windows; the rest waits here, and the leg
  hears of each byte handed on (`response_consumed`) so it reopens the upstream's
  window only as the client takes the response.

It records one sample when the response's end (trailers included) is handed to the
connection; a gRPC response's outcome is its grpc-status (`grpc.call_outcome`).

A content-length the client declared is checked against the DATA it sent when the
stream ends (`h2` checks it only when the end comes on a DATA frame): a stream whose
body disagrees is malformed (RFC 9113 §8.1.1), reset with PROTOCOL_ERROR, and its leg
cancelled, which closes an HTTP/1.1 upstream connection rather than pool it. Trailers
pass the one trailer filter (`trailers.trailer_allowed`) both ways.

With overload protection on, a stream passes its upstream's gate (`sidecar.overload`)
before it takes its leg, as an HTTP/1.1 exchange does: admitted now or from the queue
(`admit`), or answered by the proxy (`shed`: the status, `Retry-After`, never a
sample); its place is released when it is recorded. While it waits, its request body
stays unacknowledged, so the client's window bounds what it holds.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

import h2.errors
import h2.exceptions

from controlplane.kernel.codec import ABORTED
from sidecar.choice import Choice, NoRoute
from sidecar.proxy import errors
from sidecar.proxy.conformance import Rejected, check_fields
from sidecar.proxy.h2 import grpc
from sidecar.proxy.h2.fields import Forwarding, Pair, Request, first, h2_response
from sidecar.proxy.h2.sending import send_head
from sidecar.proxy.headers import HeaderView
from sidecar.proxy.trailers import trailer_pairs

if TYPE_CHECKING:
    from sidecar.overload.gate import UpstreamGate
    from sidecar.proxy.h2.connection import H2ClientConnection
    from sidecar.proxy.tracing import RequestTrace

log = logging.getLogger(__name__)

_GRPC_STATUS = b"grpc-status"


class UpstreamLeg(Protocol):
    """Where a stream's request goes; it answers through the stream's `ResponseSink`
    methods (`response_head`, `response_data`, …)."""

    def request_data(self, data: bytes) -> None: ...
    def request_end(self, trailers: list[Pair] | None) -> None: ...
    def response_consumed(self, size: int) -> None: ...
    def cancel(self) -> None: ...


class H2Stream:
    """One client stream through the proxy."""

    __slots__ = (
        "checked",
        "choice",
        "conn",
        "done",
        "fwd",
        "gate",
        "grpc",
        "grpc_status",
        "head_sent",
        "leg",
        "local_outcome",
        "out",
        "out_end",
        "pending",
        "received",
        "req_ended",
        "req_trailers",
        "request",
        "shed_status",
        "status",
        "stream_id",
        "t0",
        "t_admit",
        "t_first",
        "t_sent",
        "trace",
        "ts",
        "variant",
    )

    def __init__(self, conn: H2ClientConnection, stream_id: int, request: Request) -> None:
        clock = conn.server.clock
        self.t0 = clock.monotonic()
        self.ts = clock.now()
        self.t_sent: float | None = None
        self.t_first: float | None = None  # when the response head went to the client
        self.conn = conn
        self.stream_id = stream_id
        self.request = request
        self.choice: Choice | None = None
        self.variant = b""
        self.leg: UpstreamLeg | None = None
        self.req_ended = False
        self.req_trailers: list[Pair] | None = None
        self.received = 0  # request body bytes, checked against a declared length
        self.head_sent = False
        self.status = 0
        self.grpc = False
        self.grpc_status: bytes | None = None
        self.local_outcome: int | None = None
        # response bytes waiting for the client's window, then how the response ends:
        # None (not yet), True (plain end) or the trailers
        self.out: deque[bytes] = deque()
        self.out_end: list[Pair] | bool | None = None
        self.done = False
        # the response's fields come from an HTTP/2 upstream through h2's inbound
        # checks, or from the proxy itself (sending.py); not from an HTTP/1.1 one
        self.checked = True
        # overload protection: what goes upstream once admitted, the body received
        # meanwhile (None: not waiting), the gate that admitted it and when, and the
        # status it was shed with (0: not shed)
        self.fwd: Forwarding | None = None
        self.pending: list[bytes] | None = None
        self.gate: UpstreamGate | None = None
        self.t_admit = 0.0
        self.shed_status = 0
        self.trace: RequestTrace | None = None

    # --- request side (called by the connection) -----------------------------------

    def start(self) -> None:
        server = self.conn.server
        try:
            choice = server.chooser.choose(HeaderView(self.request.chooser_headers()))
        except NoRoute as exc:
            self.answer_locally(503, str(exc), 503)
            return
        except Exception:
            log.exception("the chooser failed; answering 503")
            self.answer_locally(503, "routing failed in the sidecar", 503)
            return
        self.choice = choice
        self.variant = choice.variant.encode()
        upstream = choice.upstream
        if server.tracing is not None:  # rewrites the traceparent sent upstream
            request = self.request
            self.trace, fields = server.tracing.h2(request.fields, request.method)
            if fields is not request.fields:
                self.request = dataclasses.replace(request, fields=fields)
        opts = server.options
        authority = upstream.authority.encode("idna")
        if opts.preserve_host and self.request.authority is not None:
            authority = self.request.authority
        fwd = Forwarding(
            host=authority,
            scheme=upstream.scheme.encode(),
            base_path=upstream.base_path.encode(),
            client_ip=self.conn.client_ip,
            proto=server.forwarded_proto,
            variant=self.variant,
            experiment=None if choice.experiment is None else choice.experiment.encode(),
        )
        self.checked = upstream.http2
        guard = server.overload
        if guard is not None:  # admit() goes on, now or from the queue, or shed() answers
            self.fwd = fwd
            self.pending = []
            request = self.request
            guard.enter(self, upstream, choice.variant, request.chooser_headers(), request.path)
            return
        self._open_leg(fwd)

    def _open_leg(self, fwd: Forwarding) -> None:
        choice = self.choice
        assert choice is not None
        upstream = choice.upstream
        try:
            self.leg = self.conn.server.h2.open_leg(self, upstream, self.request, fwd)
        except Exception as exc:  # e.g. an Upstream built by hand with a bad host name
            log.exception("no upstream leg for %s", upstream)
            self.upstream_failed(502, 502, f"unusable upstream {upstream}: {exc}")

    # --- overload protection (sidecar.overload) -----------------------------------

    def admit(self, gate: UpstreamGate, degrade: bool) -> None:
        self.gate = gate
        self.t_admit = gate.monotonic()
        fwd, self.fwd = self.fwd, None
        pending, self.pending = self.pending, None
        if self.done or fwd is None:
            self.gate = None
            gate.release(self.t_admit, sample=False)
            return
        if degrade:
            fwd = dataclasses.replace(fwd, degrade=True)
        self._open_leg(fwd)
        leg = self.leg
        if leg is None or self.done:
            self._drop(pending)
            return
        for chunk in pending or ():
            leg.request_data(chunk)
        if self.req_ended:
            leg.request_end(self.req_trailers)
        # admitted from the queue (another request ended, a timer): no read of this
        # connection follows to send what the leg now holds
        self.conn.server.h2.flush()

    def shed(self, gate: UpstreamGate, reason: str) -> None:
        """Answered for the upstream, which never sees it: no sample, a count."""
        self.fwd = None
        pending, self.pending = self.pending, None
        self._drop(pending)
        choice = self.choice
        if choice is not None:
            self.conn.server.shed(choice)
        if self.done or choice is None:
            return
        guard = self.conn.server.overload
        if guard is not None:
            status, detail, retry_after = guard.shed_answer(reason, choice.variant)
        else:  # turned off meanwhile: its queues were let go, so only a straggler
            status, detail, retry_after = 503, f"load shed ({reason})", 1
        self.shed_status = status
        self.answer_locally(
            status,
            detail,
            status,
            variant=choice.variant,
            experiment=choice.experiment,
            extra=[(b"retry-after", str(retry_after).encode())],
        )

    def _leave_queue(self) -> bool:
        """A stream still waiting for its gate leaves it; True when it was waiting."""
        choice = self.choice
        guard = self.conn.server.overload
        if self.pending is None or choice is None or guard is None:
            return False
        gate = guard.gates.get(choice.upstream)
        if gate is None or self not in gate.waiting:
            return False
        gate.leave(self)
        self.conn.server.shed(choice)  # abandoned in the queue: shed all the same
        self.fwd = None
        pending, self.pending = self.pending, None
        self._drop(pending)
        self.done = True
        return True

    def _drop(self, pending: list[bytes] | None) -> None:
        """Request bytes nobody will send on: the client's window reopens."""
        if pending:
            self.conn.ack(self.stream_id, sum(len(chunk) for chunk in pending))

    def request_data(self, data: bytes, flow_length: int) -> None:
        self.received += len(data)
        padding = flow_length - len(data)
        if padding:
            self.conn.ack(self.stream_id, padding)
        leg = self.leg
        if leg is None or self.done:
            if data and self.pending is not None and not self.done:
                self.pending.append(data)  # waiting for its gate: acknowledged later
            elif data:
                self.conn.ack(self.stream_id, len(data))  # nobody wants it: drop
            return
        if data:
            leg.request_data(data)

    def request_end(self) -> None:
        declared = self.request.length
        if declared is not None and declared != self.received and not self.done:
            self._malformed(f"content-length {declared}, {self.received} bytes of DATA")
            return
        trailers = self.req_trailers
        if trailers:
            # a trailer field is held to a head's rules: the HTTP/1.1 side would
            # refuse what an HTTP/2 one could otherwise carry past it (RFC 9113 §8.2.1)
            try:
                check_fields(trailers)
            except Rejected:
                if not self.done:
                    self._malformed("a trailer field a head could not carry", "h2_bad_trailer")
                    return
                trailers = None
        self.req_ended = True
        if trailers:
            self.req_trailers, dropped = trailer_pairs(trailers, None)
            self.conn.server.metrics.trailer_fields_dropped += dropped
        else:
            self.req_trailers = None
        if self.leg is not None and not self.done:
            self.leg.request_end(self.req_trailers)
        elif self.done:
            self.conn.stream_finished(self)

    def _malformed(self, reason: str, counted_as: str = "h2_content_length") -> None:
        """The request is malformed (its framing disagrees with itself, or a trailer
        field breaks a field's rules): nothing more of it goes on, the leg is
        cancelled (an HTTP/1.1 upstream connection is closed, never pooled) and the
        stream is reset with PROTOCOL_ERROR (RFC 9113 §8.1.1)."""
        self.conn.server.metrics.reject(counted_as)
        self.req_ended = True  # nothing more is read of it
        code = h2.errors.ErrorCodes.PROTOCOL_ERROR
        if self._leave_queue():  # never went upstream
            self.conn.reset(self.stream_id, code)
            self.conn.stream_finished(self)
            return
        self._cut(ABORTED, f"malformed: {reason}", code)

    def client_lost(self) -> None:
        """The client reset the stream, or the connection is gone."""
        if self._leave_queue():
            return  # counted by its gate as abandoned; it never was a request upstream
        leg = self.leg
        self.leg = None
        if leg is not None:
            leg.cancel()
        if not self.done:
            self.done = True
            self._record(ABORTED)

    # --- response side (called by the leg) -----------------------------------------

    def upstream_attached(self) -> None:
        """The request head went upstream."""
        self.t_sent = self.conn.server.clock.monotonic()

    def request_consumed(self, size: int) -> None:
        self.conn.ack(self.stream_id, size)

    def response_head(self, status: int, fields: list[Pair], *, end: bool) -> None:
        if self.done:
            return
        self.status = status
        self.grpc = grpc.is_grpc(first(fields, b"content-type"))
        self.grpc_status = first(fields, _GRPC_STATUS)  # a trailers-only response
        self.head_sent = True
        conn = self.conn
        try:
            send_head(
                conn.h2,
                self.stream_id,
                h2_response(status, fields, self.variant),
                end_stream=end,
                checked=self.checked,
            )
        except h2.exceptions.ProtocolError as exc:
            # e.g. a field HTTP/2 forbids that an HTTP/1.1 upstream sent
            self._cut(502, f"response head not valid in HTTP/2: {exc}")
            return
        self.t_first = conn.server.clock.monotonic()
        conn.dirty()
        if end:
            self._finish()

    def response_interim(self, status: int, fields: list[Pair]) -> None:
        """A 1xx from an HTTP/2 upstream is not passed on to an HTTP/2 client (not
        done yet: such a client that waits for 100 Continue sends its body after its
        own timeout)."""

    def response_data(self, data: bytes) -> None:
        if self.done:
            return
        self.out.append(data)
        self.pump()

    def response_trailers(self, trailers: list[Pair]) -> None:
        if self.done:
            return
        status = first(trailers, _GRPC_STATUS)
        if status is not None:
            self.grpc_status = status
        kept, dropped = trailer_pairs(
            [(name, value) for name, value in trailers if not name.startswith(b":")], None
        )
        self.conn.server.metrics.trailer_fields_dropped += dropped
        self.out_end = kept if kept else True
        self.pump()

    def response_end(self) -> None:
        if self.done:
            return
        if self.out_end is None:
            self.out_end = True
        self.pump()

    def upstream_failed(self, status: int, outcome: int, reason: str) -> None:
        """No answer from the upstream (status: what the proxy answers, outcome: what
        the sample says), or the response broke after its head went out."""
        self.leg = None
        if self.done:
            return
        if self.head_sent:
            self._cut(outcome, reason)
            return
        choice = self.choice
        variant = None if choice is None else choice.variant
        experiment = None if choice is None else choice.experiment
        if status == 504:
            detail = f"upstream of variant {variant!r} timed out: {reason}"
        else:
            detail = f"upstream of variant {variant!r} failed: {reason}"
        self.answer_locally(status, detail, outcome, variant=variant, experiment=experiment)

    # --- sending -------------------------------------------------------------------

    def answer_locally(
        self,
        status: int,
        detail: str,
        outcome: int,
        *,
        variant: str | None = None,
        experiment: str | None = None,
        extra: list[Pair] | None = None,
    ) -> None:
        """Answer from the proxy itself: a problem+json body."""
        body = errors.problem_body(status, detail, variant=variant, experiment=experiment)
        fields: list[Pair] = [
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(body)).encode()),
            *(extra or ()),
        ]
        self.local_outcome = outcome
        self.response_head(status, fields, end=False)
        if not self.done:
            self.out.append(body)
            self.out_end = True
            self.pump()

    def pump(self) -> None:
        """Send what the client's windows allow; end the response when all is sent."""
        conn = self.conn
        if self.done or conn.write_paused or conn.closed:
            return
        h2c = conn.h2
        sid = self.stream_id
        out = self.out
        sent = 0
        try:
            while out:
                window = h2c.local_flow_control_window(sid)
                if window <= 0:
                    break
                chunk = out[0]
                size = min(window, h2c.max_outbound_frame_size, len(chunk))
                if size < len(chunk):
                    h2c.send_data(sid, chunk[:size])
                    out[0] = chunk[size:]
                else:
                    out.popleft()
                    h2c.send_data(sid, chunk)
                sent += size
            if not out and self.out_end is not None:
                end = self.out_end
                if end is True:
                    h2c.end_stream(sid)
                else:
                    assert isinstance(end, list)
                    send_head(h2c, sid, end, end_stream=True, checked=self.checked)
                self._finish()
        except h2.exceptions.ProtocolError as exc:
            # the client reset the stream meanwhile, or the trailers are not valid HTTP/2
            self._cut(502, f"response not deliverable: {exc}")
        conn.dirty()
        leg = self.leg
        if sent and leg is not None:
            leg.response_consumed(sent)

    def _finish(self) -> None:
        """The response's end is handed to the connection: one sample."""
        self.done = True
        self.leg = None
        outcome = self.local_outcome
        if outcome is None:
            outcome = grpc.call_outcome(self.status, self.grpc, self.grpc_status)
        self._record(outcome)
        self.conn.stream_finished(self)

    def _cut(
        self,
        outcome: int,
        reason: str,
        code: h2.errors.ErrorCodes = h2.errors.ErrorCodes.INTERNAL_ERROR,
    ) -> None:
        """The response broke after its head went out, or the request is malformed:
        reset the client's stream."""
        log.debug("stream %d cut: %s", self.stream_id, reason)
        leg = self.leg
        self.leg = None
        if leg is not None:
            leg.cancel()
        self.done = True
        self.out.clear()
        self.conn.reset(self.stream_id, code)
        self._record(outcome)
        self.conn.stream_finished(self)

    def _record(self, outcome: int) -> None:
        server = self.conn.server
        gate = self.gate
        if gate is not None:
            self.gate = None
            t_sent, t_first = self.t_sent, self.t_first
            upstream = None if t_sent is None or t_first is None else max(0.0, t_first - t_sent)
            gate.release(self.t_admit, upstream_sec=upstream)
        choice = self.choice
        if choice is None:
            server.metrics.observe("none", outcome, None)
        elif self.shed_status:
            server.metrics.observe(choice.variant, outcome, None)  # counted, not a sample
        else:
            server.streams_finished([(self, outcome)])
