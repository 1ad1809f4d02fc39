"""A start whose transaction failed after its etcd write leaves no canary traffic behind.

The draft stays a draft and no experiment of the service is active, so only the
leader's look at the services without one can find the route. On both backend sets:
a failure injected after the start's route write, a controller round that puts the
route back to what the database says (the last finished experiment's route, else the
baseline only), once; and a start still in flight that the round leaves alone.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy.orm import Session

from controlplane.controller import orphans
from controlplane.controller.reconcile import ROUTE_RECONCILED
from controlplane.controller.runner import Controller
from controlplane.db import experiments as records
from controlplane.db.migrate import upgrade
from controlplane.db.models import Experiment
from controlplane.experiments.actions import apply_action, create_experiment, delete_experiment
from controlplane.experiments.lifecycle import Action
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.errors import BackendError, BackendUnavailable, NotLeader
from controlplane.kernel.kv import Fence, Leadership
from controlplane.kernel.routes import Route, RouteState, parse_route
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends, open_backends
from tests.controller.test_reconcile import fail_once
from tests.decision.factory import rule as make_rule

SERVICE = "checkout"
FIRST_STEP_BP = 500
BASELINE_URL = "http://127.0.0.1:9001"


@dataclass
class Rig:
    backends: Backends
    clock: FakeClock
    controller: Controller
    leadership: Leadership
    fence: Fence

    async def create(self, canary: str = "http://127.0.0.1:9002") -> int:
        spec = records.ExperimentSpec(
            name="checkout next",
            service=SERVICE,
            baseline_upstream=BASELINE_URL,
            canary_upstream=canary,
            steps=(records.StepSpec(FIRST_STEP_BP, 60), records.StepSpec(2500, 60)),
            sticky_header="x-user-id",
            sticky_cookie=None,
            rule=make_rule(service=SERVICE).model_dump(mode="json"),
        )
        experiment = await create_experiment(
            database=self.backends.database, clock=self.clock, spec=spec, actor="user:test"
        )
        return experiment.id

    async def act(self, experiment_id: int, action: Action) -> None:
        await apply_action(
            database=self.backends.database,
            kv=self.backends.kv,
            keys=self.backends.keys,
            clock=self.clock,
            experiment_id=experiment_id,
            action=action,
            actor="user:test",
        )

    async def failed_start(self, monkeypatch: pytest.MonkeyPatch, experiment_id: int) -> Route:
        """Start the draft with the commit failing after the route write; the orphan."""
        before = await self.stored()
        fail_once(monkeypatch, "start")
        with pytest.raises(BackendUnavailable):
            await self.act(experiment_id, Action.START)
        orphan = await self.route()
        assert orphan.experiment == experiment_id
        assert (orphan.state, orphan.weight_of("canary")) == (RouteState.RUNNING, FIRST_STEP_BP)
        assert before is None or orphan.revision == before.revision + 1
        row = await self.row(experiment_id)
        assert (row.state, row.canary_weight_bp, row.route_revision) == ("draft", 0, 0)
        return orphan

    async def stored(self) -> Route | None:
        kv = await self.backends.kv.get(self.backends.keys.route(SERVICE))
        return None if kv is None else parse_route(kv.value)

    async def route(self) -> Route:
        route = await self.stored()
        assert route is not None
        return route

    async def row(self, experiment_id: int) -> Experiment:
        def read(*, session: Session) -> Experiment:
            row = records.get_experiment(session=session, experiment_id=experiment_id)
            session.expunge(row)
            return row

        return await self.backends.database.read(read)

    async def events(self, kind: str, experiment_id: int | None = None) -> list[dict[str, Any]]:
        """Payloads of `kind` on the experiment, or on the service with no experiment."""

        def read(*, session: Session) -> list[dict[str, Any]]:
            rows, _ = records.list_events(session=session, service=SERVICE, limit=1000)
            return [
                dict(e.payload) | {"_reason": e.reason, "_actor": e.actor}
                for e in rows
                if e.kind == kind and e.experiment_id == experiment_id
            ]

        return await self.backends.database.read(read)

    async def all_reconciled(self) -> int:
        def read(*, session: Session) -> int:
            rows, _ = records.list_events(session=session, service=SERVICE, limit=1000)
            return sum(1 for e in rows if e.kind == ROUTE_RECONCILED)

        return await self.backends.database.read(read)

    async def round(self) -> None:
        self.clock.advance(1.0)
        await self.controller.evaluate_all(self.backends, self.fence)


@pytest.fixture
async def rig(backend_settings: Settings) -> AsyncIterator[Rig]:
    upgrade(backend_settings.database_url)
    clock = FakeClock()
    backends = await open_backends(backend_settings, clock=clock)
    controller = Controller(identity="test-controller", fast_window=False)
    leadership = backends.kv.leadership(backends.keys.election, identity="t", ttl=3600)
    fence = await leadership.campaign()
    try:
        yield Rig(backends, clock, controller, leadership, fence)
    finally:
        await leadership.resign()
        await backends.close()


async def test_a_failed_start_with_no_route_before_leaves_a_baseline_only_route_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = await rig.create()
    orphan = await rig.failed_start(monkeypatch, draft)

    await rig.round()
    route = await rig.route()
    assert route.experiment == draft and route.revision > orphan.revision
    assert (route.state, route.weight_of("canary")) == (RouteState.ROLLED_BACK, 0)
    assert route.weight_of("baseline") == 10_000
    assert {v.name: v.upstream for v in route.variants}["baseline"] == BASELINE_URL
    row = await rig.row(draft)
    assert (row.state, row.route_revision) == ("draft", route.revision)
    assert rig.controller.stats.routes_reconciled == 1
    [event] = await rig.events(ROUTE_RECONCILED, draft)
    assert event["_actor"] == "controller"
    assert event["stored"] == {
        "experiment": draft,
        "revision": orphan.revision,
        "canary_weight_bp": FIRST_STEP_BP,
        "state": "running",
    }
    assert event["restored"] == {
        "experiment": draft,
        "revision": route.revision,
        "canary_weight_bp": 0,
        "state": "rolled_back",
        "from": "baseline_only",
    }
    assert event["named_row"] == {"service": SERVICE, "state": "draft", "route_revision": 0}
    assert event["leader_fence"]["revision"] == rig.fence.create_revision
    assert "start never committed" in event["_reason"]

    await rig.round()
    assert await rig.route() == route
    assert await rig.all_reconciled() == 1
    assert rig.controller.stats.routes_reconciled == 1

    # the draft starts for real later: its route follows the restored one, in line
    await rig.act(draft, Action.START)
    started = await rig.route()
    assert started.revision == route.revision + 1
    assert (started.state, started.weight_of("canary")) == (RouteState.RUNNING, FIRST_STEP_BP)
    await rig.round()
    assert await rig.route() == started
    assert await rig.all_reconciled() == 1


@pytest.mark.parametrize(
    ("ending", "canary_bp", "route_state"),
    [
        (Action.PROMOTE, 10_000, RouteState.PROMOTED),
        (Action.ROLLBACK, 0, RouteState.ROLLED_BACK),
        (Action.ABORT, 0, RouteState.ROLLED_BACK),
    ],
)
async def test_a_failed_start_after_a_finished_experiment_restores_that_route_once(
    rig: Rig,
    monkeypatch: pytest.MonkeyPatch,
    ending: Action,
    canary_bp: int,
    route_state: RouteState,
) -> None:
    finished = await rig.create(canary="http://127.0.0.1:9002")
    await rig.act(finished, Action.START)
    await rig.act(finished, ending)
    committed = await rig.route()
    assert (committed.experiment, committed.weight_of("canary")) == (finished, canary_bp)

    draft = await rig.create(canary="http://127.0.0.1:9003")
    orphan = await rig.failed_start(monkeypatch, draft)

    await rig.round()
    route = await rig.route()
    assert route.revision > orphan.revision
    assert route.model_dump(exclude={"revision"}) == committed.model_dump(exclude={"revision"})
    assert (await rig.row(finished)).route_revision == route.revision
    assert (await rig.row(draft)).route_revision == 0
    [event] = await rig.events(ROUTE_RECONCILED, draft)
    assert event["stored"]["revision"] == orphan.revision
    assert event["restored"] == {
        "experiment": finished,
        "revision": route.revision,
        "canary_weight_bp": canary_bp,
        "state": route_state.value,
        "from": "finished_experiment",
    }
    assert await rig.events(ROUTE_RECONCILED, finished) == []

    await rig.round()
    assert await rig.route() == route
    assert await rig.all_reconciled() == 1
    assert rig.controller.stats.routes_reconciled == 1


async def test_a_draft_deleted_after_its_failed_start_leaves_a_baseline_only_route(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = await rig.create()
    orphan = await rig.failed_start(monkeypatch, draft)
    await delete_experiment(
        database=rig.backends.database, clock=rig.clock, experiment_id=draft, actor="user:test"
    )

    await rig.round()
    route = await rig.route()
    assert route.experiment == draft and route.revision > orphan.revision
    assert (route.state, route.weight_of("canary")) == (RouteState.ROLLED_BACK, 0)
    assert {v.name: v.upstream for v in route.variants}["baseline"] == BASELINE_URL
    [event] = await rig.events(ROUTE_RECONCILED)  # on the service: the row is gone
    assert event["named_row"] is None
    assert event["restored"]["from"] == "baseline_only"

    await rig.round()
    assert await rig.route() == route
    assert await rig.all_reconciled() == 1


async def test_a_deposed_leader_does_not_restore_the_route(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = await rig.create()
    orphan = await rig.failed_start(monkeypatch, draft)
    await rig.leadership.resign()

    with pytest.raises(NotLeader):
        await rig.round()
    assert await rig.route() == orphan
    assert await rig.all_reconciled() == 0
    assert (await rig.row(draft)).route_revision == 0


async def test_a_start_still_in_flight_is_not_undone(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round sees the route of a start that has not committed yet: it must wait.

    The start is held after its etcd write, the round reads that route, and the start
    is let go just before the round locks the draft; the start commits, the round
    backs off.
    """
    draft = await rig.create()
    held, release = threading.Event(), threading.Event()
    locked: list[int] = []
    original_record, original_lock = records.record_event, orphans._lock

    def record_event(**kwargs: Any) -> Any:
        if kwargs["kind"] == "start":
            held.set()
            release.wait(10)
        return original_record(**kwargs)

    def lock(**kwargs: Any) -> Any:
        locked.append(kwargs["orphan"].stored.revision)
        release.set()
        return original_lock(**kwargs)

    monkeypatch.setattr(records, "record_event", record_event)
    monkeypatch.setattr(orphans, "_lock", lock)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(rig.act, draft, Action.START)
        await anyio.to_thread.run_sync(held.wait, 10)
        in_flight = await rig.route()
        assert (in_flight.experiment, in_flight.state) == (draft, RouteState.RUNNING)
        assert (await rig.row(draft)).state == "draft"  # not committed yet
        try:
            await rig.round()
        except BackendError:
            stepped_down = True  # the database answered "locked" rather than wait
        else:
            stepped_down = False
        release.set()

    route = await rig.route()
    assert route == in_flight
    assert locked == [in_flight.revision]  # the round took it for an orphan, then waited
    row = await rig.row(draft)
    assert (row.state, row.route_revision) == ("running", route.revision)
    assert await rig.all_reconciled() == 0
    assert rig.controller.stats.routes_reconciled == 0
    # the row lock made the round back off: a lost race, or a step-down on "locked"
    assert stepped_down or rig.controller.stats.conflicts == 1
