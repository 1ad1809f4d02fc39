"""A canary whose gRPC calls fail is tripped end to end, by the codes its rule names.

Real grpcio servers behind a real sidecar (proxy, route watcher, sample reporter), a
collector and a controller on the real services (then the embedded ones). Time is one
FakeClock for the sidecar's samples, the windows and the decisions, so a simulated
second passes without sleeping; the calls themselves are real.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from controlplane.collector.service import Collector
from controlplane.controller.runner import Controller
from controlplane.db.experiments import list_events
from controlplane.db.migrate import upgrade
from controlplane.experiments.actions import apply_action, create_experiment
from controlplane.experiments.lifecycle import LifecycleAction
from controlplane.experiments.store import ExperimentSpec, StepSpec
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.kv import Fence
from controlplane.kernel.routes import Route, parse_route
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends, open_backends
from sidecar.main import Sidecar
from tests.sidecar.grpc_upstream import GrpcUpstream, echo

SERVICE = "orders"
CALLS_PER_SECOND = 100
UNAVAILABLE, NOT_FOUND = 14, 5

RULE = BreakerRule(
    service=SERVICE,
    threshold_ms=5000,
    window_sec=5,
    min_samples=50,
    failure_ratio=0.2,
    cooldown_sec=60,
    consecutive_breaches=2,
    max_trips=2,
    grpc_failure_codes=[UNAVAILABLE],  # NOT_FOUND is an answer, not an outage
)


@dataclass
class Stack:
    backends: Backends
    clock: FakeClock
    collector: Collector
    controller: Controller
    fence: Fence
    sidecar: Sidecar
    baseline: GrpcUpstream
    canary: GrpcUpstream
    experiment_id: int
    user: int = 0

    async def second(self, channel: grpc.aio.Channel) -> dict[str, int]:
        """One simulated second: calls from new users, collected, one controller round,
        the route it leaves in force in the sidecar. Returns the failed calls by code."""
        self.clock.advance(1.0)
        failed: dict[str, int] = {}
        for _ in range(CALLS_PER_SECOND):
            self.user += 1
            try:
                await echo(channel)(
                    b"order", metadata=(("x-user-id", f"u{self.user}"),), timeout=10
                )
            except grpc.aio.AioRpcError as exc:
                failed[exc.code().name] = failed.get(exc.code().name, 0) + 1
        self.sidecar.proxy.flush_samples()
        assert await self.sidecar.reporter.flush()
        for _ in range(3):
            await self.collector.step()
        await self.collector.publish_due()
        await self.controller.evaluate_all(self.backends, self.fence)
        await self.controller.reconciler.reconcile(self.backends, self.fence)
        stored = await self.route()
        assert await self.sidecar.watcher.wait_for(
            lambda route: route is not None and route.revision == stored.revision, 10
        ), "the sidecar did not take the route in etcd"
        return failed

    async def route(self) -> Route:
        kv = await self.backends.kv.get(self.backends.keys.route(SERVICE))
        assert kv is not None
        return parse_route(kv.value)

    async def events(self) -> list[tuple[str, dict[str, object]]]:
        def read(*, session):  # type: ignore[no-untyped-def]
            rows, _ = list_events(session=session, experiment_id=self.experiment_id)
            return [(e.kind, e.payload) for e in rows]

        return await self.backends.database.read(read)  # type: ignore[no-any-return]


@pytest.fixture
async def stack(backend_settings: Settings) -> AsyncIterator[Stack]:
    upgrade(backend_settings.database_url)
    clock = FakeClock()
    backends = await open_backends(backend_settings, clock=clock)
    assert backends.streams is not None and backends.board is not None
    baseline, canary = GrpcUpstream("baseline"), GrpcUpstream("canary")
    await baseline.start()
    await canary.start()
    await backends.kv.put(backends.keys.rule(SERVICE), RULE.to_json().encode())
    spec = ExperimentSpec(
        name="orders v2 over gRPC", service=SERVICE,
        baseline_upstream=baseline.url, canary_upstream=canary.url,
        steps=(StepSpec(5000, 600),), sticky_header="x-user-id", sticky_cookie=None, rule=None,
    )  # fmt: skip
    experiment = await create_experiment(
        store=backends.store, clock=clock, spec=spec, actor="user:test"
    )
    await apply_action(
        store=backends.store, changes=backends.route_changes, clock=clock,
        experiment_id=experiment.id, action=LifecycleAction.START, actor="user:test",
    )  # fmt: skip
    collector = Collector(
        backends.streams, backends.board, backends.kv, backends.keys,
        consumer_name=f"c-{uuid.uuid4().hex[:6]}", clock=clock, block_ms=20,
    )  # fmt: skip
    await collector.load_config()
    controller = Controller(identity="test-controller")
    await controller.reconciler.reconcile(backends, None)
    await controller.open(backends)
    assert controller._rulebook is not None
    await asyncio.wait_for(controller._rulebook.loaded.wait(), 10)
    leadership = backends.kv.leadership(backends.keys.election, identity="t", ttl=3600)
    fence = await leadership.campaign()
    sidecar = Sidecar(
        service=SERVICE, kv=backends.kv, stream=backends.streams,
        etcd_prefix=backend_settings.etcd_prefix, clock=clock,
    )  # fmt: skip
    await sidecar.start(("127.0.0.1", 0))
    try:
        yield Stack(
            backends, clock, collector, controller, fence, sidecar, baseline, canary,
            experiment.id,
        )  # fmt: skip
    finally:
        await sidecar.stop()
        await leadership.resign()
        await controller.stop()
        await collector.flush()
        await collector.stop_watching()
        await baseline.stop()
        await canary.stop()
        await backends.close()


async def test_a_canary_failing_with_a_rule_code_is_tripped_and_cut(stack: Stack) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.sidecar.proxy.port}") as channel:
        # NOT_FOUND is not among the rule's codes: many such calls trip nothing
        stack.canary.fail_code = NOT_FOUND
        for _ in range(4):
            failed = await stack.second(channel)
            assert 0 < failed.get("NOT_FOUND", 0) < CALLS_PER_SECOND, failed
        route = await stack.route()
        assert (route.weight_of("canary"), route.state.value) == (5000, "running")

        stack.canary.fail_code = UNAVAILABLE
        for _ in range(10):
            await stack.second(channel)
            if (await stack.route()).weight_of("canary") == 0:
                break
        route = await stack.route()
        assert (route.weight_of("canary"), route.state.value) == (0, "tripped")

        # the sidecar took the cut: every call goes to the baseline, and succeeds
        canary_calls = stack.canary.calls
        assert await stack.second(channel) == {}
        assert stack.canary.calls == canary_calls

    tripped = [payload for kind, payload in await stack.events() if kind == "tripped"]
    assert len(tripped) == 1
    text = repr(tripped[0]["evidence"])
    assert "failure" in text, text[:400]
