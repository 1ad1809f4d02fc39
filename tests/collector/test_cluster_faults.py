"""Samples over a real Redis Cluster (3 primaries, 3 replicas), faults included.

The sidecar's reporter writes, `canary collector` processes read through the
consumer group, and the controller's read (`read_merged_snapshots`) merges what
they published. Exact accounting: every sample the reporter sealed is either
counted once or lost with a primary that died before replicating it, and those
losses are counted here from what the stream still holds afterwards.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from redis.asyncio import RedisCluster as RedisClusterClient

from controlplane.collector.sharding import read_merged_snapshots
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.codec import BatchMeta, parse_meta
from controlplane.kernel.keys import COLLECTOR_GROUP, EtcdKeys, RedisKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.streams import SampleStream, SnapshotBoard
from controlplane.kernel.streams_factory import open_streams
from sidecar.reporter import SampleReporter
from tests.collector.test_crash import wait_ready
from tests.collector.test_service import make_batches
from tests.conftest import unique
from tests.support.processes import environ_with, free_port, terminate
from tests.support.redis_cluster import RedisCluster

pytestmark = [pytest.mark.real, pytest.mark.e2e]

SETTLE_SEC = 60.0
FAILOVER_CLAIM_IDLE_MS = 8000  # how long the collectors get to catch up after the load ends


@dataclass
class Setup:
    cluster: RedisCluster
    namespace: str
    keys: EtcdKeys
    kv: KeyValueStore
    streams: SampleStream
    board: SnapshotBoard
    env: dict[str, str]


@pytest.fixture
async def setup(
    redis_cluster: RedisCluster, etcd_endpoint: str, etcd_prefix: str
) -> AsyncIterator[Setup]:
    redis_cluster.wait_ok()
    namespace = unique("canary-test")
    streams, board = open_streams(redis_cluster.url, namespace=namespace)
    kv = open_kv(etcd_endpoint)
    env = environ_with(
        CANARY_REDIS_URL=redis_cluster.url,
        CANARY_REDIS_NAMESPACE=namespace,
        CANARY_ETCD=etcd_endpoint,
        CANARY_ETCD_PREFIX=etcd_prefix,
    )
    try:
        yield Setup(redis_cluster, namespace, EtcdKeys(etcd_prefix), kv, streams, board, env)
    finally:
        await streams.close()
        await kv.close()


@pytest.fixture
def collectors() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        terminate(proc)


async def start_collectors(
    setup: Setup,
    procs: list[subprocess.Popen[bytes]],
    n: int,
    names: Sequence[str] = (),
    claim_idle_ms: int = 1500,
) -> list[int]:
    ports = [free_port() for _ in range(n)]
    for i, port in enumerate(ports):
        named = ["--name", names[i]] if names else []
        procs.append(start_collector(setup.env, port, claim_idle_ms, *named))
    deadline = time.monotonic() + 30
    for port in ports:
        await asyncio.to_thread(wait_ready, port, deadline)
    return ports


def start_collector(
    env: dict[str, str], admin_port: int, claim_idle_ms: int, *extra: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "controlplane.cli.main", "collector",
            "--admin", f"127.0.0.1:{admin_port}", "--claim-idle-ms", str(claim_idle_ms),
            "--count", "20", *extra,
        ],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


async def kill_if_holding_entries(
    setup: Setup, proc: subprocess.Popen[bytes], services: Sequence[str]
) -> bool:
    """SIGKILL the collector named `doomed` if it holds unacked entries now: frozen
    (SIGSTOP) first, so what XPENDING says is still true at the kill."""
    keys = RedisKeys(setup.namespace)
    raw = RedisClusterClient(host="127.0.0.1", port=setup.cluster.alive()[0].port)
    proc.send_signal(signal.SIGSTOP)
    try:
        held = 0
        for service in services:
            summary = await raw.xpending(keys.samples(service), COLLECTOR_GROUP)
            held += sum(int(c["pending"]) for c in summary["consumers"] if c["name"] == b"doomed")
    finally:
        await raw.aclose()
    if not held:
        proc.send_signal(signal.SIGCONT)
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    return True


def services_on_every_primary(cluster: RedisCluster, namespace: str) -> list[str]:
    """One service name per primary: their samples streams live on different nodes."""
    keys = RedisKeys(namespace)
    chosen: dict[int, str] = {}
    for i in range(200):
        service = f"svc-{i}"
        chosen.setdefault(cluster.primary_of(keys.samples(service)).port, service)
        if len(chosen) == 3:
            return sorted(chosen.values())
    raise AssertionError("no three services on three primaries")


async def prepare_services(setup: Setup) -> list[str]:
    """Three services on three primaries, each with a rule and the collectors' group."""
    services = services_on_every_primary(setup.cluster, setup.namespace)
    for service in services:
        await put_rule(setup, service)
        await setup.streams.ensure_group(service, COLLECTOR_GROUP)
    return services


async def put_rule(setup: Setup, service: str) -> None:
    rule = f'{{"service": "{service}", "threshold_ms": 50, "window_sec": 600}}'
    await setup.kv.put(setup.keys.rule(service), rule.encode())


async def counted(setup: Setup, experiment: str) -> int:
    snapshots = await read_merged_snapshots(setup.board, experiment, SystemClock().now())
    return sum(snapshot.count for snapshot in snapshots.values())


async def settle(
    setup: Setup, expected: dict[str, int], services: Sequence[str]
) -> dict[str, int]:
    """Wait until every experiment counts `expected` and nothing is pending; the counts."""
    deadline = time.monotonic() + SETTLE_SEC
    totals: dict[str, int] = {}
    while time.monotonic() < deadline:
        totals = {experiment: await counted(setup, experiment) for experiment in expected}
        pending = [await setup.streams.pending(s, COLLECTOR_GROUP) for s in services]
        if totals == expected and not any(pending):
            break
        await asyncio.sleep(0.1)  # polling other processes' progress
    return totals


def record(reporter: SampleReporter, experiment: str, n: int, rng: np.random.Generator) -> None:
    now = SystemClock().now()
    for rt in rng.lognormal(np.log(40_000), 1.0, n).astype(np.uint32):
        variant = "canary" if rt % 4 == 0 else "baseline"
        reporter.record(now, experiment, variant, int(rt), 200, int(rt))


async def test_reporter_to_controller_read_counts_every_sample_once_across_primaries(
    setup: Setup, collectors: list[subprocess.Popen[bytes]]
) -> None:
    services = await prepare_services(setup)
    await start_collectors(setup, collectors, 2)
    reporters = [SampleReporter(setup.streams, service, batch_size=100) for service in services]
    rng = np.random.default_rng(11)
    expected: dict[str, int] = {}
    for round_ in range(20):
        for i, reporter in enumerate(reporters):
            experiment = f"exp-{i}"
            record(reporter, experiment, 250 + 10 * i, rng)
            expected[experiment] = expected.get(experiment, 0) + 250 + 10 * i
            assert await reporter.flush()
        if round_ % 5 == 0:
            await asyncio.sleep(0.05)  # let the collectors read between bursts

    totals = await settle(setup, expected, services)

    assert totals == expected
    for reporter in reporters:
        stats = reporter.snapshot()
        assert (stats.samples_dropped, stats.send_errors, stats.buffered_samples) == (0, 0, 0)


async def surviving_batches(setup: Setup, service: str) -> dict[tuple[str, int], int]:
    """(src, seq) → samples of every batch the stream holds now."""
    found: dict[tuple[str, int], int] = {}
    for entry in await read_all(setup, service):
        meta: BatchMeta = parse_meta(entry)
        found[(meta.source, meta.seq)] = meta.n
    return found


async def read_all(setup: Setup, service: str) -> list[dict[str, bytes]]:
    """Every entry of the stream, through a group of its own (the test's reader)."""
    group = unique("audit")
    await setup.streams.ensure_group(service, group)
    entries: list[dict[str, bytes]] = []
    while True:
        got = await setup.streams.read_group([service], group, "audit", count=1000, block_ms=0)
        if not got:
            return entries
        entries.extend(dict(entry.fields) for entry in got)


async def test_primary_killed_mid_stream_loses_only_unreplicated_samples_and_counts_none_twice(
    setup: Setup, collectors: list[subprocess.Popen[bytes]]
) -> None:
    keys = RedisKeys(setup.namespace)
    service = services_on_every_primary(setup.cluster, setup.namespace)[0]
    victim = setup.cluster.primary_of(keys.samples(service))
    # the stats hash on the same primary: its partial windows die with it too
    experiment = next(
        e for e in (f"exp-{i}" for i in range(500))
        if setup.cluster.primary_of(keys.stats(e)).port == victim.port
    )
    await put_rule(setup, service)
    await setup.streams.ensure_group(service, COLLECTOR_GROUP)
    # longer than the failover: a collector riding it out keeps what it read (a
    # claim idle shorter than an outage hands a live collector's entries to another)
    ports = await start_collectors(setup, collectors, 2, claim_idle_ms=FAILOVER_CLAIM_IDLE_MS)
    reporter = SampleReporter(
        setup.streams, service, batch_size=50, maxlen=1_000_000, send_timeout=0.5,
        backoff_initial=0.02, backoff_max=0.2,
    )  # fmt: skip
    reporter.start()
    rng = np.random.default_rng(3)
    recorded = 0
    try:
        for round_ in range(120):
            record(reporter, experiment, 40, rng)
            recorded += 40
            if round_ == 40:
                setup.cluster.kill(victim)
            await asyncio.sleep(0.02)  # paces the load so the kill lands mid-stream
        # the replica takes over within a few node timeouts; the reporter resends
        # what it buffered meanwhile
        await asyncio.to_thread(setup.cluster.wait_ok)
        deadline = time.monotonic() + 30
        while not await reporter.flush() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # the client learning the new primary
    finally:
        await reporter.close()
    stats = reporter.snapshot()
    assert stats.samples_recorded == recorded
    assert (stats.samples_dropped, stats.buffered_samples) == (0, 0)
    assert stats.send_errors > 0  # the writes did meet the dead primary

    survived = await surviving_batches(setup, service)
    total = sum(survived.values())
    totals = await settle(setup, {experiment: total}, [service])
    lost_in_failover = recorded - total

    # every batch in the stream counted once; what the dead primary took with it
    # is at most what it could have held unreplicated (bounded, and counted here)
    assert totals[experiment] == total
    assert 0 <= lost_in_failover <= 20 * 50
    assert all(seq >= 1 for _, seq in survived)
    for proc in collectors:
        assert proc.poll() is None  # both collectors carried on through the failover
    assert sum(metric(port, "canary_collector_backend_errors_total") for port in ports) > 0
    setup.cluster.restart(victim)
    setup.cluster.wait_ok()


async def test_collector_killed_among_three_has_its_pending_entries_claimed_by_the_others(
    setup: Setup, collectors: list[subprocess.Popen[bytes]]
) -> None:
    services = await prepare_services(setup)
    ports = await start_collectors(setup, collectors, 3, names=["doomed", "c1", "c2"])
    clock = SystemClock()
    rng = np.random.default_rng(7)
    sent = 0
    killed = False
    for round_ in range(90):
        service = services[round_ % 3]
        rt = rng.lognormal(np.log(40_000), 1.0, 512 * 3).astype(np.uint32)
        first = 1 + (round_ // 3) * 3
        batches = make_batches(rt, clock.now(), source=f"sc-{service}", first_seq=first)
        await setup.streams.append(service, batches, maxlen=100_000)
        sent += rt.shape[0]
        if round_ >= 20 and not killed:
            killed = await kill_if_holding_entries(setup, collectors[0], services)
        await asyncio.sleep(0.01)  # paces the producer so the kill lands mid-stream

    totals = await settle(setup, {"42": sent}, services)

    assert killed, "the collector never held an unacked entry"
    assert totals == {"42": sent}
    await asyncio.sleep(0.5)  # stays exact: nothing is counted again later
    assert await counted(setup, "42") == sent
    # the survivors took over what the dead one had read and not acked
    assert sum(metric(port, "canary_collector_entries_claimed_total") for port in ports[1:]) > 0


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
        text = reply.read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert values, f"{name} missing"
    return sum(values)
