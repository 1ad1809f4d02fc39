"""Tracing on the proxy's data path, without OpenTelemetry in it.

When tracing is on, each proxied request takes part in its trace (W3C Trace Context):

- a client's valid `traceparent` whose sampled flag is set: the proxy's span is its
  child, and the `traceparent` sent upstream names the proxy's span;
- one whose flag is clear: not recorded, and forwarded as it came;
- none, or an invalid one (or several): a new trace, recorded at the sample ratio (the
  rule of OpenTelemetry's TraceIdRatioBased sampler); the `traceparent` sent upstream
  carries the decision, and the client's `tracestate` is dropped with its parent.

Per request this is a scan of the header list and, when recorded, one id and one
header value. The span itself is built later, in bulk: `finished` keeps the times the
proxy measures anyway, and `flush` (called with the samples' flush) hands them to a
`SpanSink` — the OpenTelemetry exporter (`sidecar.otel_spans`), loaded only when
tracing is configured. With tracing off the proxy holds no `RequestTracing` at all.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sidecar.choice import Upstream
from sidecar.proxy.headers import Header
from sidecar.proxy.tracecontext import (
    SAMPLED,
    format_traceparent,
    parse_traceparent,
    ratio_bound,
    sampled_by_ratio,
)

if TYPE_CHECKING:
    from sidecar.proxy.server import Finished

log = logging.getLogger(__name__)

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
_TRACE_FIELDS = (TRACEPARENT, TRACESTATE)
Pair = tuple[bytes, bytes]


@dataclass(slots=True)
class RequestTrace:
    """A recorded request's place in its trace."""

    trace_id: int
    span_id: int  # the proxy's span, named in the traceparent sent upstream
    parent_id: int  # the client's span; 0: the proxy's span is the trace's root
    tracestate: bytes | None  # the client's, kept with its parent
    method: bytes


@dataclass(frozen=True, slots=True)
class FinishedSpan:
    """What a span is built from; times are epoch seconds."""

    trace: RequestTrace
    experiment: str | None
    variant: str
    upstream: Upstream
    outcome: int  # as in the sample: HTTP status, codec.CONNECT_ERROR…, or gRPC
    start: float  # the request head arrived
    end: float  # the response went out (or the exchange ended)
    sent: float | None  # the request head went upstream
    first_byte: float | None  # the response head went out


class SpanSink(Protocol):
    def export(self, spans: Sequence[FinishedSpan]) -> None:
        """Take finished spans; never blocks on the network."""
        ...

    def close(self) -> None:
        """Send what is queued and stop (blocking: run it off the event loop)."""
        ...


class RequestTracing:
    """The proxy's tracing: the header rewrite per request, spans in bulk."""

    def __init__(
        self,
        sink: SpanSink,
        sample_ratio: float,
        *,
        randbits: Callable[[int], int] = random.getrandbits,
    ) -> None:
        self.sink = sink
        self.sample_ratio = sample_ratio
        self._bound = ratio_bound(sample_ratio)
        self._randbits = randbits
        self._pending: list[FinishedSpan] = []
        self.spans_started = 0  # recorded requests (what the sink was or will be given)

    # --- per request --------------------------------------------------------------

    def _decide(
        self, parents: list[bytes], tracestate: bytes | None, method: bytes
    ) -> tuple[RequestTrace | None, bytes | None, bool]:
        """(trace to record or None, traceparent to send or None to forward the
        client's, whether the client's parent is gone with its tracestate)."""
        parent = parse_traceparent(parents[0]) if len(parents) == 1 else None
        if parent is not None:
            trace_id, parent_id, flags = parent
            if not flags & SAMPLED:
                return None, None, False
            span_id = self._randbits(64) or 1
            trace = RequestTrace(trace_id, span_id, parent_id, tracestate, method)
            self.spans_started += 1
            return trace, format_traceparent(trace_id, span_id, True), False
        bits = self._randbits(192)  # one call: the trace id, then the span id
        trace_id = bits >> 64 or 1
        span_id = bits & 0xFFFFFFFFFFFFFFFF or 1
        sampled = sampled_by_ratio(trace_id, self._bound)
        value = format_traceparent(trace_id, span_id, sampled)
        if not sampled:
            return None, value, True
        self.spans_started += 1
        return RequestTrace(trace_id, span_id, 0, None, method), value, True

    def h1(self, headers: list[Header], method: bytes) -> RequestTrace | None:
        """Decide for an HTTP/1.1 request and rewrite its `traceparent` in `headers`."""
        parents: list[bytes] = []
        state: bytes | None = None
        for lower, _, value in headers:
            if lower == TRACEPARENT:
                parents.append(value)
            elif lower == TRACESTATE and state is None:
                state = value
        trace, upstream_value, fresh = self._decide(parents, state, method)
        if upstream_value is not None:
            if parents or (fresh and state is not None):
                dropped = _TRACE_FIELDS if fresh else (TRACEPARENT,)
                headers[:] = [h for h in headers if h[0] not in dropped]
            headers.append((TRACEPARENT, b"traceparent", upstream_value))
        return trace

    def h2(
        self, fields: tuple[Pair, ...], method: bytes
    ) -> tuple[RequestTrace | None, tuple[Pair, ...]]:
        """Decide for an HTTP/2 request: its trace and its fields as sent upstream."""
        parents = [value for name, value in fields if name == TRACEPARENT]
        state = next((value for name, value in fields if name == TRACESTATE), None)
        trace, value, fresh = self._decide(parents, state, method)
        if value is None:
            return trace, fields
        dropped = _TRACE_FIELDS if fresh else (TRACEPARENT,)
        kept = tuple(pair for pair in fields if pair[0] not in dropped)
        return trace, (*kept, (TRACEPARENT, value))

    # --- in bulk ------------------------------------------------------------------

    def finished(self, done: Sequence[tuple[Finished, int]], end: float) -> None:
        """Requests whose response went out at `end` (the clock's monotonic time)."""
        pending = self._pending
        for exchange, outcome in done:
            trace = exchange.trace
            choice = exchange.choice
            if trace is None or choice is None:
                continue
            t0, ts = exchange.t0, exchange.ts
            t_sent, t_first = exchange.t_sent, exchange.t_first
            pending.append(
                FinishedSpan(
                    trace=trace,
                    experiment=choice.experiment,
                    variant=choice.variant,
                    upstream=choice.upstream,
                    outcome=outcome,
                    start=ts,
                    end=ts + (end - t0),
                    sent=None if t_sent is None else ts + (t_sent - t0),
                    first_byte=None if t_first is None else ts + (t_first - t0),
                )
            )

    def flush(self) -> None:
        """Hand the finished spans to the sink."""
        spans = self._pending
        if not spans:
            return
        self._pending = []
        try:
            self.sink.export(spans)
        except Exception:  # tracing must never fail a request or the sample flush
            log.exception("the span sink raised; %d spans lost", len(spans))

    def close(self) -> None:
        self.flush()
        self.sink.close()
