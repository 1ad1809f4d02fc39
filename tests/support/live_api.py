"""A real control plane on a real port for browser tests: uvicorn in a thread with the
controller and an embedded collector, and a sidecar stand-in that appends sample
batches to the real Redis stream at the wall clock's pace.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import uvicorn

from controlplane.api.app import create_app
from controlplane.collector.embedded import EmbeddedCollector
from controlplane.controller.runner import Controller
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.settings import Settings
from controlplane.kernel.streams_factory import open_streams
from controlplane.notify.dispatcher import dispatcher_for
from tests.support.processes import free_port, wait_port


@dataclass
class LiveApi:
    """The API at `base` until stopped."""

    settings: Settings
    port: int = field(default_factory=free_port)
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        app = create_app(
            self.settings,
            # what `canary dev` runs: collector, controller, notification dispatcher
            services=[
                EmbeddedCollector(tick=0.1),
                Controller(identity=f"ui-{self.port}"),
                dispatcher_for(self.settings),
            ],
            streams=True,
        )
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="live-api", daemon=True)
        self._thread.start()
        wait_port(self.port, timeout=30)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=20)


@contextlib.contextmanager
def live_api(settings: Settings) -> Iterator[LiveApi]:
    api = LiveApi(settings)
    api.start()
    try:
        yield api
    finally:
        api.stop()


@dataclass
class Traffic:
    """Per service: the experiment, each variant's median response time (ms) and its
    share of the requests (the first step's weights, so no sample ratio mismatch)."""

    experiment: int
    median_ms: dict[str, float]
    share: dict[str, float] = field(default_factory=lambda: {"baseline": 0.9, "canary": 0.1})
    failure_rate: float = 0.0


@dataclass
class SampleFeeder:
    """Appends one batch per service every `period` seconds, stamped with the wall
    clock, as a sidecar in front of `rate` requests per second would."""

    settings: Settings
    traffic: dict[str, Traffic] = field(default_factory=dict)
    period: float = 0.2
    rate: int = 200
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    batches: int = 0

    def start(self) -> None:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run()), name="sample-feeder", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    async def _run(self) -> None:
        streams, board = open_streams(
            self.settings.redis_url, namespace=self.settings.redis_namespace, clock=SystemClock()
        )
        rng = np.random.default_rng(5)
        source = f"feeder-{uuid.uuid4().hex[:6]}"
        seq = 0
        try:
            while not self._stop.is_set():
                now = time.time()
                for service, load in list(self.traffic.items()):
                    builder = BatchBuilder()
                    for variant, median in load.median_ms.items():
                        n = max(1, round(self.rate * self.period * load.share[variant]))
                        rts = rng.lognormal(np.log(median), 0.2, n)
                        failed = rng.random(n) < load.failure_rate
                        for i in range(n):
                            builder.add(
                                now - self.period + i * self.period / n,
                                variant,
                                int(rts[i] * 1000),
                                503 if failed[i] else 200,
                            )
                    seq += 1
                    meta = BatchMeta(str(load.experiment), source, seq, len(builder))
                    await streams.append(
                        service, [entry_fields(meta, builder.encode())], maxlen=100_000
                    )
                    self.batches += 1
                await asyncio.sleep(self.period)
        finally:
            await streams.close()
            if board is not streams:  # type: ignore[comparison-overlap]
                await board.close()
