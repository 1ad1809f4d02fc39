"""The admin endpoint answers while the collector ingests (decisions 0058, 0062).
Functional, no timing: probes sent while a backlog is being applied are answered
before the backlog is done."""

from __future__ import annotations

import asyncio

import numpy as np

from controlplane.collector.admin import serve_admin
from controlplane.collector.service import Collector
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.streams_factory import open_streams

SERVICE = "payment-api"

EXPERIMENTS = 150
BATCHES_EACH = 4


def _backlog(now: float) -> list[dict[str, bytes]]:
    rng = np.random.default_rng(5)
    entries = []
    for e in range(EXPERIMENTS):
        for k in range(BATCHES_EACH):
            builder = BatchBuilder()
            for i, rt in enumerate(rng.integers(10_000, 90_000, 50).tolist()):
                builder.add(now, "canary" if i % 4 == 0 else "baseline", rt, 200)
            meta = BatchMeta(f"exp-{e}", f"sc-{e}", k + 1, len(builder))
            entries.append(entry_fields(meta, builder.encode()))
    return entries


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def test_probes_are_answered_while_a_backlog_is_applied() -> None:
    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    keys = EtcdKeys("/t")
    await kv.put(keys.rule(SERVICE), b'{"service": "payment-api", "threshold_ms": 100}')
    # an empty read waits (block_ms), as a read of Redis does: the in-memory stream
    # answers an empty read at once otherwise, and the loop would never wait at all
    collector = Collector(streams, board, kv, keys, consumer_name="c1", clock=clock,
                          block_ms=20, count=200)  # fmt: skip
    await collector.load_config()
    total = EXPERIMENTS * BATCHES_EACH * 50
    entries = _backlog(clock.now())
    for i in range(0, len(entries), 100):
        await streams.append(SERVICE, entries[i : i + 100], maxlen=10_000)
    server = serve_admin(collector, "127.0.0.1", 0)
    port = server.port
    stop = asyncio.Event()
    running = asyncio.create_task(collector.run(stop))
    seen: list[tuple[float, bytes]] = []  # samples applied when each answer came
    try:
        while collector.metrics.ingested._value.get() < total and not running.done():
            for path in ("/healthz", "/metrics"):
                answer = await _get(port, path)
                seen.append((collector.metrics.ingested._value.get(), answer.split(b"\r\n")[0]))
    finally:
        stop.set()
        await running
        server.stop()
        await collector.stop_watching()
        await streams.close()
        await kv.close()
    assert collector.metrics.ingested._value.get() == total
    during = [status for applied, status in seen if 0 < applied < total]
    assert len(during) >= 2, seen
    assert set(during) == {b"HTTP/1.1 200 OK"}
