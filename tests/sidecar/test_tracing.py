"""Tracing in the sidecar: W3C traceparent read and rewritten, spans with the variant.

The spans go through the real OpenTelemetry SDK (`sidecar.otel_spans`) into its
in-memory exporter; requests go from real clients through the real proxy to real
upstreams, which report the traceparent they received.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from controlplane.kernel.keys import COLLECTOR_GROUP, EtcdKeys
from controlplane.kernel.kv_memory import MemoryKV
from controlplane.kernel.streams_memory import MemoryStreams
from sidecar.main import Sidecar
from sidecar.otel_spans import OtelSpanSink
from sidecar.proxy.tracecontext import (
    format_traceparent,
    parse_traceparent,
    ratio_bound,
    sampled_by_ratio,
)
from sidecar.proxy.tracing import RequestTracing
from tests.sidecar import upstreams
from tests.sidecar.proxy_harness import EXPERIMENT, harness
from tests.sidecar.test_sidecar_main import route_value

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SAMPLED_PARENT = f"00-{TRACE}-{CLIENT_SPAN}-01"


# --- traceparent, pure ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (SAMPLED_PARENT.encode(), (int(TRACE, 16), int(CLIENT_SPAN, 16), 1)),
        (f"00-{TRACE}-{CLIENT_SPAN}-00".encode(), (int(TRACE, 16), int(CLIENT_SPAN, 16), 0)),
        # a later version: its first four fields, whatever follows a dash
        (
            f"cc-{TRACE}-{CLIENT_SPAN}-01-what-comes".encode(),
            (int(TRACE, 16), int(CLIENT_SPAN, 16), 1),
        ),
        (f" 00-{TRACE}-{CLIENT_SPAN}-01 ".encode(), (int(TRACE, 16), int(CLIENT_SPAN, 16), 1)),
    ],
)
def test_valid_traceparents_are_read(value: bytes, expected: tuple[int, int, int]) -> None:
    assert parse_traceparent(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        b"",
        f"ff-{TRACE}-{CLIENT_SPAN}-01".encode(),  # version ff is invalid
        f"00-{TRACE}-{CLIENT_SPAN}-01-extra".encode(),  # version 00 has exactly 4 fields
        f"cc-{TRACE}-{CLIENT_SPAN}-01x".encode(),  # a later version: a dash must follow
        f"00-{TRACE.upper()}-{CLIENT_SPAN}-01".encode(),  # upper-case hex
        f"00-{'0' * 32}-{CLIENT_SPAN}-01".encode(),  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01".encode(),  # all-zero parent id
        f"00_{TRACE}-{CLIENT_SPAN}-01".encode(),
        f"00-{TRACE[:-1]}g-{CLIENT_SPAN}-01".encode(),
        f"00-{TRACE}-{CLIENT_SPAN}-0".encode(),
        f"00-{TRACE}-{CLIENT_SPAN}-+1".encode(),
    ],
)
def test_invalid_traceparents_are_refused(value: bytes) -> None:
    assert parse_traceparent(value) is None


def test_format_and_parse_agree() -> None:
    value = format_traceparent(0xABC, 0x12, True)
    assert value == b"00-00000000000000000000000000000abc-0000000000000012-01"
    assert parse_traceparent(value) == (0xABC, 0x12, 1)


def test_the_ratio_rule_is_the_low_64_bits_under_the_bound() -> None:
    assert ratio_bound(0.0) == 0 and ratio_bound(1.0) == 1 << 64
    half = ratio_bound(0.5)
    assert sampled_by_ratio((1 << 100) | (half - 1), half)  # high bits do not count
    assert not sampled_by_ratio(half, half)
    assert not sampled_by_ratio(0, ratio_bound(0.0))


# --- decisions, with ids from a fixed sequence ------------------------------------


class NullSink:
    def export(self, spans: object) -> None: ...
    def close(self) -> None: ...


def fixed_bits(*values: int) -> Iterator[int]:
    yield from values


def tracing(ratio: float, *ids: int) -> RequestTracing:
    bits = fixed_bits(*ids)
    return RequestTracing(NullSink(), ratio, randbits=lambda _n: next(bits))


def new_ids(trace_id: int, span_id: int) -> int:
    """What one 192-bit draw gives a new trace: its id, then the span's."""
    return trace_id << 64 | span_id


def h1(*pairs: tuple[bytes, bytes]) -> list[tuple[bytes, bytes, bytes]]:
    return [(name.lower(), name, value) for name, value in pairs]


def test_a_sampled_parent_gets_the_proxy_span_as_its_child() -> None:
    headers = h1(
        (b"Accept", b"*/*"), (b"traceparent", SAMPLED_PARENT.encode()), (b"tracestate", b"vendor=1")
    )
    trace = tracing(0.0, 0x77).h1(headers, b"GET")  # the ratio only applies to new traces
    assert trace is not None
    assert (trace.trace_id, trace.span_id, trace.parent_id) == (
        int(TRACE, 16),
        0x77,
        int(CLIENT_SPAN, 16),
    )
    assert trace.tracestate == b"vendor=1"
    sent = {low: value for low, _, value in headers}
    assert sent[b"traceparent"] == f"00-{TRACE}-{0x77:016x}-01".encode()
    assert sent[b"tracestate"] == b"vendor=1" and sent[b"accept"] == b"*/*"
    assert [low for low, _, _ in headers].count(b"traceparent") == 1


def test_an_unsampled_parent_is_forwarded_as_it_came() -> None:
    parent = f"00-{TRACE}-{CLIENT_SPAN}-00".encode()
    headers = h1((b"traceparent", parent))
    assert tracing(1.0).h1(headers, b"GET") is None
    assert headers == h1((b"traceparent", parent))


@pytest.mark.parametrize("ratio", [1.0, 0.0])
def test_a_request_without_a_parent_starts_a_trace_at_the_ratio(ratio: float) -> None:
    headers = h1((b"tracestate", b"orphan=1"))
    trace = tracing(ratio, new_ids(0x1234, 0x56)).h1(headers, b"GET")
    flag = "01" if ratio else "00"
    assert headers == h1((b"traceparent", f"00-{0x1234:032x}-{0x56:016x}-{flag}".encode()))
    if ratio:
        assert trace is not None and (trace.trace_id, trace.parent_id) == (0x1234, 0)
    else:
        assert trace is None


def test_a_request_without_trace_headers_keeps_its_own_and_gains_one() -> None:
    headers = h1((b"Accept", b"*/*"), (b"X-User-Id", b"alice"))
    trace = tracing(1.0, new_ids(0xAB, 0xCD)).h1(headers, b"GET")
    assert trace is not None and (trace.trace_id, trace.span_id) == (0xAB, 0xCD)
    assert headers == h1(
        (b"Accept", b"*/*"),
        (b"X-User-Id", b"alice"),
        (b"traceparent", f"00-{0xAB:032x}-{0xCD:016x}-01".encode()),
    )


def test_an_invalid_or_repeated_parent_starts_a_new_trace() -> None:
    for parents in ([b"garbage"], [SAMPLED_PARENT.encode(), SAMPLED_PARENT.encode()]):
        headers = h1(*[(b"traceparent", p) for p in parents])
        trace = tracing(1.0, new_ids(0x99, 0x5)).h1(headers, b"POST")
        assert trace is not None and trace.trace_id == 0x99 and trace.parent_id == 0
        assert headers == h1((b"traceparent", f"00-{0x99:032x}-{0x5:016x}-01".encode()))


def test_http2_fields_are_rewritten_the_same_way() -> None:
    fields = ((b"accept", b"*/*"), (b"traceparent", SAMPLED_PARENT.encode()))
    trace, sent = tracing(1.0, 0x42).h2(fields, b"GET")
    assert trace is not None and trace.parent_id == int(CLIENT_SPAN, 16)
    assert sent == ((b"accept", b"*/*"), (b"traceparent", f"00-{TRACE}-{0x42:016x}-01".encode()))
    unsampled = ((b"traceparent", f"00-{TRACE}-{CLIENT_SPAN}-00".encode()),)
    assert tracing(1.0).h2(unsampled, b"GET") == (None, unsampled)


# --- through the real proxy ---------------------------------------------------------


def memory_tracing(ratio: float = 1.0) -> tuple[RequestTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    sink = OtelSpanSink(SimpleSpanProcessor(exporter), Resource({"service.name": "test"}))
    return RequestTracing(sink, ratio), exporter


def received_parent(upstream: upstreams.Upstream) -> tuple[int, int, int]:
    value = upstream.requests[-1].header("traceparent")
    assert value is not None
    parsed = parse_traceparent(value.encode())
    assert parsed is not None
    return parsed


async def test_the_sidecar_records_a_child_span_tagged_with_the_variant() -> None:
    base, canary = upstreams.Upstream("baseline"), upstreams.Upstream("canary")
    await base.start()
    await canary.start()
    kv, stream = MemoryKV(), MemoryStreams()
    await stream.ensure_group("shop", COLLECTOR_GROUP)
    traced, exporter = memory_tracing()
    sidecar = Sidecar(service="shop", kv=kv, stream=stream, tracing=traced)
    await kv.put(EtcdKeys().route("shop"), route_value(base.url, canary.url, 2500, 1))
    await sidecar.start(("127.0.0.1", 0))
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            # published vectors: alice is in the canary at 25%
            response = await client.get(
                f"http://127.0.0.1:{sidecar.proxy.port}/echo",
                headers={
                    "x-user-id": "alice",
                    "traceparent": SAMPLED_PARENT,
                    "tracestate": "vendor=abc",
                },
            )
        assert response.headers["x-canary-variant"] == "canary"
        trace_id, parent_id, flags = received_parent(canary)
        assert canary.requests[-1].header("tracestate") == "vendor=abc"
    finally:
        await sidecar.stop()  # flushes the samples, and with them the spans
        await base.stop()
        await canary.stop()
    [span] = exporter.get_finished_spans()
    assert span.context is not None and span.parent is not None
    # the upstream's parent is the proxy's span, the proxy's parent the client's span
    assert (trace_id, flags) == (int(TRACE, 16), 1)
    assert span.context.trace_id == trace_id and span.context.span_id == parent_id
    assert span.parent.span_id == int(CLIENT_SPAN, 16) and span.parent.is_remote
    assert span.context.trace_state.get("vendor") == "abc"
    assert span.kind is SpanKind.SERVER and span.name == "GET"
    attributes = dict(span.attributes or {})
    assert attributes["canary.variant"] == "canary"
    assert attributes["canary.experiment"] == "3"
    assert attributes["http.response.status_code"] == 200
    assert attributes["server.port"] == canary.port
    assert attributes["canary.upstream"] == canary.url
    assert span.start_time is not None and span.end_time is not None
    assert span.start_time < span.end_time
    assert [e.name for e in span.events] == ["upstream request sent", "response head sent"]
    assert all(span.start_time <= e.timestamp <= span.end_time for e in span.events)


async def test_a_request_without_a_parent_is_a_root_span_the_upstream_continues() -> None:
    traced, exporter = memory_tracing()
    async with harness(tracing=traced) as h:
        response = await h.client.get("/status/503")
        assert response.status_code == 503
        trace_id, parent_id, flags = received_parent(h.baseline)
        h.proxy.flush_samples()
    [span] = exporter.get_finished_spans()
    assert span.parent is None and span.context is not None and flags == 1
    assert (span.context.trace_id, span.context.span_id) == (trace_id, parent_id)
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["canary.variant"] == "baseline"
    assert dict(span.attributes or {})["canary.experiment"] == EXPERIMENT


async def test_at_ratio_zero_nothing_is_recorded_and_the_decision_travels_on() -> None:
    traced, exporter = memory_tracing(0.0)
    async with harness(tracing=traced) as h:
        await h.client.get("/echo")
        _, _, flags = received_parent(h.baseline)
        # a sampled parent is followed whatever the ratio
        await h.client.get("/echo", headers={"traceparent": SAMPLED_PARENT})
        h.proxy.flush_samples()
    assert flags == 0
    assert [s.parent.span_id for s in exporter.get_finished_spans() if s.parent] == [
        int(CLIENT_SPAN, 16)
    ]


async def test_http2_streams_are_traced_and_propagated() -> None:
    traced, exporter = memory_tracing()
    async with harness(tracing=traced, http2=True) as h:
        response = await h.client.get(
            "/echo", headers={"x-test-variant": "canary", "traceparent": SAMPLED_PARENT}
        )
        assert response.http_version == "HTTP/2" and response.status_code == 200
        trace_id, parent_id, _ = received_parent(h.canary)
        h.proxy.flush_samples()
    [span] = exporter.get_finished_spans()
    assert span.context is not None and span.parent is not None
    assert (span.context.trace_id, span.context.span_id) == (trace_id, parent_id)
    assert span.parent.span_id == int(CLIENT_SPAN, 16)
    assert dict(span.attributes or {})["canary.variant"] == "canary"


async def test_without_tracing_the_clients_traceparent_reaches_the_upstream_unchanged() -> None:
    async with harness() as h:
        await h.client.get(
            "/echo", headers={"traceparent": SAMPLED_PARENT, "tracestate": "vendor=abc"}
        )
        assert h.baseline.requests[-1].header("traceparent") == SAMPLED_PARENT
        assert h.baseline.requests[-1].header("tracestate") == "vendor=abc"


def test_a_failing_sink_loses_spans_not_requests() -> None:
    class Broken:
        def export(self, spans: object) -> None:
            raise RuntimeError("exporter down")

        def close(self) -> None: ...

    traced = RequestTracing(Broken(), 1.0)
    traced._pending.append(object())  # type: ignore[arg-type]
    traced.flush()  # logs, does not raise
    assert traced._pending == []


_START_A_SIDECAR = """
import asyncio, sys
from controlplane.kernel.kv_memory import MemoryKV
from controlplane.kernel.settings import Settings
from controlplane.kernel.streams_memory import MemoryStreams
from sidecar.main import Sidecar, open_tracing

async def main():
    sidecar = Sidecar(service="shop", kv=MemoryKV(), stream=MemoryStreams(),
                      tracing=open_tracing(Settings(), "shop"))
    await sidecar.start(("127.0.0.1", 0))
    await sidecar.stop()

asyncio.run(main())
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""


@pytest.mark.parametrize("endpoint", [None, "http://127.0.0.1:9"])
def test_opentelemetry_is_imported_only_when_tracing_is_configured(
    endpoint: str | None,
) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    if endpoint is not None:
        env["CANARY_OTEL_ENDPOINT"] = endpoint
    result = subprocess.run(
        [sys.executable, "-c", _START_A_SIDECAR],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    imported = result.stdout.strip().splitlines()[-1]
    if endpoint is None:
        assert imported == "[]"
    else:
        assert "opentelemetry.sdk.trace" in imported
