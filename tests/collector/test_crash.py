"""Two `canary collector` processes, one SIGKILLed mid-stream: counts stay exact."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from controlplane.collector.sharding import read_merged_snapshots
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.streams_factory import open_streams
from tests.collector.test_service import EXPERIMENT, SERVICE, make_batches
from tests.support.processes import environ_with, free_port, terminate

pytestmark = [pytest.mark.real, pytest.mark.e2e]


def start_collector(env: dict[str, str], admin_port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "controlplane.cli.main", "collector",
            "--admin", f"127.0.0.1:{admin_port}", "--claim-idle-ms", "1500", "--count", "20",
        ],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def wait_ready(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)  # polling a child process, no injected clock here
    raise TimeoutError(f"collector on {port} never became ready")


async def test_sigkill_of_one_collector_loses_and_doubles_nothing(
    redis_url: str, redis_namespace: str, etcd_endpoint: str, etcd_prefix: str
) -> None:
    keys = EtcdKeys(etcd_prefix)
    kv = open_kv(etcd_endpoint)
    streams, board = open_streams(redis_url, namespace=redis_namespace)
    await kv.put(
        keys.rule(SERVICE), b'{"service": "payment-api", "threshold_ms": 50, "window_sec": 300}'
    )
    await streams.ensure_group(SERVICE, "collectors")
    env = environ_with(
        CANARY_REDIS_URL=redis_url,
        CANARY_REDIS_NAMESPACE=redis_namespace,
        CANARY_ETCD=etcd_endpoint,
        CANARY_ETCD_PREFIX=etcd_prefix,
    )
    ports = [free_port(), free_port()]
    procs = [start_collector(env, port) for port in ports]
    try:
        deadline = time.monotonic() + 30
        for port in ports:
            await asyncio.to_thread(wait_ready, port, deadline)
        clock = SystemClock()
        rng = np.random.default_rng(5)
        sent = 0
        sources = [f"sc-{i}" for i in range(3)]
        seqs = dict.fromkeys(sources, 1)
        for round_ in range(60):
            source = sources[round_ % 3]
            rt = rng.lognormal(np.log(40_000), 1.0, 512 * 5).astype(np.uint32)
            batches = make_batches(rt, clock.now(), source=source, first_seq=seqs[source])
            seqs[source] += len(batches)
            await streams.append(SERVICE, batches, maxlen=100_000)
            sent += rt.shape[0]
            if round_ == 25:
                procs[0].send_signal(signal.SIGKILL)
                procs[0].wait(timeout=10)
            await asyncio.sleep(0.01)  # pacing the producer so the kill lands mid-stream
        total = -1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            snaps = await read_merged_snapshots(board, EXPERIMENT, clock.now())
            total = sum(s.count for s in snaps.values())
            if total == sent and await streams.pending(SERVICE, "collectors") == 0:
                break
            await asyncio.sleep(0.1)  # polling another process's progress
        assert total == sent
        assert await streams.pending(SERVICE, "collectors") == 0
        # stays exact: nothing is counted again later
        await asyncio.sleep(0.5)
        snaps = await read_merged_snapshots(board, EXPERIMENT, clock.now())
        assert sum(s.count for s in snaps.values()) == sent
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/metrics", timeout=2) as reply:
            page = reply.read()
        assert b"canary_collector_samples_ingested" in page
        # the process runs under the long-running garbage collector policy, shown
        assert b'python_gc_collections_total{generation="2"}' in page
    finally:
        for proc in procs:
            terminate(proc)
        await streams.close()
        await kv.close()
