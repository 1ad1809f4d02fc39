"""The collector as a part of another process (`canary dev`, `canary demo`).

In the embedded mode the sample bus is in-process, so the collector must run in the
process that owns it, sharing the very same Backends as the API and controller.
It verifies sample batches with `sample_keys`: `canary dev` gives it a random key
generated in the process, so the embedded path runs signed like production.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from controlplane.collector.main import default_name
from controlplane.collector.pacing import COALESCE, PUBLISH_EVERY_SEC
from controlplane.collector.service import Collector
from controlplane.kernel.sample_keys import SampleKeys
from controlplane.kernel.tasks import cancel_and_wait
from controlplane.runtime import Backends

log = logging.getLogger("canary.collector")
# how long a stop waits for the round in progress to publish and ack what it holds
STOP_GRACE_SEC = 10.0


@dataclass
class EmbeddedCollector:
    """A BackgroundService (controlplane.runtime) running one Collector."""

    name: str = field(default_factory=default_name)
    tick: float = 0.1
    publish_every: float = PUBLISH_EVERY_SEC
    sample_keys: SampleKeys | None = None
    collector: Collector | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def start(self, backends: Backends) -> None:
        if backends.streams is None or backends.board is None:
            raise RuntimeError("the embedded collector needs the sample streams opened")
        self.collector = Collector(
            backends.streams,
            backends.board,
            backends.kv,
            backends.keys,
            consumer_name=self.name,
            clock=backends.clock,
            tick=self.tick,
            publish_every=self.publish_every,
            coalesce=COALESCE,
            sample_keys=self.sample_keys,
        )
        await self.collector.load_config()
        self._task = asyncio.create_task(self.collector.run(self._stop), name="collector")

    async def stop(self) -> None:
        """Stop reading, publish and acknowledge what is held."""
        self._stop.set()
        if self._task is not None:
            # a bounded wait, then a cancellation that is never waited on for ever
            # (wait_for would wait without end for a task that outlives its cancel)
            done, _ = await asyncio.wait({self._task}, timeout=STOP_GRACE_SEC)
            if done:
                with contextlib.suppress(asyncio.CancelledError):
                    self._task.result()
            else:
                log.warning("the collector did not stop within %.0f s: cancelled", STOP_GRACE_SEC)
                await cancel_and_wait(self._task)
