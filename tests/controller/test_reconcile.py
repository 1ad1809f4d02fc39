"""A route written to etcd whose transaction then failed is repaired by the next round.

The pure part (`route_drift`) in a table; then, on both backend sets, a failure
injected after the etcd write of an API action and of a controller decision, and a
controller round that brings the route back in line with the row, once.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import pytest
from sqlalchemy.orm import Session

from controlplane.controller import reconcile
from controlplane.controller.reconcile import ROUTE_RECONCILED, RowRoute, route_drift
from controlplane.controller.runner import Controller
from controlplane.db import experiments as records
from controlplane.db.migrate import upgrade
from controlplane.db.models import Experiment
from controlplane.experiments.actions import apply_action, create_experiment
from controlplane.experiments.lifecycle import Action
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.errors import BackendError, BackendUnavailable
from controlplane.kernel.kv import Fence, Leadership
from controlplane.kernel.routes import Route, RouteState, parse_route
from controlplane.kernel.settings import Settings
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.runtime import Backends, open_backends
from tests.decision.factory import rule as make_rule
from tests.decision.factory import slow
from tests.support.routes import two_way_route

SERVICE = "checkout"
FIRST_STEP_BP = 500

# -------------------------------------------------------------- route_drift, pure


def stored(
    revision: int,
    *,
    experiment: int = 7,
    canary_bp: int = 2500,
    state: RouteState = RouteState.PAUSED,
) -> Route:
    return two_way_route(revision, experiment=experiment, canary_bp=canary_bp, state=state)


ROW = RowRoute(experiment=7, route_revision=4, canary_bp=500, state=RouteState.RUNNING)


@pytest.mark.parametrize(
    ("row", "route", "drifted"),
    [
        (ROW, stored(4), False),  # the row knows this revision: in line
        (ROW, stored(3), False),  # older than the row knows: no uncommitted write
        (ROW, None, False),  # nothing stored (or unreadable)
        (ROW, stored(5), True),  # a write whose transaction did not commit
        (ROW, stored(6, experiment=8), True),  # the active row owns its service's route
        (RowRoute(7, 0, 0, None), stored(5), False),  # a draft describes no route
    ],
)
def test_drift_only_when_the_stored_route_is_newer_than_the_row_knows(
    row: RowRoute, route: Route | None, drifted: bool
) -> None:
    drift = route_drift(row, route)
    assert (drift is not None) is drifted
    if drift is not None:
        assert drift.stored == route
        assert (drift.known_revision, drift.canary_bp, drift.state) == (
            row.route_revision,
            row.canary_bp,
            row.state,
        )


# -------------------------------------------------------------- against the backends


@dataclass
class Rig:
    backends: Backends
    clock: FakeClock
    controller: Controller
    fence: Fence
    experiment_id: int
    snapshots: dict[str, WindowSnapshot]

    async def route(self) -> Route:
        kv = await self.backends.kv.get(self.backends.keys.route(SERVICE))
        assert kv is not None
        return parse_route(kv.value)

    async def row(self) -> Experiment:
        def read(*, session: Session) -> Experiment:
            row = records.get_experiment(session=session, experiment_id=self.experiment_id)
            session.expunge(row)
            return row

        return await self.backends.database.read(read)

    async def events(self, kind: str) -> list[dict[str, Any]]:
        def read(*, session: Session) -> list[dict[str, Any]]:
            rows, _ = records.list_events(session=session, experiment_id=self.experiment_id)
            return [dict(e.payload) for e in rows if e.kind == kind]

        return await self.backends.database.read(read)

    async def act(self, action: Action) -> None:
        await apply_action(
            database=self.backends.database,
            kv=self.backends.kv,
            keys=self.backends.keys,
            clock=self.clock,
            experiment_id=self.experiment_id,
            action=action,
            actor="user:test",
        )

    async def round(self) -> None:
        self.clock.advance(1.0)
        await self.controller.evaluate_all(self.backends, self.fence)

    async def assert_in_line(self) -> Route:
        route, row = await self.route(), await self.row()
        assert route.revision == row.route_revision
        assert route.experiment == row.id
        assert route.weight_of("canary") == row.canary_weight_bp
        return route


def fail_once(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The event recorder raises once for `kind`: after the route write, before the commit."""
    original = records.record_event
    failed: list[str] = []

    def record_event(**kwargs: Any) -> Any:
        if kwargs["kind"] == kind and not failed:
            failed.append(kind)
            raise BackendUnavailable("injected: the database went away before the commit")
        return original(**kwargs)

    monkeypatch.setattr(records, "record_event", record_event)


@pytest.fixture
async def rig(backend_settings: Settings) -> AsyncIterator[Rig]:
    upgrade(backend_settings.database_url)
    clock = FakeClock()
    backends = await open_backends(backend_settings, clock=clock)
    spec = records.ExperimentSpec(
        name="checkout v2",
        service=SERVICE,
        baseline_upstream="http://127.0.0.1:9001",
        canary_upstream="http://127.0.0.1:9002",
        steps=(records.StepSpec(FIRST_STEP_BP, 60), records.StepSpec(2500, 60)),
        sticky_header="x-user-id",
        sticky_cookie=None,
        rule=make_rule(service=SERVICE, consecutive_breaches=1).model_dump(mode="json"),
    )
    experiment = await create_experiment(
        database=backends.database, clock=clock, spec=spec, actor="user:test"
    )
    snapshots: dict[str, WindowSnapshot] = {}

    async def reader(_b: Backends, _e: str, _w: int) -> Mapping[str, WindowSnapshot]:
        return snapshots

    controller = Controller(identity="test-controller", snapshot_reader=reader, fast_window=False)
    leadership: Leadership = backends.kv.leadership(backends.keys.election, identity="t", ttl=3600)
    fence = await leadership.campaign()
    rig = Rig(backends, clock, controller, fence, experiment.id, snapshots)
    await rig.act(Action.START)
    try:
        yield rig
    finally:
        await leadership.resign()
        await backends.close()


async def test_a_route_whose_api_action_did_not_commit_is_republished_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    committed = await rig.assert_in_line()
    fail_once(monkeypatch, "pause")
    with pytest.raises(BackendUnavailable):
        await rig.act(Action.PAUSE)

    orphan, row = await rig.route(), await rig.row()
    assert orphan.state is RouteState.PAUSED and orphan.revision == committed.revision + 1
    assert (row.state, row.route_revision) == ("running", committed.revision)

    await rig.round()
    route = await rig.assert_in_line()
    assert route.state is RouteState.RUNNING and route.revision > orphan.revision
    assert rig.controller.stats.routes_reconciled == 1
    [event] = await rig.events(ROUTE_RECONCILED)
    assert event["stored"] == {
        "experiment": rig.experiment_id,
        "revision": orphan.revision,
        "canary_weight_bp": FIRST_STEP_BP,
        "state": "paused",
    }
    assert event["restored"] == {
        "experiment": rig.experiment_id,
        "revision": route.revision,
        "canary_weight_bp": FIRST_STEP_BP,
        "state": "running",
    }
    assert event["row_route_revision"] == committed.revision
    assert event["leader_fence"]["revision"] == rig.fence.create_revision

    await rig.round()
    assert await rig.route() == route
    assert len(await rig.events(ROUTE_RECONCILED)) == 1
    assert rig.controller.stats.routes_reconciled == 1


async def test_a_promote_that_did_not_commit_leaves_no_promoted_route_behind(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final route of an experiment: the row stays active, so the controller sees it."""
    fail_once(monkeypatch, "promote")
    with pytest.raises(BackendUnavailable):
        await rig.act(Action.PROMOTE)
    orphan = await rig.route()
    assert (orphan.state, orphan.weight_of("canary")) == (RouteState.PROMOTED, 10_000)
    assert (await rig.row()).state == "running"

    await rig.round()
    route = await rig.assert_in_line()
    assert (route.state, route.weight_of("canary")) == (RouteState.RUNNING, FIRST_STEP_BP)
    [event] = await rig.events(ROUTE_RECONCILED)
    assert event["stored"]["canary_weight_bp"] == 10_000
    assert event["restored"]["canary_weight_bp"] == FIRST_STEP_BP


async def test_a_controller_decision_that_did_not_commit_is_republished_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    committed = await rig.assert_in_line()
    fail_once(monkeypatch, "tripped")
    rig.clock.advance(20.0)
    rig.snapshots.update(slow(rig.clock.now() + 1.0, bp=FIRST_STEP_BP))
    # a database error makes the leader step down; the route is out already
    with pytest.raises(BackendError):
        await rig.round()
    orphan, row = await rig.route(), await rig.row()
    assert (orphan.state, orphan.weight_of("canary")) == (RouteState.TRIPPED, 0)
    assert (row.breaker_state, row.canary_weight_bp) == ("closed", FIRST_STEP_BP)
    assert row.route_revision == committed.revision

    await rig.round()  # the next leader's round (here: the same one's)
    route = await rig.assert_in_line()
    assert (route.state, route.weight_of("canary")) == (RouteState.RUNNING, FIRST_STEP_BP)
    assert route.revision > orphan.revision
    assert len(await rig.events(ROUTE_RECONCILED)) == 1

    # the canary is still slow: this time the trip commits, and is no drift
    rig.snapshots.update(slow(rig.clock.now() + 1.0, bp=FIRST_STEP_BP))
    await rig.round()
    tripped = await rig.assert_in_line()
    assert (tripped.state, tripped.weight_of("canary")) == (RouteState.TRIPPED, 0)
    await rig.round()
    assert len(await rig.events(ROUTE_RECONCILED)) == 1
    assert len(await rig.events("tripped")) == 1


async def test_an_action_still_in_flight_is_not_taken_for_a_failed_one(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round sees the route of a pause that has not committed yet: it must wait.

    The pause is held after its etcd write, the round reads that route, and the pause
    is let go just before the round locks the row; the pause commits, the round backs off.
    """
    held, release = threading.Event(), threading.Event()
    original_record, original_lock = records.record_event, reconcile._lock_row

    def record_event(**kwargs: Any) -> Any:
        if kwargs["kind"] == "pause":
            held.set()
            release.wait(10)
        return original_record(**kwargs)

    def lock_row(**kwargs: Any) -> Experiment:
        release.set()
        return original_lock(**kwargs)

    monkeypatch.setattr(records, "record_event", record_event)
    monkeypatch.setattr(reconcile, "_lock_row", lock_row)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(rig.act, Action.PAUSE)
        await anyio.to_thread.run_sync(held.wait, 10)
        assert (await rig.route()).state is RouteState.PAUSED
        try:
            await rig.round()
        except BackendError:
            stepped_down = True  # the database answered "locked" rather than wait
        else:
            stepped_down = False
        release.set()

    paused = await rig.assert_in_line()
    assert paused.state is RouteState.PAUSED
    assert (await rig.row()).state == "paused"
    assert await rig.events(ROUTE_RECONCILED) == []
    assert rig.controller.stats.routes_reconciled == 0
    # the row lock made the round back off: a lost race, or a step-down on "locked"
    assert stepped_down or rig.controller.stats.conflicts == 1
