"""An experiment's own rule reaches the collectors: the leader's reconciler publishes
its window rule (`windows/<experiment>`) from SQL, the collector prefers it to the
service's rule for that experiment. PostgreSQL + etcd, then SQLite + the in-memory KV.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from controlplane.collector.service import Collector
from controlplane.collector.sharding import read_merged_snapshots
from controlplane.controller.reconciler import RouteReconciler
from controlplane.db.migrate import upgrade
from controlplane.experiments.actions import apply_action, create_experiment
from controlplane.experiments.lifecycle import LifecycleAction
from controlplane.experiments.store import ExperimentSpec, StepSpec
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.kv import Fence
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.settings import Settings
from controlplane.kernel.streams import SampleStream
from controlplane.kernel.streams_factory import open_streams
from controlplane.kernel.window_rules import WindowRule, parse_window_rule
from controlplane.runtime import Backends, open_backends

WAIT = 15.0  # an upper bound so a broken watch fails the test; no speed claim
OWN_RULE = {"threshold_ms": 250, "window_sec": 30, "failure_statuses": [503]}


def service_rule(service: str) -> bytes:
    return json.dumps({"service": service, "threshold_ms": 500, "window_sec": 10}).encode()


@dataclass
class Rig:
    backends: Backends
    clock: FakeClock
    fence: Fence
    reconciler: RouteReconciler
    collector: Collector
    streams: SampleStream

    async def start(self, service: str, rule: dict[str, object] | None) -> int:
        await self.backends.kv.put(self.backends.keys.rule(service), service_rule(service))
        spec = ExperimentSpec(
            name=f"{service} v2", service=service,
            baseline_upstream="http://127.0.0.1:9001", canary_upstream="http://127.0.0.1:9002",
            steps=(StepSpec(1000, 30),), sticky_header="x-user-id", sticky_cookie=None,
            rule=rule,
        )  # fmt: skip
        experiment = await create_experiment(
            store=self.backends.store, clock=self.clock, spec=spec, actor="user:test"
        )
        await self.act(experiment.id, LifecycleAction.START)
        return experiment.id

    async def act(self, experiment_id: int, action: LifecycleAction) -> None:
        await apply_action(
            store=self.backends.store, changes=self.backends.route_changes,
            clock=self.clock, experiment_id=experiment_id, action=action, actor="user:test",
        )  # fmt: skip

    async def full_pass(self) -> None:
        assert not await self.reconciler.reconcile(self.backends, self.fence)

    async def stored(self, experiment: int | str) -> bytes | None:
        value = await self.backends.kv.get(self.backends.keys.window(experiment))
        return value.value if value is not None else None

    async def send(self, service: str, experiment: int, seq: int,
                   samples: list[tuple[float, int, int]]) -> None:  # fmt: skip
        """(seconds ago, response time in ms, status) per sample, all on the canary."""
        builder = BatchBuilder()
        for ago, rt_ms, status in samples:
            builder.add(self.clock.now() - ago, "canary", rt_ms * 1000, status)
        meta = BatchMeta(str(experiment), f"sidecar-{service}", seq, len(builder))
        await self.streams.append(service, [entry_fields(meta, builder.encode())], maxlen=100)


@pytest.fixture
async def rig(backend_settings: Settings) -> AsyncIterator[Rig]:
    upgrade(backend_settings.database_url)
    clock = FakeClock()
    backends = await open_backends(backend_settings, clock=clock, streams=False)
    leadership = backends.kv.leadership(backends.keys.election, identity="leader", ttl=3600)
    fence = await leadership.campaign()
    streams, board = open_streams("memory://", clock=clock)
    collector = Collector(streams, board, backends.kv, backends.keys, consumer_name="c1",
                          clock=clock, block_ms=0)  # fmt: skip
    try:
        yield Rig(backends, clock, fence, RouteReconciler(), collector, streams)
    finally:
        await collector.stop_watching()
        await streams.close()
        await leadership.resign()
        await backends.close()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll what the collector's watch (real store I/O, not a clock) has applied."""
    async with asyncio.timeout(WAIT):
        while not condition():
            await asyncio.sleep(0.02)


async def test_the_experiments_own_rule_sizes_windows_thresholds_and_failures(rig: Rig) -> None:
    own = await rig.start("checkout", OWN_RULE)
    plain = await rig.start("search", None)
    await rig.full_pass()
    stored = await rig.stored(own)
    assert stored is not None
    assert parse_window_rule(stored) == WindowRule(
        window_sec=30, threshold_ms=250, failure_statuses=[503]
    )
    assert await rig.stored(plain) is None, "no rule of its own: the service's applies"

    await rig.collector.load_config()
    for service, experiment in (("checkout", own), ("search", plain)):
        # 20 s old: inside a 30 s window, outside a 10 s one
        await rig.send(service, experiment, 1, [(20, 300, 503), (20, 300, 503)])
        await rig.send(service, experiment, 2, [(0, 300, 500), (0, 100, 200), (0, 260, 200)])
    for _ in range(3):
        await rig.collector.step()
        rig.clock.advance(0.2)
    await rig.collector.step()

    [snap] = (await read_merged_snapshots(rig.streams, str(own), rig.clock.now())).values()
    assert (snap.window_sec, snap.threshold_ms, snap.threshold_exact) == (30, 250, True)
    assert snap.count == 5
    assert snap.above_threshold == 4  # 300, 300, 300, 260 ms over 250 ms, counted exactly
    assert snap.failures == 2  # 503 only: the 500 is no failure under the experiment's rule

    [other] = (await read_merged_snapshots(rig.streams, str(plain), rig.clock.now())).values()
    assert (other.window_sec, other.threshold_ms, other.threshold_exact) == (10, 500, True)
    assert other.count == 3  # the 20 s old samples are outside the service's 10 s window
    assert other.above_threshold == 0
    assert other.failures == 1  # 5xx


async def test_a_malformed_window_rule_is_counted_and_the_service_rule_used(rig: Rig) -> None:
    own = await rig.start("checkout", OWN_RULE)
    await rig.collector.load_config()
    kv, keys = rig.backends.kv, rig.backends.keys
    await kv.put(keys.window(own), b"{not json")
    await kv.put(
        keys.window("77"),
        json.dumps({"window_sec": "30", "threshold_ms": 250, "failure_statuses": "5xx"}).encode(),
    )
    await kv.put(keys.window("78"), json.dumps({**OWN_RULE, "percentile": 99}).encode())
    await until(lambda: rig.collector.metrics.config_rejected._value.get() == 3, "3 rejections")
    assert rig.collector.experiment_configs == {}
    await rig.send("checkout", own, 1, [(0, 300, 503)])
    await rig.collector.step()
    assert rig.collector.windows[str(own)].config.window_sec == 10  # the service's rule

    await rig.full_pass()  # the leader repairs the live experiment's key, drops the others
    assert parse_window_rule(await rig.stored(own) or b"").window_sec == 30
    assert await rig.stored("77") is None and await rig.stored("78") is None
    await until(lambda: str(own) in rig.collector.experiment_configs, "the repaired rule")
    assert rig.collector.windows[str(own)].config.window_sec == 30
    assert rig.collector.windows[str(own)].config.threshold_ms == 250


async def test_the_window_rule_goes_when_the_experiment_ends(rig: Rig) -> None:
    own = await rig.start("checkout", OWN_RULE)
    await rig.full_pass()
    await rig.collector.load_config()
    await until(lambda: str(own) in rig.collector.experiment_configs, "the window rule")

    await rig.act(own, LifecycleAction.ROLLBACK)
    await rig.full_pass()
    assert await rig.stored(own) is None
    assert rig.reconciler.stats.window_rules_deleted == 1
    await until(lambda: str(own) not in rig.collector.experiment_configs, "the rule gone")
    await rig.full_pass()
    assert rig.reconciler.stats.window_rules_deleted == 1, "nothing left to delete"


def test_grpc_codes_travel_only_when_chosen() -> None:
    """A collector that predates grpc_failure_codes still reads the rules not using it."""
    plain = WindowRule.of(BreakerRule(service="checkout", threshold_ms=250))
    assert "grpc_failure_codes" not in json.loads(plain.to_json())
    assert parse_window_rule(plain.to_json()) == plain
    chosen = WindowRule.of(
        BreakerRule(service="checkout", threshold_ms=250, grpc_failure_codes=[14, 4, 14])
    )
    assert json.loads(chosen.to_json())["grpc_failure_codes"] == [4, 14]
    assert parse_window_rule(chosen.to_json()) == chosen
    with pytest.raises(ValidationFailed):
        parse_window_rule(json.dumps({**OWN_RULE, "grpc_failure_codes": [17]}))
