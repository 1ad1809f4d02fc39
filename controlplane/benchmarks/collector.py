"""`canary bench collector`: the window engine and one collector process through Redis.

References measured in the same run: the `ddsketch` package (add() per sample) and
exact `numpy.percentile` over the raw samples. Uses Redis at 127.0.0.1:6379 (or
CANARY_BENCH_REDIS) under a unique namespace, deleted afterwards.

Figures are wall-clock. The machine's load average is recorded with them, and the
collector process's CPU time too (Linux), because a loaded machine lowers wall-clock
throughput without saying so. The engine runs several times (best and median).

End to end, one `canary collector` process is started and ready (its /readyz) before
the samples are sent; `e2e_samples_per_s` counts from the first batch sent until a
reader of the partial windows counts every sample, so it measures the send, the
ingest and the publish together and cannot read zero however fast the collector is
(`e2e_send_s` is the sending alone); `e2e_startup_s` is the process's start-up.

`steady` (alone with `--only steady`) is a collector's CPU per experiment-second under
the scale benchmark's feed, in-process (collector_steady.py).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import numpy as np

from controlplane.benchmarks.children import stop_child
from controlplane.benchmarks.collector_steady import steady
from controlplane.collector.windows import ExperimentWindow, WindowConfig
from controlplane.kernel.codec import (
    SHED,
    BatchMeta,
    DecodedBatch,
    RawBatch,
    decode_raw,
    entry_fields,
)
from controlplane.kernel.rules import PERCENTILES

BATCH = 512
READ_COUNT = 200  # entries per XREADGROUP: the collector's default --count
ENGINE_REPEATS = 5
NOW = 1_800_000_000.0
SERVICE = "bench-svc"
EXPERIMENT = "bench"


def _samples(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "lognormal":
        values = rng.lognormal(np.log(40_000), 0.9, n)
    elif kind == "bimodal":
        values = np.where(
            rng.random(n) < 0.8, rng.normal(20_000, 2_000, n), rng.normal(900_000, 50_000, n)
        )
    elif kind == "pareto":
        values = (rng.pareto(1.5, n) + 1) * 5_000
    else:
        values = np.full(n, 123_456.0)
    return np.clip(values, 0, 2**32 - 1).astype(np.uint32)


def _decoded(
    rt: np.ndarray, t0: float, span: float, *, first_byte: bool = True, tallies: bool = False
) -> list[DecodedBatch]:
    """Batches of `rt`; with `first_byte` (batch version 2) the head came at a quarter
    of the total, without it they are what a sidecar before version 2 sends. With
    `tallies` the last record of each batch is a shed tally (batch version 3), as a
    sidecar flushing while its gates shed writes it."""
    n = rt.shape[0]
    ts = t0 + np.linspace(0, span, n)
    variant = (np.arange(n) % 10 == 0).astype(np.uint8)
    outcome = np.full(n, 200, np.uint16)
    unit = np.zeros(n, np.uint32)
    fb = rt // 4 if first_byte else None
    if tallies:
        rt = rt.copy()
        outcome[BATCH - 1 :: BATCH] = SHED
        rt[BATCH - 1 :: BATCH] = 3  # requests shed since the previous tally
        if fb is not None:
            fb[BATCH - 1 :: BATCH] = 0
    return [
        DecodedBatch(("baseline", "canary"), ts[i : i + BATCH], variant[i : i + BATCH],
                     rt[i : i + BATCH], outcome[i : i + BATCH], unit[i : i + BATCH],
                     None if fb is None else fb[i : i + BATCH])
        for i in range(0, n, BATCH)
    ]  # fmt: skip


def _payload(batch: DecodedBatch) -> bytes:
    """Encode with numpy (the sidecar's BatchBuilder is per-request, too slow to prepare 5M)."""
    import struct
    import zlib

    names = b"".join(bytes([len(v)]) + v.encode() for v in batch.variants)
    n = len(batch)
    t0 = float(batch.ts[0])
    version = 1 if batch.fb_us is None else 3 if bool((batch.outcome == SHED).any()) else 2
    body = (
        struct.pack("<3sBIB", b"CSB", version, n, len(batch.variants)) + names
        + struct.pack("<d", t0)
        + np.round((batch.ts - t0) * 1e6).astype("<u4").tobytes()
        + batch.variant.astype("u1").tobytes() + batch.rt_us.astype("<u4").tobytes()
        + batch.outcome.astype("<u2").tobytes() + batch.unit.astype("<u4").tobytes()
    )  # fmt: skip
    if batch.fb_us is not None:
        body += batch.fb_us.astype("<u4").tobytes()
    return body + struct.pack("<I", zlib.crc32(body))


def _engine_input(
    n: int, *, first_byte: bool = True, tallies: bool = False
) -> tuple[list[RawBatch], np.ndarray]:
    """The batches as the collector holds them after a read: views into the payloads."""
    rt = _samples("lognormal", n, 1)
    decoded = _decoded(rt, NOW - 50, 50, first_byte=first_byte, tallies=tallies)
    return [decode_raw(_payload(b)) for b in decoded], rt


def _engine(batches: list[RawBatch]) -> tuple[float, float]:
    """record_many per read's worth of batches (READ_COUNT x 512 samples).

    Samples per wall-clock second, and per second of this process's CPU time.
    """
    n = sum(len(b) for b in batches)
    window = ExperimentWindow("e", WindowConfig(60, 200.0), clock_now=NOW)
    cpu = time.process_time()
    start = time.perf_counter()
    for i in range(0, len(batches), READ_COUNT):
        window.record_many(batches[i : i + READ_COUNT], NOW)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    return n / elapsed, n / cpu if cpu > 0 else 0.0


def _cpu_seconds(pid: int) -> float | None:
    """user + system CPU time of a process (Linux /proc), None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _ddsketch(rt: np.ndarray) -> float:
    from ddsketch import DDSketch

    sketch = DDSketch(relative_accuracy=0.01)
    values = (rt / 1000.0).tolist()
    start = time.perf_counter()
    for value in values:
        sketch.add(value)
    for q in PERCENTILES:
        sketch.get_quantile_value(q / 100)
    return len(values) / (time.perf_counter() - start)


def _numpy_exact(rt: np.ndarray) -> float:
    chunks = [rt[i : i + BATCH] for i in range(0, rt.shape[0], BATCH)]
    start = time.perf_counter()
    raw = np.concatenate(chunks)
    np.percentile(raw, list(PERCENTILES), method="inverted_cdf")
    return int(rt.shape[0]) / (time.perf_counter() - start)


def _errors(n: int) -> dict[str, dict[str, float]]:
    errors: dict[str, dict[str, float]] = {}
    for kind in ("lognormal", "bimodal", "pareto", "constant"):
        rt = _samples(kind, n, 2)
        window = ExperimentWindow("e", WindowConfig(60, 200.0), clock_now=NOW)
        window.record_many(_decoded(rt, NOW - 50, 50), NOW)
        snap = window.snapshot(NOW)
        merged = rt[np.arange(n) % 10 != 0]  # the baseline's samples (see _decoded)
        errors[kind] = {}
        for q in PERCENTILES:
            exact = float(np.percentile(merged, q, method="inverted_cdf")) / 1000
            got = snap["baseline"].percentile_ms(q) or 0.0
            errors[kind][f"p{q:g}"] = abs(got - exact) / exact if exact else 0.0
    return errors


async def _through_redis(url: str, n: int, progress: bool) -> dict[str, float]:
    from controlplane.collector.sharding import read_merged_snapshots
    from controlplane.kernel.streams_factory import open_streams

    namespace = f"canary-bench-{uuid.uuid4().hex[:8]}"
    prefix = f"/canary-bench-{uuid.uuid4().hex[:8]}"
    streams, board = open_streams(url, namespace=namespace)
    now = time.time()
    rt = _samples("lognormal", n, 3)
    batches = _decoded(rt, now - 5, 4)
    entries = [
        entry_fields(BatchMeta(EXPERIMENT, "bench-src", i + 1, len(b)), _payload(b))
        for i, b in enumerate(batches)
    ]
    await streams.ensure_group(SERVICE, "collectors")
    env = dict(os.environ, CANARY_REDIS_URL=url, CANARY_REDIS_NAMESPACE=namespace,
               CANARY_ETCD="memory://", CANARY_ETCD_PREFIX=prefix)  # fmt: skip
    from controlplane.benchmarks.scale import _free_port, _wait_ready

    admin = _free_port()
    spawned = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "collector", "--count",
         str(READ_COUNT), "--tick", "0.1", "--admin", f"127.0.0.1:{admin}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    result: dict[str, float] = {}
    try:
        # end to end from the first sample sent to a running collector until a reader
        # of the partials counts every one: the start-up is measured apart, and a fast
        # collector cannot make the figure read zero (it once measured from the first
        # snapshot seen, which already held every sample)
        await _wait_ready(admin)
        ready = time.perf_counter()
        cpu_ready = _cpu_seconds(proc.pid)
        began = time.perf_counter()
        for i in range(0, len(entries), 500):
            await streams.append(SERVICE, entries[i : i + 500], maxlen=len(entries) + 1000)
        sent = time.perf_counter()
        total = 0
        while total < n and time.perf_counter() - began < 300:
            snaps = await read_merged_snapshots(board, EXPERIMENT, time.time(), window_sec=60)
            total = sum(s.count for s in snaps.values())
            if total < n:
                await asyncio.sleep(0.01)
        done = time.perf_counter()
        cpu_done = _cpu_seconds(proc.pid)
        if total < n:
            raise RuntimeError(f"the collector counted {total} of {n} samples within 300 s")
        result["e2e_samples_per_s"] = total / (done - began)
        result["e2e_send_s"] = sent - began
        result["e2e_after_send_s"] = done - sent
        result["e2e_startup_s"] = ready - spawned
        result["e2e_samples"] = float(total)
        if cpu_done is not None and cpu_ready is not None and cpu_done > cpu_ready:
            # what the process would do with a core to itself (the same span)
            result["e2e_samples_per_cpu_s"] = total / (cpu_done - cpu_ready)
        if progress:
            print(f"e2e: {total} samples in {done - began:.2f} s from the first sent "
                  f"(sending took {sent - began:.2f} s)", file=sys.stderr)  # fmt: skip
        # arrival → effect in a published snapshot, at a steady ~20k samples/s
        latencies = []
        seq = len(entries)
        expected = total
        for _ in range(60):
            seq += 1
            b = _decoded(_samples("lognormal", BATCH, seq), time.time(), 0.0)[0]
            entry = entry_fields(BatchMeta(EXPERIMENT, "bench-src", seq, BATCH), _payload(b))
            sent = time.perf_counter()
            await streams.append(SERVICE, [entry], maxlen=len(entries) + 1000)
            expected += BATCH
            while time.perf_counter() - sent < 2:
                snaps = await read_merged_snapshots(board, EXPERIMENT, time.time(), window_sec=60)
                if sum(s.count for s in snaps.values()) >= expected:
                    break
                await asyncio.sleep(0.002)
            latencies.append((time.perf_counter() - sent) * 1000)
            await asyncio.sleep(0.025)
        result["arrival_to_snapshot_p99_ms"] = float(np.percentile(latencies, 99))
        result["arrival_to_snapshot_p50_ms"] = float(np.percentile(latencies, 50))
    finally:
        stop_child(proc, 15.0)
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url)
        keys = [k async for k in client.scan_iter(match=f"{namespace}:*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        await streams.close()
    return result


def run(*, quick: bool, progress: bool, only: str | None = None) -> dict[str, Any]:
    """Everything; or (`only="steady"`) the collector's CPU per experiment-second alone."""
    if only is not None:
        if {part.strip() for part in only.split(",")} != {"steady"}:
            raise ValueError(f"collector: the section to pick is steady, not {only!r}")
        load_before = os.getloadavg()
        result = steady(quick=quick)
        load_after = os.getloadavg()
        return {"quick": quick, "cpus": os.cpu_count(), "steady": result,
                "load_avg": {"before": list(load_before), "after": list(load_after)}}  # fmt: skip
    n_engine = 1_000_000 if quick else 5_000_000
    n_e2e = 500_000 if quick else 5_000_000
    n_ref = 200_000 if quick else 1_000_000
    load_before = os.getloadavg()
    engine_input, rt = _engine_input(n_engine)
    # the same samples in version 1 batches (no first byte: the total window only),
    # run in turn with the version 2 ones so both see the same machine load
    v1_input, _ = _engine_input(n_engine, first_byte=False)
    # and in version 3 batches, one shed tally each (decision 0025)
    v3_input, _ = _engine_input(n_engine, tallies=True)
    engine_measured, v1_measured, v3_measured = [], [], []
    for _ in range(ENGINE_REPEATS):
        engine_measured.append(_engine(engine_input))
        v1_measured.append(_engine(v1_input))
        v3_measured.append(_engine(v3_input))
    engine_runs = [wall for wall, _ in engine_measured]
    engine_cpu_runs = [cpu for _, cpu in engine_measured]
    engine_rate = float(np.median(engine_runs))
    v1_rate = float(np.median([wall for wall, _ in v1_measured]))
    v1_cpu = float(np.median([cpu for _, cpu in v1_measured]))
    v3_rate = float(np.median([wall for wall, _ in v3_measured]))
    v3_cpu = float(np.median([cpu for _, cpu in v3_measured]))
    del engine_input, v1_input, v3_input
    if progress:
        print(f"engine: {engine_rate / 1e6:.1f} M samples/s (median), "
              f"{max(engine_runs) / 1e6:.1f} best; version 1 batches "
              f"{v1_rate / 1e6:.1f} M samples/s", file=sys.stderr)  # fmt: skip
    dd_rate = _ddsketch(rt[:n_ref])
    np_rate = _numpy_exact(rt)
    errors = _errors(200_000 if quick else 1_000_000)
    window = ExperimentWindow("e", WindowConfig(60, 200.0), clock_now=NOW)
    window.record_many(_decoded(_samples("lognormal", 600_000, 4), NOW - 59, 59), NOW)
    # one variant: its total ring and its first-byte ring
    window_bytes = (
        window.ring("baseline").nbytes() + window.ring("baseline", first_byte=True).nbytes()
    )
    url = os.environ.get("CANARY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
    e2e = asyncio.run(_through_redis(url, n_e2e, progress))
    steady_result = steady(quick=quick)
    load_after = os.getloadavg()
    return {
        "quick": quick,
        "cpus": os.cpu_count(),
        "load_avg": {"before": list(load_before), "after": list(load_after)},
        "samples_engine": n_engine,
        "samples_e2e": n_e2e,
        "batch_size": BATCH,
        "read_count": READ_COUNT,
        "engine_samples_per_s": engine_rate,
        "engine_samples_per_s_best": max(engine_runs),
        "engine_runs_samples_per_s": engine_runs,
        "engine_samples_per_cpu_s": float(np.median(engine_cpu_runs)),
        "engine_samples_per_cpu_s_best": max(engine_cpu_runs),
        "engine_v1_batches_samples_per_s": v1_rate,
        "engine_v1_batches_samples_per_cpu_s": v1_cpu,
        # what keeping the first byte beside the total costs the engine, same run
        "engine_v2_vs_v1_batches": engine_rate / v1_rate,
        "engine_v2_vs_v1_batches_cpu": float(np.median(engine_cpu_runs)) / v1_cpu,
        "engine_v3_tallies_batches_samples_per_s": v3_rate,
        "engine_v3_tallies_batches_samples_per_cpu_s": v3_cpu,
        # what a shed tally in every batch costs the engine, same run (records per s)
        "engine_v3_tallies_vs_v2_batches": v3_rate / engine_rate,
        "engine_v3_tallies_vs_v2_batches_cpu": v3_cpu / float(np.median(engine_cpu_runs)),
        "ddsketch_samples_per_s": dd_rate,
        "numpy_exact_samples_per_s": np_rate,
        "engine_vs_ddsketch": engine_rate / dd_rate,
        "engine_vs_numpy_exact": engine_rate / np_rate,
        "errors": errors,
        "max_rel_error": max(v for d in errors.values() for v in d.values()),
        "window_bytes": window_bytes,
        "window_sec": 60,
        **e2e,
        "steady": steady_result,
        "targets": {
            "e2e_samples_per_s": 1_000_000,
            "engine_samples_per_s": 20_000_000,
            "max_rel_error": 0.01,
            "arrival_to_snapshot_p99_ms": 200,
        },
    }
