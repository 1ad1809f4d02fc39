"""A proxy between two real upstreams, with a fixed chooser and a recording list.

The chooser and recorder implement the sidecar's own `Chooser` / `Recorder`
protocols in the simplest way: the variant comes from the `x-test-variant` header.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx

from sidecar.choice import Choice, NoRoute, Upstream
from sidecar.proxy import ProxyOptions, ProxyServer
from sidecar.proxy.tracing import RequestTracing
from tests.sidecar import upstreams

EXPERIMENT = "exp-1"


@dataclass
class Sample:
    ts: float
    experiment: str | None
    variant: str
    rt_us: int
    outcome: int
    unit_hash: int
    first_byte_us: int


class HeaderChooser:
    """baseline unless `x-test-variant` names another; NoRoute when `routes` is empty."""

    def __init__(self, routes: dict[str, str]) -> None:
        self.routes = {name: Upstream.parse(url) for name, url in routes.items()}
        self.seen: list[Mapping[str, str]] = []

    def choose(self, headers: Mapping[str, str]) -> Choice:
        self.seen.append(dict(headers))
        if not self.routes:
            raise NoRoute("no route for service 'svc' and no default upstream")
        variant = headers.get("x-test-variant", "baseline")
        unit = headers.get("x-user-id")
        return Choice(
            experiment=EXPERIMENT,
            variant=variant,
            upstream=self.routes[variant],
            unit_hash=zlib.crc32(unit.encode()) if unit else 0,
        )


@dataclass
class ListRecorder:
    samples: list[Sample] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def record(
        self,
        ts: float,
        experiment: str | None,
        variant: str,
        rt_us: int,
        outcome: int,
        unit_hash: int,
        first_byte_us: int | None = None,
    ) -> None:
        first = rt_us if first_byte_us is None else first_byte_us
        self.samples.append(Sample(ts, experiment, variant, rt_us, outcome, unit_hash, first))
        self.changed.set()

    def record_many(
        self, samples: Sequence[tuple[float, str | None, str, int, int, int, int]]
    ) -> None:
        self.samples.extend(Sample(*sample) for sample in samples)
        self.changed.set()

    async def wait_for(self, count: int) -> list[Sample]:
        async with asyncio.timeout(10):
            while len(self.samples) < count:
                self.changed.clear()
                await self.changed.wait()
        return self.samples


@asynccontextmanager
async def proxy_to(url: str) -> AsyncIterator[ProxyServer]:
    """A proxy whose every request goes to the upstream at `url`."""
    proxy = ProxyServer(
        HeaderChooser({"baseline": url}), ListRecorder(), options=ProxyOptions(read_timeout=5)
    )
    await proxy.start("127.0.0.1", 0)
    try:
        yield proxy
    finally:
        await proxy.stop(timeout=2)


@dataclass
class Harness:
    baseline: upstreams.Upstream
    canary: upstreams.Upstream
    chooser: HeaderChooser
    recorder: ListRecorder
    proxy: ProxyServer
    client: httpx.AsyncClient

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"


@asynccontextmanager
async def harness(
    *,
    options: ProxyOptions | None = None,
    routes: dict[str, str] | None = None,
    client_timeout: float = 30.0,
    tracing: RequestTracing | None = None,
    http2: bool = False,
) -> AsyncIterator[Harness]:
    baseline = upstreams.Upstream("baseline")
    canary = upstreams.Upstream("canary")
    await baseline.start()
    await canary.start()
    if routes is None:
        routes = {"baseline": baseline.url, "canary": canary.url}
    chooser = HeaderChooser(routes)
    recorder = ListRecorder()
    proxy = ProxyServer(
        chooser, recorder, options=options or ProxyOptions(read_timeout=10), tracing=tracing
    )
    await proxy.start("127.0.0.1", 0)
    client = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{proxy.port}",
        timeout=client_timeout,
        http1=not http2,
        http2=http2,
    )
    try:
        yield Harness(baseline, canary, chooser, recorder, proxy, client)
    finally:
        await client.aclose()
        await proxy.stop(timeout=2)
        await baseline.stop()
        await canary.stop()
