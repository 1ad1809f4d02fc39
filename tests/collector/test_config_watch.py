"""The collector's view of rules and routes after a watch lost for longer than etcd's history.

This is the case the collector used to get wrong: it read the prefixes again but
never dropped keys deleted meanwhile, so a deleted rule kept its window settings
and a deleted route kept its service listed. Against an etcd of its own and the
in-process store (tests/support/outage.py); the sample streams are not involved.
"""

from __future__ import annotations

import asyncio
import json

from controlplane.collector.service import Collector
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_etcd import EtcdKV
from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants
from controlplane.kernel.streams_factory import open_streams
from tests.support.outage import Outage, until
from tests.support.processes import free_port

WAIT = 15.0  # an upper bound so a broken watch fails the test; no speed claim


def rule(service: str, window_sec: int) -> bytes:
    return json.dumps({"service": service, "threshold_ms": 100, "window_sec": window_sec}).encode()


def route(experiment: int) -> bytes:
    return Route(
        experiment=experiment,
        revision=1,
        salt="s",
        sticky=Sticky(header="x-user-id"),
        variants=two_way_variants("http://127.0.0.1:9001", "http://127.0.0.1:9002", 500),
        state=RouteState.RUNNING,
    ).to_json().encode()






async def test_rules_and_routes_deleted_while_the_watch_was_lost_leave_the_view(
    outage: Outage, etcd_prefix: str
) -> None:
    keys = EtcdKeys(etcd_prefix)
    for service, window in (("kept", 30), ("gone", 45), ("retuned", 60)):
        await outage.writer.put(keys.rule(service), rule(service, window))
    await outage.writer.put(keys.route("kept"), route(1))
    await outage.writer.put(keys.route("gone"), route(2))
    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    collector = Collector(streams, board, outage.consumer_kv, keys, consumer_name="c1",
                          clock=clock, block_ms=0)  # fmt: skip
    try:
        async with asyncio.timeout(WAIT):
            await collector.load_config()
        assert set(collector.configs) == {"kept", "gone", "retuned"}
        assert collector.route_services == {"kept", "gone"}
        assert collector.config_for("gone").window_sec == 45

        async def change(kv: KeyValueStore) -> None:
            await kv.delete(keys.rule("gone"))
            await kv.delete(keys.route("gone"))
            await kv.put(keys.rule("retuned"), rule("retuned", 90))

        await outage.while_away(change)
        await until(lambda: "gone" not in collector.configs, "the deleted rule to go")
        await until(lambda: "gone" not in collector.route_services, "the deleted route to go")
        await until(lambda: collector.config_for("retuned").window_sec == 90, "the new window")
        assert set(collector.configs) == {"kept", "retuned"}
        assert collector.services == {"kept", "retuned"}
        # the deleted service's windows fall back to the default settings
        assert collector.config_for("gone") == collector.default_config
        registry = collector.metrics.registry
        for source in ("rules", "routes"):
            relists = registry.get_sample_value(
                "canary_collector_config_relists_total", {"source": source}
            )
            assert relists is not None and relists >= 1
            errors = registry.get_sample_value(
                "canary_collector_config_watch_errors_total", {"source": source}
            )
            assert errors is not None and errors >= 1
    finally:
        await collector.stop_watching()
        await streams.close()


async def test_a_stop_ends_the_collector_while_etcd_has_not_answered_yet() -> None:
    kv = EtcdKV(f"127.0.0.1:{free_port()}")  # nothing listens there
    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    collector = Collector(streams, board, kv, EtcdKeys("/t"), consumer_name="c1", clock=clock,
                          block_ms=0)  # fmt: skip
    stop = asyncio.Event()
    running = asyncio.create_task(collector.run(stop))
    try:
        async with asyncio.timeout(WAIT):
            while not any(i.stats.watch_errors for i in collector.informers):
                await asyncio.sleep(0.02)  # polls the failed reads of etcd, not a clock
        assert not collector.config_loaded.is_set()
        stop.set()
        async with asyncio.timeout(WAIT):
            await running
        assert collector.informers == []
    finally:
        running.cancel()
        await streams.close()
        await kv.close()
