"""Keeps the proxy's overload protection in step with `<prefix>/overload/<service>`.

Through the shared list-then-watch loop, like routes: a valid value is put in force at
once (a guard made, or the one in force reconfigured); an invalid one is refused,
counted and logged, and the value in force stays; a deleted key or `enabled: false`
turns protection off, and whatever waits in a queue goes on. The probe of the
service's own signal (`probe.py`), when it has one, runs while protection is on.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.informer import PrefixInformer
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.overload import parse_overload
from controlplane.kernel.tasks import cancel_and_wait
from sidecar.overload.guard import OverloadGuard
from sidecar.overload.probe import ExternalProbe
from sidecar.overload.signals import ExternalReading
from sidecar.proxy.server import ProxyServer

log = logging.getLogger("canary.sidecar.overload")


@dataclass
class OverloadWatchStats:
    applied: int = 0
    rejected: int = 0
    disabled: int = 0


class OverloadWatcher:
    def __init__(
        self, kv: KeyValueStore, proxy: ProxyServer, *, service: str, prefix: str = "/canary"
    ) -> None:
        self.proxy = proxy
        self.service = service
        keys = EtcdKeys(prefix)
        self.key = keys.overload(service)
        self.stats = OverloadWatchStats()
        # the running probe of the external signal, with the reading it feeds
        self._probe: tuple[ExternalReading, asyncio.Task[None]] | None = None
        self.informer = PrefixInformer(
            kv,
            self.key,
            self,
            name=f"overload-watcher:{service}",
            accept=lambda key: key == self.key,
        )

    def start(self) -> None:
        self.informer.start()

    async def stop(self) -> None:
        await self.informer.stop()
        probe, self._probe = self._probe, None
        if probe is not None:
            # the probe lives inside an HTTP client's timeouts: a lost cancellation
            # must not hold the sidecar's stop (and its samples' flush) for ever
            await cancel_and_wait(probe[1])

    def on_put(self, key: str, value: bytes, mod_revision: int) -> None:
        self.apply_value(value)

    def on_delete(self, key: str) -> None:
        self.apply_value(None)

    def apply_value(self, value: bytes | None) -> bool:
        """Apply one value of the key (None: deleted); True when put in force."""
        if value is None:
            self._disable()
            return True
        try:
            config = parse_overload(value)
        except ValidationFailed as exc:
            self.stats.rejected += 1
            log.warning(
                "overload config for %s rejected, the one in force kept: %s", self.service, exc
            )
            return False
        self.stats.applied += 1
        if not config.enabled:
            self._disable()
            return True
        proxy = self.proxy
        guard = proxy.overload
        if guard is None:
            guard = proxy.overload = OverloadGuard(
                config,
                monotonic=proxy.clock.monotonic,
                call_later=lambda delay, callback: proxy.loop.call_later(delay, callback),
            )
        else:
            guard.configure(config)
        self._probe_for(guard)
        log.info("overload protection for %s in force: %s", self.service, config.model_dump_json())
        return True

    def _probe_for(self, guard: OverloadGuard) -> None:
        """The probe of the guard's external signal runs, restarted when the signal's
        config (and so its reading) changed; none when it has none."""
        reading, signal = guard.external, guard.config.signals.external
        if self._probe is not None and self._probe[0] is reading:
            return
        self._stop_probe()
        if reading is None or signal is None:
            return
        probe = ExternalProbe(signal, reading, monotonic=self.proxy.clock.monotonic)
        if probe.kind == "nvml":
            log.info("overload signal of %s: GPU %d memory through NVML", self.service, signal.gpu)
        self._probe = (reading, asyncio.get_running_loop().create_task(probe.run()))

    def _stop_probe(self) -> None:
        if self._probe is not None:
            self._probe[1].cancel()
            self._probe = None

    def _disable(self) -> None:
        self._stop_probe()
        guard = self.proxy.overload
        if guard is None:
            return
        self.proxy.overload = None
        self.stats.disabled += 1
        guard.release_all()
        log.info("overload protection for %s off", self.service)
