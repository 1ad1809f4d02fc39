"""An HTTP/1.1 client's request as a stream on an HTTP/2 upstream (the inverse of
`bridge.py`).

When the variant chosen for an `Exchange` is marked `h2c://` or `h2://`, the exchange
hands its request to an `H2Relay` instead of a pooled HTTP/1.1 connection. The relay
opens an `H2Leg` on the upstream's multiplexed connection (`upstream.py`) with the
head translated by `fields.request_from_h1`, feeds it the body as it arrives, and
turns the stream's answer back into the exchange's response callbacks: an HTTP/1.1
head (no Content-Length: chunked for an HTTP/1.1 client, read to the close for an
HTTP/1.0 one), body chunks, and the trailers as the chunked trailer section. A
chunked request's trailers go up as the stream's trailers, through the one trailer
filter. The
exchange frames, tags and records as for any upstream; a gRPC answer's outcome is
its grpc-status. With overload protection on, the exchange passes its upstream's
gate first and the relay starts when it is admitted (`Exchange.admit`).

The response's Content-Length frames it to an HTTP/1.1 client, so it is checked
against the DATA counted (`h2` checks it only when the end comes on a DATA frame):
a response that disagrees is a failed one (502 before its head went out, the client
connection cut after), never a head promising bytes that do not follow.

Flow control: request bytes the upstream's windows hold back stop reading from the
client past `_HELD`; response bytes are acknowledged to the upstream (its window
reopened) once written to the client, and not while the client's socket buffer is
full, so a slow client holds the upstream back instead of filling the proxy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.choice import Choice
from sidecar.proxy.h2 import grpc
from sidecar.proxy.h2.fields import (
    Forwarding,
    Pair,
    first,
    h1_fields,
    h1_status_line,
    h2_request,
    request_from_h1,
    trailer_section,
)
from sidecar.proxy.headers import ResponseFields
from sidecar.proxy.pausing import UPSTREAM_FULL
from sidecar.proxy.trailers import trailer_pairs
from sidecar.proxy.upstream import CHUNKED, EMPTY, LENGTH

if TYPE_CHECKING:
    from sidecar.proxy.exchange import Exchange
    from sidecar.proxy.h2.hub import H2Hub
    from sidecar.proxy.h2.upstream import H2Leg

# request bytes waiting for the upstream's windows before the client is not read
_HELD = 256 * 1024
_CONTENT_LENGTH = b"content-length"
_NO_BODY = frozenset({204, 304})


class H2Relay:
    """One HTTP/1.1 exchange carried by a stream to an HTTP/2 upstream."""

    __slots__ = (
        "corked",
        "declared",
        "done",
        "exchange",
        "grpc",
        "grpc_status",
        "held",
        "hub",
        "leg",
        "received",
        "req_ended",
        "status",
        "unacked",
    )

    def __init__(self, hub: H2Hub, exchange: Exchange) -> None:
        self.hub = hub
        self.exchange = exchange
        self.leg: H2Leg | None = None
        self.held = 0  # request bytes handed to the leg, not yet sent upstream
        self.unacked = 0  # response bytes written while the client's buffer was full
        self.req_ended = False
        self.corked = False  # the client's writes are held until the hub's flush
        self.status = 0
        self.grpc = False
        self.grpc_status: bytes | None = None
        self.done = False
        # the response's content-length, when it frames the body to the client, and
        # the DATA bytes counted against it
        self.declared: int | None = None
        self.received = 0

    def start(self, choice: Choice, *, degrade: bool = False) -> None:
        ex = self.exchange
        server = self.hub.server
        upstream = choice.upstream
        request = request_from_h1(
            ex.method, ex.target, ex.headers, named=ex.named, chunked=ex.chunked
        )
        authority = upstream.authority.encode("idna")
        if server.options.preserve_host and request.authority is not None:
            authority = request.authority
        fwd = Forwarding(
            host=authority,
            scheme=upstream.scheme.encode(),
            base_path=upstream.base_path.encode(),
            client_ip=ex.client.client_ip,
            proto=server.forwarded_proto,
            variant=ex.variant,
            experiment=None if choice.experiment is None else choice.experiment.encode(),
            degrade=degrade,
        )
        # a request without a body is all in its head: HEADERS with END_STREAM
        self.req_ended = not ex.has_body
        self.leg = self.hub.pool_for(upstream).open(
            self, h2_request(request, fwd), checked=False, ended=self.req_ended
        )
        self.hub.flush()

    # --- from the exchange (the client's side) --------------------------------------

    def request_data(self, data: bytes) -> None:
        leg = self.leg
        if leg is None or self.done:
            return
        self.held += len(data)
        leg.request_data(data)
        if self.held > _HELD:
            self.exchange.client.block(UPSTREAM_FULL)
        self.hub.flush()

    def request_end(self) -> None:
        if self.req_ended:
            return
        self.req_ended = True
        leg = self.leg
        if leg is not None and not self.done:
            leg.request_end(self._request_trailers())
            self.hub.flush()

    def _request_trailers(self) -> list[Pair] | None:
        """A chunked request's trailer fields that may travel, as HTTP/2 trailers."""
        ex = self.exchange
        trailers = ex.req_trailers
        if not trailers:
            return None
        kept, dropped = trailer_pairs([(low, value) for low, _, value in trailers], ex.named)
        self.hub.server.metrics.trailer_fields_dropped += dropped
        return kept or None

    def client_resumed(self) -> None:
        """The client's socket buffer drained: reopen the upstream's window."""
        size, self.unacked = self.unacked, 0
        leg = self.leg
        if size and leg is not None:
            leg.response_consumed(size)
            self.hub.flush()

    def cancel(self) -> None:
        """The client is gone or broke its request: the stream is reset."""
        self.done = True
        leg = self.leg
        self.leg = None
        if leg is not None:
            leg.cancel()
            self.hub.flush()

    # --- ResponseSink (called by the leg) --------------------------------------------

    def upstream_attached(self) -> None:
        self.exchange.t_sent = self.hub.server.clock.monotonic()

    def request_consumed(self, size: int) -> None:
        held = self.held = self.held - size
        client = self.exchange.client
        if held <= _HELD // 2 and client.read_block & UPSTREAM_FULL:
            client.unblock(UPSTREAM_FULL)

    def response_head(self, status: int, fields: list[Pair], *, end: bool) -> None:
        if self.done:
            return
        self.status = status
        self.grpc = grpc.is_grpc(first(fields, b"content-type"))
        self.grpc_status = first(fields, b"grpc-status")  # a trailers-only response
        lines = h1_fields(fields)
        length = first(fields, _CONTENT_LENGTH)  # digits: h2 refused anything else
        if length is not None and self.exchange.method != b"HEAD" and status not in _NO_BODY:
            self.declared = int(length)
        if end:
            framing = EMPTY
            if self.declared:
                self._mismatch()
                return
        elif length is not None:
            framing = LENGTH
        else:
            framing = CHUNKED  # HTTP/2 frames the body: the client needs some framing
        self._cork()
        self.exchange.response_head(
            status, h1_status_line(status), lines, ResponseFields(lines), framing
        )
        if end:
            self.response_end()

    def response_interim(self, status: int, fields: list[Pair]) -> None:
        """A 1xx before the response (100 Continue, 103 Early Hints): relayed, so a
        client waiting to send its body (`Expect: 100-continue`) goes on at once. An
        HTTP/1.0 client is sent none (RFC 9110 §15.2), nor is a 101 (HTTP/2 has none)."""
        if self.done or self.exchange.http_1_0 or status == 101:
            return
        lines = h1_fields(fields)
        self._cork()
        self.exchange.response_head(
            status, h1_status_line(status), lines, ResponseFields(lines), EMPTY
        )

    def response_data(self, data: bytes) -> None:
        leg = self.leg
        if self.done or leg is None:
            return
        self.received += len(data)
        self._cork()
        self.exchange.response_body(data)
        if self.exchange.client.write_paused:
            self.unacked += len(data)
        else:
            leg.response_consumed(len(data))

    def response_trailers(self, trailers: list[Pair]) -> None:
        if self.done:
            return
        status = first(trailers, b"grpc-status")
        if status is not None:
            self.grpc_status = status
        self.exchange.relay_trailers(trailer_section(trailers))

    def response_end(self) -> None:
        if self.done:
            return
        declared = self.declared
        if declared is not None and declared != self.received:
            self._mismatch()
            return
        self.done = True
        leg = self.leg
        self.leg = None
        if leg is not None and not self.req_ended:
            leg.cancel()  # answered before the request was all in: stop sending it
        self._cork()
        outcome = grpc.call_outcome(self.status, self.grpc, self.grpc_status)
        self.exchange.response_complete(True, outcome)

    def upstream_failed(self, status: int, outcome: int, reason: str) -> None:
        if self.done:
            return
        self.done = True
        self.leg = None
        self._cork()
        self.exchange.client.unblock(UPSTREAM_FULL)
        self.exchange.upstream_failed(status, outcome, reason)

    def _mismatch(self) -> None:
        """The response's content-length disagrees with its DATA: the stream is reset,
        and the client is answered 502 or, with the head out, cut off."""
        leg = self.leg
        if leg is not None:
            leg.cancel()
        self.upstream_failed(502, 502, "the response's content-length disagrees with its body")

    # --- one write per upstream read ----------------------------------------------

    def _cork(self) -> None:
        if not self.corked and self.exchange.client.cork():
            self.corked = True
            self.hub.dirty.add(self)

    def flush(self) -> None:
        """The hub's flush: what this read produced for the client leaves in one send
        (and the samples of what finished are recorded after it)."""
        if self.corked:
            self.corked = False
            self.exchange.client.uncork()
