"""A leader's reconciler over backends a test opens itself: real etcd and PostgreSQL,
then SQLite and the in-process store (the `rig` fixture of tests/controller)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controlplane.controller.reconciler import ROUTE_RECONCILED, RouteReconciler
from controlplane.db import experiments as records
from controlplane.db import routes as desired_routes
from controlplane.experiments.actions import apply_action, create_experiment
from controlplane.experiments.lifecycle import LifecycleAction
from controlplane.experiments.store import ExperimentSpec, StepSpec
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.kv import Fence
from controlplane.kernel.routes import Route, parse_route
from controlplane.runtime import Backends

SERVICE = "checkout"


@dataclass
class Rig:
    backends: Backends
    clock: FakeClock
    fence: Fence
    reconciler: RouteReconciler

    async def start(self, service: str = SERVICE) -> int:
        spec = ExperimentSpec(
            name=f"{service} v2", service=service,
            baseline_upstream="http://127.0.0.1:9001", canary_upstream="http://127.0.0.1:9002",
            steps=(StepSpec(1000, 30), StepSpec(10000, 30)),
            sticky_header="x-user-id", sticky_cookie=None, rule=None,
        )
        experiment = await create_experiment(
            store=self.backends.store, clock=self.clock, spec=spec, actor="user:test"
        )
        await self.act(experiment.id, LifecycleAction.START)
        return experiment.id

    async def act(self, experiment_id: int, action: LifecycleAction) -> None:
        await apply_action(
            store=self.backends.store, changes=self.backends.route_changes,
            clock=self.clock, experiment_id=experiment_id, action=action, actor="user:test",
        )

    async def full_pass(self) -> None:
        assert not await self.reconciler.reconcile(self.backends, self.fence)

    async def stored(self, service: str = SERVICE) -> Route | None:
        value = await self.backends.kv.get(self.backends.keys.route(service))
        return parse_route(value.value) if value is not None else None

    async def put(self, route: Route, service: str = SERVICE) -> None:
        await self.backends.kv.put(self.backends.keys.route(service), route.to_json().encode())

    async def desired(self, service: str = SERVICE) -> Route | None:
        return await self.backends.database.read(desired_routes.desired_route, service=service)

    async def events(self, kind: str = ROUTE_RECONCILED) -> list[dict[str, Any]]:
        def read(*, session: Any) -> list[dict[str, Any]]:
            rows, _ = records.list_events(session=session, limit=1000)
            return [
                {"experiment_id": e.experiment_id, "service": e.service, "actor": e.actor,
                 "reason": e.reason, **e.payload}
                for e in rows if e.kind == kind
            ]

        return await self.backends.database.read(read)
