"""The leader's reconciler against real etcd and PostgreSQL (then SQLite and memory):
whatever happens to etcd or to a commit, one pass makes etcd hold the desired routes.

Faults: a decision whose commit fails (nothing reaches etcd); a wiped key or prefix, an
etcd restored from an old snapshot, a route written by hand (restored within one full
pass, each with a `route_reconciled` event); a leader gone between commit and publish
(the next leader publishes); a commit on another replica (LISTEN/NOTIFY wakes the
leader).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controlplane.controller.apply import apply_decision
from controlplane.controller.reconciler import (
    ROUTE_GETS_MAX,
    ROUTE_WRITES_AT_ONCE,
    RouteReconciler,
)
from controlplane.db import experiments as records
from controlplane.decision.model import (
    Decision,
    EventKind,
    RecordEvent,
    SetCanaryWeight,
)
from controlplane.experiments.lifecycle import BreakerState, LifecycleAction
from controlplane.experiments.rollout_state import rollout_state_of
from controlplane.kernel.errors import BackendUnavailable, NotLeader
from controlplane.kernel.routes import Route, RouteState
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.settings import Settings
from controlplane.runtime import open_backends
from tests.support.reconcile_rig import Rig
from tests.support.routes import two_way_route

SERVICE = "checkout"
RULE = BreakerRule(service=SERVICE, threshold_ms=200)


def trip(rig_state: Any, now: float) -> Decision:
    state = rig_state.with_changes(breaker=BreakerState.OPEN, canary_bp=0, trips=1,
                                   opened_at=now)
    return Decision(
        new_state=state,
        effects=(
            SetCanaryWeight(0, RouteState.TRIPPED),
            RecordEvent(EventKind.TRIPPED, "p99 over the threshold", {"from": "closed",
                                                                      "to": "open"}),
        ),
        reason="tripped", evidence={}, next_check_at=now + 20,
    )


async def decide_trip(rig: Rig, experiment_id: int) -> Route | None:
    async with rig.backends.store.transaction() as tx:
        row = await tx.load_experiment(experiment_id=experiment_id)
    decision = trip(rollout_state_of(row, rig.clock.now()), rig.clock.now())
    return await apply_decision(rig.backends, experiment_id=experiment_id, version=row.version,
                                decision=decision, rule=RULE, fence=rig.fence)


async def test_a_decision_reaches_etcd_from_the_wake_up_its_commit_sends(rig: Rig) -> None:
    eid = await rig.start()
    await rig.full_pass()
    started = await rig.stored()
    assert started is not None and started.weight_of("canary") == 1000
    await rig.backends.route_changes.wait(0)  # take the start's wake-up

    committed = await decide_trip(rig, eid)
    assert committed is not None
    assert await rig.stored() == started, "a decision writes SQL only"
    wake = await rig.backends.route_changes.wait(0)
    assert wake.services == {SERVICE}
    await rig.reconciler.reconcile(rig.backends, rig.fence, services=wake.services)
    assert await rig.stored() == committed == await rig.desired()
    assert committed.state is RouteState.TRIPPED and committed.revision == started.revision + 1
    assert await rig.events() == []  # the ordinary path is no repair


async def test_a_trip_committed_during_a_full_pass_is_written_before_the_pass_goes_on(
    rig: Rig,
) -> None:
    """A full pass takes seconds at a thousand services on a busy leader: a route
    committed meanwhile is written between its parts, not after the whole pass."""
    eid = await rig.start()
    await rig.full_pass()
    await rig.backends.route_changes.wait(0)  # take the start's wake-up
    reconciler = rig.reconciler
    windows = reconciler.reconcile_windows
    committed: list[Route | None] = []
    seen_by_configs: list[Route | None] = []

    async def trip_meanwhile(backends: Any, fence: Any) -> bool:
        if not committed:  # after the pass read the routes: the commit is news to it
            committed.append(await decide_trip(rig, eid))
        return await windows(backends, fence)

    kinds = reconciler.configs._reconcile_kind

    async def configs_look(backends: Any, fence: Any, kind: Any) -> bool:
        seen_by_configs.append(await rig.stored())
        return await kinds(backends, fence, kind)

    reconciler.reconcile_windows = trip_meanwhile  # type: ignore[method-assign]
    reconciler.configs._reconcile_kind = configs_look  # type: ignore[method-assign]
    ahead = reconciler.stats.routes_ahead_of_full_pass
    await rig.full_pass()
    assert committed[0] is not None and committed[0].weight_of("canary") == 0
    # the configs' part of the pass found the trip in etcd already
    assert seen_by_configs and all(route == committed[0] for route in seen_by_configs)
    assert reconciler.stats.routes_ahead_of_full_pass == ahead + 1
    # and the wake-up was taken: no second pass over it follows
    wake = await rig.backends.route_changes.wait(0)
    assert not wake.services


async def test_a_decision_whose_commit_fails_reaches_nothing(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    eid = await rig.start()
    await rig.full_pass()
    started = await rig.stored()
    record_event = records.record_event

    def fail_on_trip(**kwargs: Any) -> Any:
        if kwargs["kind"] == EventKind.TRIPPED.value:
            raise BackendUnavailable("injected: the database went away before the commit")
        return record_event(**kwargs)

    monkeypatch.setattr(records, "record_event", fail_on_trip)
    with pytest.raises(BackendUnavailable):
        await decide_trip(rig, eid)
    monkeypatch.setattr(records, "record_event", record_event)

    await rig.full_pass()
    assert await rig.stored() == started == await rig.desired()
    row = await rig.backends.database.read(records.get_experiment, experiment_id=eid)
    assert (row.breaker_state, row.route_revision) == ("closed", started.revision)


async def test_a_wiped_key_is_restored_with_an_event(rig: Rig) -> None:
    eid = await rig.start()
    await rig.full_pass()
    desired = await rig.stored()
    await rig.backends.kv.delete(rig.backends.keys.route(SERVICE))

    await rig.full_pass()
    assert await rig.stored() == desired
    [event] = await rig.events()
    assert (event["found"], event["stored"], event["experiment_id"]) == ("missing", None, eid)
    assert event["published"]["revision"] == desired.revision
    assert event["leader_fence"]["revision"] == rig.fence.create_revision
    assert rig.reconciler.stats.routes_reconciled == 1


async def test_a_wiped_prefix_is_restored_for_every_service_in_one_pass(rig: Rig) -> None:
    services = ["checkout", "cart", "search"]
    for service in services:
        await rig.start(service)
    await rig.full_pass()
    before = {s: await rig.stored(s) for s in services}
    for service in services:
        await rig.backends.kv.delete(rig.backends.keys.route(service))

    await rig.full_pass()
    assert {s: await rig.stored(s) for s in services} == before
    assert sorted(e["service"] for e in await rig.events()) == sorted(services)


async def test_a_pass_over_many_named_services_reads_their_routes_in_one_prefix_read(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a get per service is a turn of the event loop each, and a thousand experiments'
    # rounds judge one experiment between two turns: such a pass took half a minute
    # more than a pass reads one by one, and more than it writes at once
    services = [f"svc-{i:02d}" for i in range(max(ROUTE_GETS_MAX, ROUTE_WRITES_AT_ONCE) + 4)]
    for service in services:
        await rig.start(service)
    await rig.full_pass()
    before = {s: await rig.stored(s) for s in services}
    for service in services[2:]:
        await rig.backends.kv.delete(rig.backends.keys.route(service))
    kv = rig.backends.kv
    reads: list[str] = []
    real_get, real_prefix = kv.get, kv.get_prefix

    async def get(key: str) -> Any:
        reads.append("get")
        return await real_get(key)

    async def get_prefix(prefix: str) -> Any:
        reads.append("prefix")
        return await real_prefix(prefix)

    monkeypatch.setattr(kv, "get", get)
    monkeypatch.setattr(kv, "get_prefix", get_prefix)
    again = await rig.reconciler.reconcile(rig.backends, rig.fence, services=services,
                                           configs=False)
    monkeypatch.undo()
    assert not again
    assert "get" not in reads, reads  # the window rules' prefix read comes on top
    assert {s: await rig.stored(s) for s in services} == before
    assert sorted(e["service"] for e in await rig.events()) == sorted(services[2:])


async def test_an_etcd_restored_from_an_old_snapshot_gets_the_desired_routes_back(
    rig: Rig,
) -> None:
    eid = await rig.start()
    await rig.full_pass()
    snapshot = await rig.stored()
    assert snapshot is not None
    await rig.act(eid, LifecycleAction.PAUSE)
    await rig.act(eid, LifecycleAction.RESUME)
    await rig.full_pass()
    desired = await rig.stored()
    assert desired is not None and desired.revision == snapshot.revision + 2

    await rig.put(snapshot)  # the old revision written back, as a restore does
    await rig.full_pass()
    assert await rig.stored() == desired
    [event] = await rig.events()
    assert event["found"] == "older"
    assert event["stored"]["revision"] == snapshot.revision


@pytest.mark.parametrize(
    ("revision", "found"),
    [(lambda r: r + 40, "newer"), (lambda r: r, "foreign"), (lambda r: 2**31 - 1, "newer")],
    ids=["newer", "foreign", "pinned-at-the-largest-revision"],
)
async def test_a_route_written_by_hand_is_replaced_by_the_desired_one_in_one_pass(
    rig: Rig, revision: Any, found: str
) -> None:
    eid = await rig.start()
    await rig.full_pass()
    desired = await rig.stored()
    assert desired is not None
    foreign = two_way_route(revision(desired.revision), experiment="by-hand",
                            canary_bp=10_000, state=RouteState.RUNNING)
    await rig.put(foreign)

    await rig.full_pass()
    assert await rig.stored() == desired == await rig.desired(), "etcd moves, SQL does not"
    row = await rig.backends.database.read(records.get_experiment, experiment_id=eid)
    assert row.route_revision == desired.revision
    [event] = await rig.events()
    assert (event["found"], event["stored"]["experiment"]) == (found, "by-hand")
    await rig.full_pass()
    assert len(await rig.events()) == 1, "in sync afterwards"

    # the next commit still grows the desired revision by one, whatever etcd held
    await rig.act(eid, LifecycleAction.PAUSE)
    await rig.full_pass()
    paused = await rig.stored()
    assert paused is not None and paused.revision == desired.revision + 1


async def test_an_unreadable_route_is_replaced(rig: Rig) -> None:
    await rig.start()
    await rig.full_pass()
    desired = await rig.stored()
    await rig.backends.kv.put(rig.backends.keys.route(SERVICE), b"{not a route")
    await rig.full_pass()
    assert await rig.stored() == desired
    assert [e["found"] for e in await rig.events()] == ["unreadable"]


async def test_canary_traffic_on_a_service_the_database_does_not_know_is_stopped(
    rig: Rig,
) -> None:
    stray = two_way_route(3, experiment=99, canary_bp=2500, state=RouteState.RUNNING)
    await rig.put(stray, "stray")
    quiet = two_way_route(3, experiment=98, canary_bp=0, state=RouteState.ROLLED_BACK)
    await rig.put(quiet, "quiet")

    await rig.full_pass()
    neutral = await rig.stored("stray")
    assert neutral is not None and neutral.revision == 3
    assert (neutral.weight_of("baseline"), neutral.weight_of("canary")) == (10_000, 0)
    assert await rig.stored("quiet") == quiet, "a route sending the canary nothing stays"
    [event] = await rig.events()
    assert (event["service"], event["experiment_id"], event["found"]) == ("stray", None, "unowned")


async def test_the_next_leader_publishes_what_the_last_one_committed_but_never_wrote(
    rig: Rig,
) -> None:
    """The leader dies between the commit and the publish: the route is in SQL only."""
    eid = await rig.start()
    await rig.full_pass()
    await rig.act(eid, LifecycleAction.PROMOTE)  # committed; its leader is gone before writing
    old_fence = rig.fence
    leadership = rig.backends.kv.leadership(rig.backends.keys.election, identity="next",
                                            ttl=3600)
    old = rig.backends.kv.leadership(rig.backends.keys.election, identity="leader", ttl=3600)
    await old.resign()
    await rig.backends.kv.delete(old_fence.key)  # the dead leader's lease is gone
    rig.fence = await leadership.campaign()
    try:
        with pytest.raises(NotLeader):  # the deposed leader can no longer write
            await RouteReconciler().reconcile(rig.backends, old_fence)
        nxt = RouteReconciler()
        assert not await nxt.reconcile(rig.backends, rig.fence)
        promoted = await rig.stored()
        assert promoted is not None and promoted == await rig.desired()
        assert promoted.state == "promoted" and len(promoted.variants) == 1
        assert promoted.weight_of("baseline") == 10_000
        assert await rig.events() == []  # one commit behind: the ordinary path
    finally:
        await leadership.resign()


async def test_a_commit_on_another_replica_wakes_the_leader(
    rig: Rig, backend_settings: Settings
) -> None:
    if not backend_settings.database_url.startswith("postgresql"):
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite is polled")
    leader = RouteReconciler(full_pass_sec=3600)  # no full pass would find it
    running = asyncio.create_task(leader.run(rig.backends, rig.fence))
    other = await open_backends(backend_settings, clock=rig.clock, streams=False)
    try:
        async with asyncio.timeout(10):
            while leader.stats.reconcile_passes == 0:  # its first full pass is over
                await asyncio.sleep(0.01)
        replica = Rig(other, rig.clock, rig.fence, RouteReconciler())
        passes = leader.stats.reconcile_passes
        await replica.start()  # committed through the other Backends: no in-process signal
        # a pass is counted once it is over, which is after its write
        async with asyncio.timeout(10):
            while await rig.stored() is None or leader.stats.reconcile_passes == passes:
                await asyncio.sleep(0.02)
        assert await rig.stored() == await rig.desired()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await other.close()


async def test_on_sqlite_a_commit_elsewhere_is_found_by_a_poll_of_revisions(
    rig: Rig, backend_settings: Settings
) -> None:
    if not backend_settings.database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL announces commits (NOTIFY); SQLite is polled")
    leader = RouteReconciler(full_pass_sec=3600, poll_sec=0.01)  # no full pass would find it
    running = asyncio.create_task(leader.run(rig.backends, rig.fence))
    other = await open_backends(backend_settings, clock=rig.clock, streams=False)
    try:
        async with asyncio.timeout(10):
            while leader.stats.revision_polls < 5:
                await asyncio.sleep(0.01)
        assert leader.stats.reconcile_passes == 1, "polls that find nothing moved pass over nothing"
        replica = Rig(other, rig.clock, rig.fence, RouteReconciler())
        await replica.start()  # committed through the other Backends: no in-process signal
        # a pass is counted once it is over, which is after its write
        async with asyncio.timeout(10):
            while await rig.stored() is None or leader.stats.reconcile_passes < 2:
                await asyncio.sleep(0.01)
        assert await rig.stored() == await rig.desired()
        assert leader.stats.reconcile_passes == 2, "one pass, over the service that moved"
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await other.close()
