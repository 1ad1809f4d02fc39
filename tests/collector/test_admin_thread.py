"""The collector's admin endpoints answer from a thread of their own (decision 0062).

A real collector (Redis streams, etcd rules) whose main loop is held by a CPU-bound
job still answers /healthz and /metrics; held past the liveness bound (a fake clock
moved on), /healthz says 503 and why. The listener refuses and counts malformed,
oversize, slow and surplus connections, stops without leaving its thread or port.
No timing is asserted: a wedged loop waits for the probes' answers, not for a time.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.collector.admin import serve_admin
from controlplane.collector.service import Collector
from controlplane.kernel.admin_thread import (
    AdminThread,
    Answer,
    Heartbeat,
    Limits,
    liveness,
    request_line,
)
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.streams_factory import open_streams

SERVICE = "payment-api"
TOKEN = "s3cret-admin-token"
WEDGE_LIMIT_SEC = 60.0  # a safety stop for a broken listener, not a speed figure


def _exchange(port: int, raw: bytes, *, timeout: float = 20.0) -> bytes:
    """Send `raw`, read until the server closes; b"" when it hangs up or resets."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(raw)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            return b""
    return b"".join(chunks)


def _get(port: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    answer = _exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def _wedge_while(probe: Callable[[], None]) -> None:
    """Hold the calling thread (the main loop) in pure-Python work, as a long slice of
    ingest would, until `probe` has run to the end on another thread."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            probe()
        except BaseException as exc:  # re-raised on the main thread
            failure.append(exc)

    prober = threading.Thread(target=run)
    prober.start()
    deadline = time.monotonic() + WEDGE_LIMIT_SEC
    x = 1
    while prober.is_alive() and time.monotonic() < deadline:
        x = (x * 31 + 7) % 1_000_003
    prober.join(1.0)
    assert not prober.is_alive(), "no answer while the main loop was held"
    if failure:
        raise failure[0]


def _backlog(now: float, experiments: int = 40) -> list[dict[str, bytes]]:
    rng = np.random.default_rng(7)
    entries = []
    for e in range(experiments):
        builder = BatchBuilder()
        for i, rt in enumerate(rng.integers(10_000, 90_000, 50).tolist()):
            builder.add(now, "canary" if i % 4 == 0 else "baseline", rt, 200)
        entries.append(entry_fields(BatchMeta(f"exp-{e}", f"sc-{e}", 1, len(builder)),
                                    builder.encode()))
    return entries


async def test_a_held_main_loop_still_answers_and_fails_healthz_past_the_bound(
    redis_url: str, redis_namespace: str, etcd_endpoint: str, etcd_prefix: str
) -> None:
    clock = FakeClock()
    streams, board = open_streams(redis_url, namespace=redis_namespace, clock=clock)
    kv = open_kv(etcd_endpoint, clock=clock)
    keys = EtcdKeys(etcd_prefix)
    await kv.put(keys.rule(SERVICE), b'{"service": "payment-api", "threshold_ms": 100}')
    await streams.ensure_group(SERVICE, "collectors")
    await streams.append(SERVICE, _backlog(clock.now()), maxlen=10_000)
    collector = Collector(streams, board, kv, keys, consumer_name="c1", clock=clock,
                          block_ms=20, count=10)  # fmt: skip
    heartbeat = Heartbeat(clock, every=0.05, bound=30.0)
    admin = serve_admin(collector, "127.0.0.1", 0, token=TOKEN, heartbeat=heartbeat)
    stop = asyncio.Event()
    beating = asyncio.create_task(heartbeat.run())
    running = asyncio.create_task(collector.run(stop))
    try:
        while collector.metrics.ingested._value.get() == 0 and not running.done():
            await asyncio.sleep(0.01)  # the collector's first applied batch
        held: dict[str, tuple[int, bytes]] = {}

        def probe_while_busy() -> None:
            held["healthz"] = _get(admin.port, "/healthz")
            held["metrics"] = _get(admin.port, "/metrics", TOKEN)
            held["unauthorized"] = _get(admin.port, "/metrics")

        _wedge_while(probe_while_busy)
        assert held["healthz"] == (200, b"ok\n")
        assert held["metrics"][0] == 200
        assert b"canary_collector_samples_ingested_total" in held["metrics"][1]
        assert held["unauthorized"][0] == 401

        def probe_past_the_bound() -> None:
            clock.advance(31.0)  # the loop, held, beats no more
            held["stalled"] = _get(admin.port, "/healthz")

        _wedge_while(probe_past_the_bound)
        status, body = held["stalled"]
        assert status == 503
        assert body.startswith(b"main loop stalled: last heartbeat 31.0 s ago (bound 30 s)")

        # released, the loop beats again and /healthz recovers
        while heartbeat.age() > 0 and not running.done():
            await asyncio.sleep(0.01)
        assert await asyncio.to_thread(_get, admin.port, "/healthz") == (200, b"ok\n")
        _, metrics = await asyncio.to_thread(_get, admin.port, "/metrics", TOKEN)
        assert b"canary_collector_admin_unauthorized_total 1.0" in metrics
        # the pending page the loop's claim look wrote, after the registry's families:
        # one exposition that a Prometheus parser reads whole
        families = {f.name: f for f in text_string_to_metric_families(metrics.decode())}
        pending = families["canary_collector_pending_entries"]
        assert [s.labels for s in pending.samples] == [{"service": SERVICE}]
        assert "canary_collector_samples_ingested" in families
    finally:
        stop.set()
        await running
        beating.cancel()
        admin.stop()
        await collector.stop_watching()
        await streams.close()
        await kv.close()


def test_liveness_fails_only_past_the_bound() -> None:
    assert liveness(0.0, 30.0) == Answer(200, b"ok\n")
    assert liveness(30.0, 30.0).status == 200
    stalled = liveness(30.05, 30.0)
    assert stalled.status == 503
    assert stalled.body == b"main loop stalled: last heartbeat 30.1 s ago (bound 30 s)\n"


def test_heartbeat_age_follows_the_clock() -> None:
    clock = FakeClock()
    beat = Heartbeat(clock, bound=5.0)
    clock.advance(3.0)
    assert beat.age() == 3.0
    beat.beat()
    assert beat.age() == 0.0
    with pytest.raises(ValueError):
        Heartbeat(clock, bound=0.0)


@pytest.mark.parametrize("line", [
    b"GARBAGE", b"GET /healthz", b"GET /healthz HTTP/1.1 extra", b"get /healthz HTTP/1.1",
    b"GET healthz HTTP/1.1", b"GET /healthz HTTP/2", b"GET /\xff HTTP/1.1",
])  # fmt: skip
def test_request_lines_that_are_not_http1_are_refused(line: bytes) -> None:
    with pytest.raises(ValueError):  # UnicodeDecodeError is one
        request_line(line + b"\r\nHost: x\r\n\r\n")


def test_request_line_drops_the_query() -> None:
    assert request_line(b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n") == ("HEAD", "/metrics")


def _plain(path: str, head: bytes) -> Answer:
    return Answer(200, b"ok\n") if path == "/healthz" else Answer(404, b"not found\n")


def _refused_metrics(admin: AdminThread) -> str:
    registry = CollectorRegistry()
    registry.register(admin.metrics_collector("test"))
    return generate_latest(registry).decode()


def test_malformed_oversize_and_slow_requests_are_refused_and_counted() -> None:
    admin = AdminThread(_plain, limits=Limits(max_head=1024, read_timeout=0.3))
    admin.start("127.0.0.1", 0)
    try:
        assert _exchange(admin.port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert _exchange(admin.port, b"\xff\xfe /healthz HTTP/1.1\r\n\r\n").startswith(
            b"HTTP/1.1 400 "
        )
        assert _exchange(admin.port, b"POST /healthz HTTP/1.1\r\n\r\n").startswith(
            b"HTTP/1.1 405 "
        )
        head_only = _exchange(admin.port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
        assert head_only.startswith(b"HTTP/1.1 200 ") and head_only.endswith(b"\r\n\r\n")
        # a head past the limit: answered 400 or cut off, and counted either way
        answer = _exchange(admin.port, b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 4096
                           + b"\r\n\r\n")  # fmt: skip
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400 ")
        # a client that never ends its head is cut off by the server, not by itself
        assert _exchange(admin.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n") == b""
        # one that hangs up mid-head
        with socket.create_connection(("127.0.0.1", admin.port)) as sock:
            sock.sendall(b"GET /hea")
        assert _exchange(admin.port, b"GET /healthz HTTP/1.1\r\n\r\n").startswith(
            b"HTTP/1.1 200 "
        )
    finally:
        admin.stop()
    assert admin.refused == {"timeout": 1, "oversize": 1, "malformed": 3, "busy": 0}
    text = _refused_metrics(admin)
    assert 'test_admin_refused_total{reason="malformed"} 3.0' in text
    assert 'test_admin_refused_total{reason="timeout"} 1.0' in text


def test_connections_past_the_limit_are_closed_and_stop_leaves_nothing_behind() -> None:
    admin = AdminThread(_plain, limits=Limits(read_timeout=60.0, max_connections=2),
                        name="test-admin")  # fmt: skip
    admin.start("127.0.0.1", 0)
    port = admin.port
    idle = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(2)]
    try:
        for sock in idle:  # both accepted and waiting for a head
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        while admin._open < 2:
            time.sleep(0.01)  # the admin thread accepting them
        assert _exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n") == b""
        assert admin.refused["busy"] == 1
    finally:
        admin.stop()  # closes the two idle connections too
    for sock in idle:
        with sock:
            assert sock.recv(100) == b""
    assert not any(t.name == "test-admin" for t in threading.enumerate())
    with socket.create_server(("127.0.0.1", port)):
        pass  # the port is free again


def test_a_port_in_use_is_reported_by_start() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        admin = AdminThread(_plain, name="test-admin-taken")
        with pytest.raises(OSError):
            admin.start("127.0.0.1", taken.getsockname()[1])
    assert not any(t.name == "test-admin-taken" for t in threading.enumerate())
