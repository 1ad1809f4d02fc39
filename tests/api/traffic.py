"""Simulated traffic through the real sample stream and the real collector.

One FakeClock drives the sample timestamps and the collector's windows, so a minute
of traffic takes a fraction of a second. Each call of `second()` appends one batch
per experiment (as a sidecar does), lets the collector read and apply it, and
publishes the snapshots, which also appends one `canary:decisions` entry.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import numpy as np

from controlplane.collector.service import Collector
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.runtime import Backends

RATE = 200  # samples per second and variant


@dataclass
class Sent:
    """What one simulated second sent, per variant: its timestamps, RTs (ms) and failures."""

    ts: dict[str, np.ndarray] = field(default_factory=dict)
    rt_ms: dict[str, np.ndarray] = field(default_factory=dict)
    failed: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Traffic:
    backends: Backends
    clock: FakeClock
    collector: Collector
    rng: np.random.Generator
    seq: int = 0

    async def second(
        self,
        service: str,
        experiment_id: int,
        *,
        median_ms: dict[str, float],
        failure_rate: float = 0.0,
        advance: bool = True,
    ) -> Sent:
        """One simulated second of traffic for the variants in `median_ms`, collected.

        advance=False sends another experiment's traffic for the same second.
        """
        if advance:
            self.clock.advance(1.0)
        start = self.clock.now() - 1.0
        builder = BatchBuilder()
        sent = Sent()
        for variant, median in median_ms.items():
            ts = start + np.arange(RATE) / RATE
            rt_ms = self.rng.lognormal(np.log(median), 0.25, RATE)
            failed = self.rng.random(RATE) < failure_rate
            for t, rt, bad in zip(ts, rt_ms, failed, strict=True):
                builder.add(float(t), variant, int(rt * 1000), 500 if bad else 200)
            sent.ts[variant], sent.rt_ms[variant], sent.failed[variant] = ts, rt_ms, failed
        self.seq += 1
        meta = BatchMeta(str(experiment_id), "sidecar-test", self.seq, len(builder))
        assert self.backends.streams is not None
        await self.backends.streams.append(
            service, [entry_fields(meta, builder.encode())], maxlen=100_000
        )
        for _ in range(3):
            await self.collector.step()
        await self.collector.publish_due()
        return sent


@asynccontextmanager
async def collecting(backends: Backends, clock: FakeClock) -> AsyncIterator[Traffic]:
    """A collector on the backends' streams (rules read from the KV store at entry)."""
    assert backends.streams is not None and backends.board is not None
    collector = Collector(
        backends.streams, backends.board, backends.kv, backends.keys,
        consumer_name=f"c-{uuid.uuid4().hex[:6]}", clock=clock, block_ms=1,
    )  # fmt: skip
    await collector.load_config()
    try:
        yield Traffic(backends, clock, collector, np.random.default_rng(11))
    finally:
        await collector.stop_watching()
