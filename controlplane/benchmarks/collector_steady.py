"""A collector's CPU per experiment-second under the scale benchmark's steady feed,
in-process (`canary bench collector --only steady`).

The collector of `canary bench scale` (`Steady`) runs as a process beside Redis, the
feed, the leader and their sidecars, so its figure moves with the machine's load and
the run is heavy to repeat. This rig drives the same `Collector` (its reads, screening
with signatures, apply and publishes, merged views included) on the in-process bus
and a fake clock: every second each of N experiments gets the feed's batch (the
scale feed's `Sidecars.entry`), and the collector's rounds of that second run, ten
ticks of 0.1 s. Only those rounds are timed (process CPU time); the batches are
built before. A batch holds the half second before its stamp, and the stamps move
through the second (FRACTIONS), so half of the batches straddle a second boundary, as
a real feed's do over time.

`batch_every_tick`: each experiment's second comes as ten batches instead, one before
each tick, each stamped over the tenth of a second before it: what sidecars flushing
every 50 ms send a busy service's collector. Run at every tick's publish (as the rig's
other figures, the `Collector`'s own default), paced as `canary collector` publishes
(decision 0080), and as a collector before that decision published (format 3, every
tick), in the same run. `batch_every_20_ms`: each sample a batch of its own, five a
tick, as many sidecars each sending a few samples every 50 ms: paced, with each batch
applied alone and with a tick's applied together (`coalesce`, as `canary collector`
applies them).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from controlplane.benchmarks.scale import THRESHOLD_MS, WINDOW_SEC, Sidecars
from controlplane.collector.second_partials import COMPACT_VERSION
from controlplane.collector.service import Collector
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.sample_auth import SampleSigner
from controlplane.kernel.sample_keys import generate_sample_keys
from controlplane.kernel.streams_factory import open_streams

START = 1_800_000_000.95  # the clock when the first batches are read
FRACTIONS = (0.1, 0.35, 0.6, 0.85)  # a batch's stamp into its second, in turn
TICKS_PER_SECOND = 10
WARM_SECONDS = 3  # the rings' allocation and the first publishes, not timed


async def _steady(
    n: int, samples: int, seconds: int, *, batches_per_tick: int = 0,
    publish_every: float = 0.0, partial_format: int | None = None, coalesce: bool = False,
) -> dict[str, Any]:  # fmt: skip
    clock = FakeClock(START)
    streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    keys = EtcdKeys("/bench")
    sample_keys = generate_sample_keys()
    experiments = [(str(1000 + i), f"svc-{i:05d}") for i in range(n)]
    for _, service in experiments:
        rule = {"service": service, "threshold_ms": THRESHOLD_MS, "window_sec": WINDOW_SEC}
        await kv.put(keys.rule(service), json.dumps(rule).encode())
    collector = Collector(
        streams, board, kv, keys, consumer_name="bench", clock=clock, block_ms=0,
        sample_keys=sample_keys, publish_every=publish_every, coalesce=coalesce,
        partial_format=COMPACT_VERSION if partial_format is None else partial_format,
    )  # fmt: skip
    await collector.load_config()
    sidecars = Sidecars(streams, SampleSigner(sample_keys))
    total = WARM_SECONDS + seconds
    # per second, the entries arriving before each of its reads: a read a tick, or (a
    # batch more often than a tick) a read after each batch, as a collector reading
    # continuously takes what arrived since its last read
    reads = TICKS_PER_SECOND * max(1, batches_per_tick)
    feed: list[list[list[tuple[str, dict[str, bytes]]]]] = []
    for k in range(total):
        arriving: list[list[tuple[str, dict[str, bytes]]]] = [[] for _ in range(reads)]
        for experiment, service in experiments:
            if not batches_per_tick:
                stamp = math.floor(START) + k + FRACTIONS[k % len(FRACTIONS)]
                arriving[0].append((service, sidecars.entry(service, experiment, samples, stamp)))
                continue
            share = max(1, samples // reads)
            for b in range(reads):
                arriving[b].append((service, sidecars.entry(
                    service, experiment, share, START + k + b / reads, span=1.0 / reads
                )))  # fmt: skip
        feed.append(arriving)
    cpu = 0.0
    metrics = collector.metrics
    start_bytes = start_publishes = 0.0
    for k in range(total):
        if k == WARM_SECONDS:
            start_bytes = metrics.published_bytes._value.get()
            start_publishes = metrics.publishes._value.get()
        for r in range(reads):
            for service, entry in feed[k][r]:
                await streams.append(service, [entry], maxlen=10_000)
            began = time.process_time()
            await collector.step()
            if k >= WARM_SECONDS:
                cpu += time.process_time() - began
            clock.advance(1.0 / reads)
    published = metrics.published_bytes._value.get() - start_bytes
    publishes = metrics.publishes._value.get() - start_publishes
    await collector.stop_watching()
    await streams.close()
    await kv.close()
    return {
        "experiments": n,
        "samples_per_experiment_s": samples,
        "seconds": seconds,
        "cpu_ms_per_experiment_s": round(cpu / seconds / n * 1000, 4),
        "cpu_ms_per_publish": round(cpu / max(1.0, publishes) * 1000, 4),
        "bytes_per_experiment_s": round(published / seconds / n, 1),
    }


def steady(*, quick: bool) -> dict[str, Any]:
    """The collector's CPU per experiment-second at 50 and at 1 sample a second; at 50
    in a batch every tick, published at every tick and paced."""
    from controlplane.collector.pacing import PUBLISH_EVERY_SEC

    n, seconds = (100, 6) if quick else (300, 12)
    out = {f"samples_{samples}": asyncio.run(_steady(n, samples, seconds)) for samples in (50, 1)}
    # the last: what a collector before decision 0080 did (format 3, every tick)
    for name, every, partial_format in (
        ("every_tick", 0.0, None), ("paced", PUBLISH_EVERY_SEC, None),
        ("every_tick_format_3", 0.0, 3),
    ):  # fmt: skip
        out[f"samples_50_batch_every_tick_published_{name}"] = asyncio.run(_steady(
            n, 50, seconds, batches_per_tick=1, publish_every=every,
            partial_format=partial_format,
        ))  # fmt: skip
    # a sample every 20 ms, each in a batch of its own (many sidecars, each sending a
    # few samples every 50 ms), paced, each batch applied alone and a tick's together
    for name, coalesce in (("alone", False), ("coalesced", True)):
        out[f"samples_50_batch_every_20_ms_paced_applied_{name}"] = asyncio.run(_steady(
            n, 50, seconds, batches_per_tick=5, publish_every=PUBLISH_EVERY_SEC,
            coalesce=coalesce,
        ))  # fmt: skip
    return out
