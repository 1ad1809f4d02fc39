"""`canary sidecar --workers 2` as a process: real etcd, real Redis, real upstreams.

One supervisor and two workers on one port: both serve (the supervisor's metrics
say so per worker), both report samples under their own instance ids, a killed
worker is restarted without the summed counters going back, and SIGTERM drains
the requests in flight on both before the process exits 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.kernel.codec import BatchMeta, parse_entry
from controlplane.kernel.keys import COLLECTOR_GROUP, EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.routes import Route, RouteState, two_way_variants
from controlplane.kernel.streams import SampleStream
from controlplane.kernel.streams_factory import open_streams
from tests.sidecar import upstreams
from tests.support.processes import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.real]

SERVICE = "shop"
EXPERIMENT = 21
SLOW = 40  # requests in flight at SIGTERM, each on its own connection


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    port: int
    admin: int
    log: Path

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def workers(self) -> list[int]:
        """The supervisor's child processes (its workers)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(pid) for pid in children.read_text().split()]


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from Prometheus text (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def total(text: str, name: str) -> float:
    return sum(
        float(s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    )


async def send(url: str, count: int, path: str = "/echo") -> list[int]:
    """`count` requests, each on a connection of its own (so the kernel spreads them)."""
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(trust_env=False, timeout=30, limits=limits) as client:
        responses = await asyncio.gather(*(client.get(url + path) for _ in range(count)))
    return [r.status_code for r in responses]


class Samples:
    """Everything the sidecar's workers appended to the samples stream, as it comes."""

    def __init__(self, stream: SampleStream) -> None:
        self.stream = stream
        self.metas: list[BatchMeta] = []

    async def read(self) -> list[BatchMeta]:
        entries = await self.stream.read_group(
            [SERVICE], COLLECTOR_GROUP, "test", count=10_000, block_ms=0
        )
        new = [parse_entry(entry.fields)[0] for entry in entries]
        self.metas += new
        return new

    @property
    def count(self) -> int:
        return sum(meta.n for meta in self.metas)


@pytest.fixture
async def upstream_pair() -> AsyncIterator[tuple[upstreams.Upstream, upstreams.Upstream]]:
    base, canary = upstreams.Upstream("baseline"), upstreams.Upstream("canary")
    await base.start()
    await canary.start()
    try:
        yield base, canary
    finally:
        await base.stop()
        await canary.stop()


@pytest.fixture
async def samples(redis_url: str, redis_namespace: str) -> AsyncIterator[Samples]:
    stream, _ = open_streams(redis_url, namespace=redis_namespace)
    await stream.ensure_group(SERVICE, COLLECTOR_GROUP)
    try:
        yield Samples(stream)
    finally:
        await stream.close()


@pytest.fixture
async def sidecar(
    etcd_endpoint: str,
    etcd_prefix: str,
    redis_url: str,
    redis_namespace: str,
    upstream_pair: tuple[upstreams.Upstream, upstreams.Upstream],
    samples: Samples,
    tmp_path: Path,
) -> AsyncIterator[Running]:
    base, canary = upstream_pair
    kv = open_kv(etcd_endpoint)
    key = EtcdKeys(etcd_prefix).route(SERVICE)
    route = Route(
        experiment=EXPERIMENT, revision=1, salt="workers",
        variants=two_way_variants(base.url, canary.url, 5000), state=RouteState.RUNNING,
    )  # fmt: skip
    await kv.put(key, route.to_json().encode())
    port, admin = free_port(), free_port()
    log = tmp_path / "sidecar.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", "sidecar", "--workers", "2",
             "--service", SERVICE, "--listen", f"127.0.0.1:{port}",
             "--admin", f"127.0.0.1:{admin}", "--etcd", etcd_endpoint,
             "--etcd-prefix", etcd_prefix, "--redis", redis_url],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "CANARY_REDIS_NAMESPACE": redis_namespace},
        )  # fmt: skip
    running = Running(proc, port, admin, log)
    try:
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await kv.delete(key)
        await kv.close()


async def test_two_workers_serve_report_restart_and_drain(
    sidecar: Running,
    samples: Samples,
    upstream_pair: tuple[upstreams.Upstream, upstreams.Upstream],
) -> None:
    admin = f"http://127.0.0.1:{sidecar.admin}"
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:

        async def ready() -> bool:
            assert sidecar.proc.poll() is None, sidecar.output()
            try:
                return (await client.get(f"{admin}/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        async def scrape() -> str:
            return (await client.get(f"{admin}/metrics")).text

        await until(ready, "the supervisor reports both workers ready")
        assert len(sidecar.workers()) == 2

        # both workers serve: the kernel spreads fresh connections over them
        assert await send(sidecar.proxy_url, 100) == [200] * 100
        text = await scrape()
        assert total(text, "canary_sidecar_requests_total") == 100
        served = [metric(text, "canary_sidecar_worker_requests_total", worker=w) for w in "01"]
        assert sum(served) == 100 and min(served) > 0, served
        assert metric(text, "canary_sidecar_workers") == 2
        assert metric(text, "canary_sidecar_ready") == 1

        # both report samples, each under its own instance id
        async def all_samples(expected: int) -> bool:
            await samples.read()
            return samples.count >= expected

        await until(lambda: all_samples(100), "100 samples in Redis")
        assert samples.count == 100
        sources = {meta.source for meta in samples.metas}
        assert len(sources) == 2
        assert {"-w0-" in s for s in sources} == {True, False}  # one w0, one w1
        assert {meta.experiment for meta in samples.metas} == {str(EXPERIMENT)}
        for source in sources:  # each worker numbers its own batches from 1
            seqs = sorted(m.seq for m in samples.metas if m.source == source)
            assert seqs == list(range(1, len(seqs) + 1))

        # a killed worker is restarted; the sums never go back
        victim = sidecar.workers()[0]
        os.kill(victim, signal.SIGKILL)

        async def restarted() -> bool:
            text = await scrape()
            return total(text, "canary_sidecar_worker_restarts_total") == 1 and await ready()

        await until(restarted, "the killed worker restarted and ready")
        workers = sidecar.workers()
        assert len(workers) == 2 and victim not in workers
        assert total(await scrape(), "canary_sidecar_requests_total") == 100
        assert await send(sidecar.proxy_url, 50) == [200] * 50
        assert total(await scrape(), "canary_sidecar_requests_total") == 150
        await until(lambda: all_samples(150), "150 samples in Redis")
        before_stop = len(samples.metas)

        # SIGTERM: both workers stop accepting, finish what is in flight, flush
        base, canary = upstream_pair
        in_flight = asyncio.create_task(send(sidecar.proxy_url, SLOW, "/slow"))

        async def arrived() -> bool:
            slow = [r for u in upstream_pair for r in u.requests if r.target == "/slow"]
            return len(slow) == SLOW

        await until(arrived, "the slow requests at the upstreams")
        sidecar.proc.send_signal(signal.SIGTERM)

        async def closed() -> bool:  # refused only once neither worker listens
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", sidecar.port)
            except ConnectionRefusedError:
                return True
            writer.close()
            return False

        await until(closed, "both workers stopped accepting")
        assert not in_flight.done()
        base.release.set()
        canary.release.set()
        assert await in_flight == [200] * SLOW
        code = await asyncio.to_thread(sidecar.proc.wait, 30)
    output = sidecar.output()
    assert code == 0, output
    assert "Traceback" not in output, output
    assert output.count(f"sidecar for {SERVICE} stopping") == 2, output  # each one drained

    # the slow requests' samples were flushed by both workers as they stopped
    await samples.read()
    flushed = samples.metas[before_stop:]
    assert sum(meta.n for meta in flushed) == SLOW
    assert len({meta.source for meta in flushed}) == 2
    assert len({meta.source for meta in samples.metas}) == 3  # w0, its successor, w1
