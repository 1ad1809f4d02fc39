"""`canary bench redis-cluster`: the sample path on a Redis Cluster against one server.

The same work on both, in the same run, interleaved round by round: sidecars'
pipelined appends (64 batches of 512 samples per call) to 12 services' streams,
then a collector draining them with `read_group` over all 12 services (count 200,
acking each read). On the cluster the 12 streams fall in 12 slots on 3 primaries,
so one read is 12 XREADGROUPs; the chosen way pipelines them per node, the
alternative measured beside it reads each slot in a round trip of its own.

CANARY_BENCH_REDIS: the single server (default redis://127.0.0.1:6379/0);
CANARY_BENCH_REDIS_CLUSTER: the cluster, a redis+cluster:// URL (required), e.g.
three primaries made with `redis-cli --cluster create … --cluster-replicas 1`.
Reported: medians over the rounds and their ratios to the single server.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.keys import COLLECTOR_GROUP, RedisKeys
from controlplane.kernel.streams import SampleStream, StreamEntry
from controlplane.kernel.streams_factory import open_streams
from controlplane.kernel.streams_redis import split_cluster_url

SERVICE_COUNT = 12
BATCH = 512
PER_CALL = 64


def _payload() -> bytes:
    builder = BatchBuilder()
    now = time.time()
    for i in range(BATCH):
        builder.add(now, "canary" if i % 4 == 0 else "baseline", 40_000 + i, 200)
    return builder.encode()


async def _append(stream: SampleStream, services: list[str], calls: int) -> float:
    payload = _payload()
    # one source per service, seqs rising: every batch is new to the stream
    sent = [
        [
            entry_fields(BatchMeta("1", f"bench-{call % len(services)}", call * PER_CALL + k + 1,
                                   BATCH), payload)
            for k in range(PER_CALL)
        ]
        for call in range(calls)
    ]  # fmt: skip
    start = time.perf_counter()
    for call, fields in enumerate(sent):
        await stream.append(services[call % len(services)], fields, maxlen=1_000_000)
    return calls * PER_CALL / (time.perf_counter() - start)


ReadAll = Callable[[SampleStream, list[str]], Awaitable[int]]


async def _read_together(stream: SampleStream, services: list[str]) -> int:
    got = await stream.read_group(services, COLLECTOR_GROUP, "bench", count=200, block_ms=0)
    await _ack(stream, got)
    return len(got)


async def _read_slot_by_slot(stream: SampleStream, services: list[str]) -> int:
    total = 0
    for service in services:
        got = await stream.read_group([service], COLLECTOR_GROUP, "bench", count=200, block_ms=0)
        await _ack(stream, got)
        total += len(got)
    return total


async def _ack(stream: SampleStream, entries: list[StreamEntry]) -> None:
    by_service: dict[str, list[str]] = {}
    for entry in entries:
        by_service.setdefault(entry.service, []).append(entry.entry_id)
    for service, ids in by_service.items():
        await stream.ack(service, COLLECTOR_GROUP, ids)


async def _round(
    stream: SampleStream, url: str, keys: RedisKeys, calls: int, read: ReadAll
) -> tuple[float, float]:
    """Append to fresh streams, then drain them; each rate in batches (entries) per s."""
    services = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(SERVICE_COUNT)]
    for service in services:
        await stream.ensure_group(service, COLLECTOR_GROUP)
    try:
        appended = await _append(stream, services, calls)
        start = time.perf_counter()
        entries = 0
        while got := await read(stream, services):
            entries += got
        drained = entries / (time.perf_counter() - start)
    finally:
        await _delete(url, [keys.samples(service) for service in services])
    return appended, drained


async def _delete(url: str, names: list[str]) -> None:
    """The benchmark's own keys, one at a time (on a cluster they are in many slots)."""
    from redis.asyncio import Redis, RedisCluster
    from redis.asyncio.cluster import ClusterNode

    split = split_cluster_url(url)
    client: Redis | RedisCluster
    if split is None:
        client = Redis.from_url(url)
    else:
        first, seeds = split
        client = RedisCluster.from_url(
            first, startup_nodes=[ClusterNode(host, port) for host, port in seeds]
        )
    try:
        for name in names:
            await client.delete(name)
    finally:
        await client.aclose()


async def _measure(single: str, cluster: str, rounds: int, calls: int) -> dict[str, Any]:
    keys = RedisKeys(f"bench-{uuid.uuid4().hex[:8]}")
    ways = {
        "single": (single, _read_together),
        "cluster": (cluster, _read_together),
        "slot_by_slot": (cluster, _read_slot_by_slot),
    }
    streams = {url: open_streams(url, namespace=keys.namespace)[0] for url in (single, cluster)}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    try:
        for round_ in range(rounds + 1):  # round 0 warms the connections up, not counted
            for name, (url, read) in ways.items():
                measured = await _round(streams[url], url, keys, calls, read)
                if round_:
                    runs[name].append(measured)
    finally:
        for stream in streams.values():
            await stream.close()
    medians: dict[str, dict[str, float]] = {
        name: {
            "append_batches_per_s": round(statistics.median(a for a, _ in values)),
            "read_entries_per_s": round(statistics.median(r for _, r in values)),
        }
        for name, values in runs.items()
    }
    reference = medians["single"]
    for name in ("cluster", "slot_by_slot"):
        for metric in ("append_batches_per_s", "read_entries_per_s"):
            medians[name][f"{metric}_ratio_to_single"] = round(
                medians[name][metric] / reference[metric], 3
            )
    return medians


def run(*, quick: bool, progress: bool) -> dict[str, Any]:
    cluster = os.environ.get("CANARY_BENCH_REDIS_CLUSTER")
    if not cluster:
        raise SystemExit("canary bench redis-cluster: set CANARY_BENCH_REDIS_CLUSTER")
    single = os.environ.get("CANARY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
    rounds, calls = (3, 24) if quick else (7, 120)
    result: dict[str, Any] = {
        "services": SERVICE_COUNT,
        "batch_samples": BATCH,
        "batches_per_call": PER_CALL,
        "rounds": rounds,
        "calls_per_round": calls,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    result.update(asyncio.run(_measure(single, cluster, rounds, calls)))
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result
