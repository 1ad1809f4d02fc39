"""Overload config hot-reloaded from the store (real etcd, and the in-process store)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_factory import open_kv
from sidecar.overload.metrics import OverloadMetricsCollector
from sidecar.overload.watcher import OverloadWatcher
from sidecar.proxy import ProxyServer
from tests.sidecar.proxy_harness import HeaderChooser, ListRecorder

SERVICE = "checkout"


@pytest.fixture(params=["etcd", "memory"])
async def kv(request: pytest.FixtureRequest, etcd_endpoint: str) -> AsyncIterator[KeyValueStore]:
    store = open_kv(etcd_endpoint if request.param == "etcd" else "memory://")
    yield store
    await store.close()


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.01)


async def test_config_is_applied_kept_when_invalid_and_removed_on_delete(
    kv: KeyValueStore, etcd_prefix: str
) -> None:
    proxy = ProxyServer(HeaderChooser({}), ListRecorder())
    watcher = OverloadWatcher(kv, proxy, service=SERVICE, prefix=etcd_prefix)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OverloadMetricsCollector(watcher))
    key = EtcdKeys(etcd_prefix).overload(SERVICE)
    watcher.start()
    try:
        assert proxy.overload is None  # off by default
        await kv.put(key, b'{"queue_timeout_ms": 25}')
        await until(lambda: proxy.overload is not None)
        guard = proxy.overload
        assert guard is not None and guard.config.queue_timeout_ms == 25

        await kv.put(key, b'{"queue_timeout_ms": -5}')
        await until(lambda: watcher.stats.rejected == 1)
        assert proxy.overload is guard and guard.config.queue_timeout_ms == 25

        await kv.put(key, b'{"queue_timeout_ms": 40}')
        await until(lambda: guard.config.queue_timeout_ms == 40)
        assert proxy.overload is guard

        text = generate_latest(registry).decode()
        assert "canary_sidecar_overload_enabled 1.0" in text
        assert "canary_sidecar_overload_configs_rejected_total 1.0" in text

        await kv.put(key, b'{"enabled": false}')
        await until(lambda: proxy.overload is None)
        await kv.put(key, b"{}")
        await until(lambda: proxy.overload is not None)
        await kv.delete(key)
        await until(lambda: proxy.overload is None)
        assert "canary_sidecar_overload_enabled 0.0" in generate_latest(registry).decode()
    finally:
        await watcher.stop()


async def test_the_service_signal_is_probed_while_protection_is_on(
    kv: KeyValueStore, etcd_prefix: str, tmp_path: Path
) -> None:
    signal = tmp_path / "gpu-memory"
    signal.write_text("0.97\n")
    proxy = ProxyServer(HeaderChooser({}), ListRecorder())
    watcher = OverloadWatcher(kv, proxy, service=SERVICE, prefix=etcd_prefix)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OverloadMetricsCollector(watcher))
    key = EtcdKeys(etcd_prefix).overload(SERVICE)
    external = {"source": f"file:{signal}", "light": 0.8, "heavy": 0.9, "severe": 0.95,
                "interval_ms": 50, "timeout_ms": 50}  # fmt: skip
    watcher.start()
    try:
        await kv.put(key, json.dumps({"signals": {"external": external}}).encode())
        await until(lambda: proxy.overload is not None and proxy.overload.external is not None)
        guard = proxy.overload
        assert guard is not None and guard.external is not None
        first = guard.external
        await until(lambda: first.value == 0.97)
        state = guard.state()["external"]
        assert (state["level"], state["fresh"], state["value"]) == ("severe", True, 0.97)
        text = generate_latest(registry).decode()
        assert "canary_sidecar_overload_signal_level 3.0" in text

        signal.write_text("not a number")
        await until(lambda: first.failures.get("not_a_number", 0) >= 1)
        assert 'canary_sidecar_overload_signal_failures_total{reason="not_a_number"}' in (
            generate_latest(registry).decode()
        )
        # another signal config: a new reading, probed anew; the old probe stops
        signal.write_text("0.5")
        await kv.put(key, json.dumps({"signals": {"external": external | {"light": 0.4}}}).encode())
        await until(lambda: guard.external is not first)
        second = guard.external
        assert second is not None
        await until(lambda: second.value == 0.5)
        assert second.level_at(guard.monotonic()).name == "LIGHT"
        reads = first.reads + sum(first.failures.values())
        await asyncio.sleep(0.2)
        assert first.reads + sum(first.failures.values()) == reads

        await kv.put(key, b"{}")  # no signal: no probe, no reading
        await until(lambda: guard.external is None)
        reads = second.reads
        await asyncio.sleep(0.2)
        assert second.reads == reads
    finally:
        await watcher.stop()
