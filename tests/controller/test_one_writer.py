"""One writer for every kind of key: routes, window rules, breaker rules and overload
protection are committed to SQL, and the leader's reconciler makes etcd hold them.
Against real etcd and PostgreSQL, then SQLite and the in-process store.

Whatever a hand with etcd write access does to a key (delete it, write garbage or
another JSON shape, write another value, pin the largest route revision), one pass
puts the desired value back, and a sidecar's route watcher follows. A commit that
fails leaves etcd untouched. The configs etcd held before SQL kept them are imported
once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from controlplane.api.live import route_applied
from controlplane.controller.configs import CONFIG_IMPORTED, RECONCILED
from controlplane.controller.reconciler import RouteReconciler
from controlplane.db import experiments as records
from controlplane.db import service_configs as desired_configs
from controlplane.experiments.actions import create_experiment
from controlplane.experiments.lifecycle import LifecycleAction
from controlplane.experiments.service_configs import remove_config, write_config
from controlplane.experiments.store import ExperimentSpec, StepSpec
from controlplane.kernel.errors import BackendUnavailable, Conflict
from controlplane.kernel.overload import OverloadConfig
from controlplane.kernel.routes import Route, RouteState, parse_route
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.service_configs import ConfigKind, ServiceConfig, config_bytes
from controlplane.kernel.settings import Settings
from controlplane.kernel.tasks import cancel_and_wait
from controlplane.kernel.window_rules import WindowRule, parse_window_rule
from controlplane.runtime import Backends, open_backends
from sidecar.routing import RouteTable, RouteWatcher
from tests.support.reconcile_rig import Rig
from tests.support.routes import two_way_route

SERVICE = "checkout"
RULE = BreakerRule(service=SERVICE, threshold_ms=200)
OVERLOAD = OverloadConfig(max_limit=300, queue_timeout_ms=40)
OWN_RULE = {"threshold_ms": 450, "window_sec": 30, "failure_statuses": [500, 503]}
MAX_REVISION = 2**31 - 1


async def commit(rig: Rig, kind: ConfigKind, config: ServiceConfig,
                 service: str = SERVICE) -> None:
    await write_config(store=rig.backends.store, changes=rig.backends.route_changes,
                       clock=rig.clock, kind=kind, service=service, config=config,
                       actor="user:test")


async def start_with_own_rule(rig: Rig) -> int:
    spec = ExperimentSpec(
        name="checkout v2", service=SERVICE,
        baseline_upstream="http://127.0.0.1:9001", canary_upstream="http://127.0.0.1:9002",
        steps=(StepSpec(1000, 30), StepSpec(10000, 30)),
        sticky_header="x-user-id", sticky_cookie=None, rule={**OWN_RULE, "service": SERVICE},
    )
    experiment = await create_experiment(store=rig.backends.store, clock=rig.clock, spec=spec,
                                         actor="user:test")
    await rig.act(experiment.id, LifecycleAction.START)
    return experiment.id


async def all_events(rig: Rig) -> list[Any]:
    rows, _ = await rig.backends.database.read(records.list_events, limit=1000)
    return list(rows)


# ------------------------------------------------------------ every kind of key


class Kind:
    """One kind of key: how to make its desired value, read it back, and which value
    a hand writer would use to claim it (pinned or foreign)."""

    name: str

    async def arrange(self, rig: Rig) -> str:
        """Commit the desired value; the key that is to hold it."""
        raise NotImplementedError

    def read(self, raw: bytes) -> Any:
        raise NotImplementedError

    def claim(self, desired: Any) -> bytes:
        raise NotImplementedError


class RouteKind(Kind):
    name = "route"

    async def arrange(self, rig: Rig) -> str:
        await rig.start()
        return rig.backends.keys.route(SERVICE)

    def read(self, raw: bytes) -> Route:
        return parse_route(raw)

    def claim(self, desired: Route) -> bytes:
        # all traffic to the canary, at the largest revision a route may carry
        return two_way_route(MAX_REVISION, experiment=desired.experiment, canary_bp=10_000,
                             state=RouteState.RUNNING).to_json().encode()


class WindowKind(Kind):
    name = "window rule"

    async def arrange(self, rig: Rig) -> str:
        experiment_id = await start_with_own_rule(rig)
        return rig.backends.keys.window(experiment_id)

    def read(self, raw: bytes) -> WindowRule:
        return parse_window_rule(raw)

    def claim(self, desired: WindowRule) -> bytes:
        return desired.model_copy(update={"threshold_ms": 60_000.0}).to_json().encode()


class RuleKind(Kind):
    name = "breaker rule"

    async def arrange(self, rig: Rig) -> str:
        await commit(rig, ConfigKind.RULE, RULE)
        return rig.backends.keys.rule(SERVICE)

    def read(self, raw: bytes) -> BreakerRule:
        return BreakerRule.model_validate_json(raw)

    def claim(self, desired: BreakerRule) -> bytes:
        return desired.model_copy(update={"threshold_ms": 100_000.0, "min_samples": 10**6}
                                  ).to_json().encode()


class OverloadKind(Kind):
    name = "overload protection"

    async def arrange(self, rig: Rig) -> str:
        await commit(rig, ConfigKind.OVERLOAD, OVERLOAD)
        return rig.backends.keys.overload(SERVICE)

    def read(self, raw: bytes) -> OverloadConfig:
        return OverloadConfig.model_validate_json(raw)

    def claim(self, desired: OverloadConfig) -> bytes:
        return desired.model_copy(update={"enabled": False}).model_dump_json().encode()


KINDS = [RouteKind(), WindowKind(), RuleKind(), OverloadKind()]


async def delete(rig: Rig, key: str, kind: Kind, desired: Any) -> None:
    await rig.backends.kv.delete(key)


async def garbage(rig: Rig, key: str, kind: Kind, desired: Any) -> None:
    await rig.backends.kv.put(key, b"\xff\xfe\x00 not json at all")


async def wrong_shape(rig: Rig, key: str, kind: Kind, desired: Any) -> None:
    await rig.backends.kv.put(key, json.dumps([{"threshold_ms": 1}, "revision", 2**31]).encode())


async def claim(rig: Rig, key: str, kind: Kind, desired: Any) -> None:
    await rig.backends.kv.put(key, kind.claim(desired))


Fault = Callable[[Rig, str, Kind, Any], Awaitable[None]]
FAULTS: list[Fault] = [delete, garbage, wrong_shape, claim]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.__name__ for f in FAULTS])
@pytest.mark.parametrize("kind", KINDS, ids=[k.name.replace(" ", "-") for k in KINDS])
async def test_one_pass_puts_back_the_desired_value_whatever_a_hand_did_to_the_key(
    rig: Rig, kind: Kind, fault: Fault
) -> None:
    key = await kind.arrange(rig)
    await rig.full_pass()
    published = await rig.backends.kv.get(key)
    assert published is not None
    desired = kind.read(published.value)
    events_before = len(await all_events(rig))

    await fault(rig, key, kind, desired)
    after = await rig.backends.kv.get(key)
    assert after is None or after.value != published.value

    await rig.full_pass()  # one pass, driven here rather than waited for
    restored = await rig.backends.kv.get(key)
    assert restored is not None and kind.read(restored.value) == desired
    if not isinstance(kind, WindowKind):  # window rules are derived; no trail of their own
        assert len(await all_events(rig)) == events_before + 1, "the repair is recorded"
    await rig.full_pass()
    unchanged = await rig.backends.kv.get(key)
    assert unchanged is not None and unchanged.mod_revision == restored.mod_revision


async def test_a_committed_config_is_published_as_the_ordinary_path_without_a_repair(
    rig: Rig,
) -> None:
    await rig.full_pass()
    await commit(rig, ConfigKind.RULE, RULE)
    await commit(rig, ConfigKind.OVERLOAD, OVERLOAD)
    await rig.full_pass()
    for kind, config in ((ConfigKind.RULE, RULE), (ConfigKind.OVERLOAD, OVERLOAD)):
        stored = await rig.backends.kv.get(kind.key(rig.backends.keys, SERVICE))
        assert stored is not None and stored.value == config_bytes(kind, SERVICE, config)
    await remove_config(store=rig.backends.store, changes=rig.backends.route_changes,
                        clock=rig.clock, kind=ConfigKind.OVERLOAD, service=SERVICE,
                        actor="user:test")
    await rig.full_pass()
    assert await rig.backends.kv.get(rig.backends.keys.overload(SERVICE)) is None
    kinds = [e.kind for e in await all_events(rig)]
    assert kinds == ["rule_changed", "overload_changed", "overload_changed"]


async def test_a_config_written_by_hand_for_a_service_sql_has_none_for_is_removed(
    rig: Rig,
) -> None:
    await rig.full_pass()  # the import is over: nothing was in etcd
    key = rig.backends.keys.rule("stray")
    await rig.backends.kv.put(key, BreakerRule(service="stray", threshold_ms=5).to_json().encode())
    await rig.full_pass()
    assert await rig.backends.kv.get(key) is None
    [event] = await all_events(rig)
    assert (event.kind, event.service, event.payload["found"]) == (
        RECONCILED[ConfigKind.RULE], "stray", "unowned")
    assert event.payload["leader_fence"]["revision"] == rig.fence.create_revision


# ------------------------------------------------------------ failed commits


@pytest.mark.parametrize("kind", [ConfigKind.RULE, ConfigKind.OVERLOAD])
async def test_a_config_whose_commit_fails_reaches_neither_sql_nor_etcd(
    rig: Rig, kind: ConfigKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    config: ServiceConfig = RULE if kind is ConfigKind.RULE else OVERLOAD
    await commit(rig, kind, config)
    await rig.full_pass()
    key = kind.key(rig.backends.keys, SERVICE)
    before = await rig.backends.kv.get(key)
    events_before = await all_events(rig)
    record_event = records.record_event

    def fail_on_change(**kwargs: Any) -> Any:
        if kwargs["kind"].endswith("_changed"):
            raise BackendUnavailable("injected: the database went away before the commit")
        return record_event(**kwargs)

    monkeypatch.setattr(records, "record_event", fail_on_change)
    changed: ServiceConfig = (
        RULE.model_copy(update={"threshold_ms": 900.0}) if kind is ConfigKind.RULE
        else OVERLOAD.model_copy(update={"max_limit": 5})
    )
    with pytest.raises(BackendUnavailable):
        await commit(rig, kind, changed)
    monkeypatch.setattr(records, "record_event", record_event)

    after = await rig.backends.kv.get(key)
    assert after is not None and before is not None
    assert (after.value, after.mod_revision) == (before.value, before.mod_revision)
    assert [e.id for e in await all_events(rig)] == [e.id for e in events_before]
    desired = await rig.backends.database.read(desired_configs.desired_config, kind=kind,
                                               service=SERVICE)
    assert desired == config
    await rig.full_pass()
    assert (await rig.backends.kv.get(key)) == after


# ------------------------------------------------------------ the one import


async def test_the_configs_etcd_held_are_imported_once_and_malformed_ones_skipped(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    keys, kv = rig.backends.keys, rig.backends.kv
    held_rule = BreakerRule(service="cart", threshold_ms=350)
    await kv.put(keys.rule("cart"), held_rule.to_json().encode())
    await kv.put(keys.overload("cart"), OVERLOAD.model_dump_json().encode())
    await kv.put(keys.rule("search"), b"{not json")
    await kv.put(keys.overload("search"), json.dumps({"max_limit": -1}).encode())
    await kv.put(keys.rule("other"), BreakerRule(service="cart", threshold_ms=1).to_json().encode())
    await commit(rig, ConfigKind.RULE, RULE)  # SQL's own: never replaced by etcd's
    await kv.put(keys.rule(SERVICE), RULE.model_copy(update={"threshold_ms": 1.0}
                                                     ).to_json().encode())

    await rig.full_pass()
    read = rig.backends.database.read
    assert await read(desired_configs.desired_config, kind=ConfigKind.RULE,
                      service="cart") == held_rule
    assert await read(desired_configs.desired_config, kind=ConfigKind.OVERLOAD,
                      service="cart") == OVERLOAD
    assert await read(desired_configs.desired_config, kind=ConfigKind.RULE,
                      service=SERVICE) == RULE
    imported = [(e.service, e.payload["kind"]) for e in await all_events(rig)
                if e.kind == CONFIG_IMPORTED]
    assert sorted(imported) == [("cart", "overload"), ("cart", "rule")]
    assert rig.reconciler.stats.config_imports_skipped == 3
    assert sum("malformed; skipped" in r.getMessage() for r in caplog.records) == 3
    # what was skipped is removed, and etcd holds what SQL says
    for key in (keys.rule("search"), keys.overload("search"), keys.rule("other")):
        assert await kv.get(key) is None
    stored = await kv.get(keys.rule(SERVICE))
    assert stored is not None and BreakerRule.model_validate_json(stored.value) == RULE
    assert await kv.get(keys.rule("cart")) is not None

    # a second run (a new leader, a restart) changes nothing: not even a hand's key
    # written since is adopted
    events = await all_events(rig)
    await kv.put(keys.rule("late"), BreakerRule(service="late", threshold_ms=9).to_json().encode())
    again = RouteReconciler()
    assert not await again.reconcile(rig.backends, rig.fence)
    assert await read(desired_configs.desired_config, kind=ConfigKind.RULE,
                      service="late") is None
    assert await kv.get(keys.rule("late")) is None
    assert [e.kind for e in (await all_events(rig))[len(events):]] == [
        RECONCILED[ConfigKind.RULE]]


async def test_nothing_is_removed_before_the_import_is_recorded(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = rig.backends.keys.overload("cart")
    await rig.backends.kv.put(key, OVERLOAD.model_dump_json().encode())

    def fail(**kwargs: Any) -> Any:
        raise BackendUnavailable("injected: the import's commit fails")

    monkeypatch.setattr(desired_configs, "import_configs", fail)
    with pytest.raises(BackendUnavailable):
        await rig.reconciler.reconcile(rig.backends, rig.fence)
    monkeypatch.undo()
    assert await rig.backends.kv.get(key) is not None
    await rig.full_pass()
    assert await rig.backends.kv.get(key) is not None, "imported on the next pass"


# ------------------------------------------------------------ a pinned route


async def test_a_sidecar_follows_the_repair_of_a_route_pinned_at_the_largest_revision(
    rig: Rig,
) -> None:
    eid = await rig.start()
    await rig.full_pass()
    desired = await rig.stored()
    assert desired is not None
    table = RouteTable()
    watcher = RouteWatcher(rig.backends.kv, table, service=SERVICE,
                           prefix=rig.backends.keys.prefix)
    watcher.start()
    try:
        assert await watcher.wait_for(lambda route: route == desired, 5.0)
        pinned = two_way_route(MAX_REVISION, experiment=eid, canary_bp=10_000,
                               state=RouteState.RUNNING)
        await rig.put(pinned)
        assert await watcher.wait_for(lambda route: route == pinned, 5.0)
        experiment = await load(rig.backends, eid)
        assert await route_applied(rig.backends, experiment) == (
            False, "etcd holds another route than the desired one (published within one pass)")

        # the operator rolls back; the leader's next pass supersedes the pinned route
        await rig.act(eid, LifecycleAction.ROLLBACK)
        await rig.full_pass()
        rolled_back = await rig.desired()
        assert rolled_back is not None and rolled_back.revision == desired.revision + 1
        assert await rig.stored() == rolled_back
        assert await watcher.wait_for(lambda route: route == rolled_back, 5.0)
        assert table.choose({"x-user-id": "alice"}).variant == "baseline"
        assert await route_applied(rig.backends, await load(rig.backends, eid)) == (True, None)
        assert watcher.stats.rejected == 0
    finally:
        await watcher.stop()


async def load(backends: Backends, experiment_id: int) -> Any:
    async with backends.store.transaction() as tx:
        return await tx.load_experiment(experiment_id=experiment_id)


async def test_a_route_pinned_at_the_largest_revision_never_stops_the_reconciler(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    eid = await rig.start()
    await rig.full_pass()
    for _ in range(3):  # written again and again: repaired each time
        await rig.put(two_way_route(MAX_REVISION, experiment=eid, canary_bp=10_000,
                                    state=RouteState.RUNNING))
        await rig.full_pass()
        assert await rig.stored() == await rig.desired()
    assert rig.reconciler.stats.errors == 0
    assert not any("cannot grow" in r.getMessage() for r in caplog.records)
    await rig.act(eid, LifecycleAction.PAUSE)  # the next commit is one above the last, as ever
    await rig.full_pass()
    paused = await rig.stored()
    assert paused is not None and paused.state is RouteState.PAUSED


# ------------------------------------------------------------ wake-ups


async def test_a_route_commit_wakes_no_config_pass_and_a_config_commit_one(rig: Rig) -> None:
    changes = rig.backends.route_changes
    await changes.wait(0)
    await rig.start()
    wake = await changes.wait(0)
    assert (wake.services, wake.configs) == (frozenset({SERVICE}), False)
    await commit(rig, ConfigKind.RULE, RULE)
    wake = await changes.wait(0)
    assert (wake.services, wake.full, wake.configs) == (frozenset(), False, True)
    changes.notify_all()
    assert (await changes.wait(0)).configs, "a full pass covers the configs"


async def test_a_config_commit_in_this_process_is_published_at_once(rig: Rig) -> None:
    leader = RouteReconciler(full_pass_sec=3600, poll_sec=3600)  # no pass would find it
    running = asyncio.create_task(leader.run(rig.backends, rig.fence))
    try:
        async with asyncio.timeout(10):
            while leader.stats.reconcile_passes == 0:  # its first full pass is over
                await asyncio.sleep(0.01)
        await commit(rig, ConfigKind.OVERLOAD, OVERLOAD)
        key = rig.backends.keys.overload(SERVICE)
        async with asyncio.timeout(10):
            while await rig.backends.kv.get(key) is None:
                await asyncio.sleep(0.01)
        assert leader.stats.configs_reconciled == 0, "the ordinary path"
    finally:
        await cancel_and_wait(running)


async def test_a_config_commit_on_another_replica_wakes_the_leader(
    rig: Rig, backend_settings: Settings
) -> None:
    if not backend_settings.database_url.startswith("postgresql"):
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite is found by the next full pass")
    leader = RouteReconciler(full_pass_sec=3600)  # no full pass would find it
    running = asyncio.create_task(leader.run(rig.backends, rig.fence))
    other = await open_backends(backend_settings, clock=rig.clock, streams=False)
    try:
        async with asyncio.timeout(10):
            while leader.stats.reconcile_passes == 0:
                await asyncio.sleep(0.01)
        await write_config(store=other.store, changes=other.route_changes, clock=rig.clock,
                           kind=ConfigKind.RULE, service=SERVICE, config=RULE,
                           actor="user:test")
        key = rig.backends.keys.rule(SERVICE)
        async with asyncio.timeout(10):
            while await rig.backends.kv.get(key) is None:
                await asyncio.sleep(0.02)
        assert leader.stats.route_notices_dropped == 0
    finally:
        await cancel_and_wait(running)
        await other.close()


# ------------------------------------------------------------ concurrent writers


async def test_concurrent_commits_of_one_rule_leave_a_trail_without_a_gap(rig: Rig) -> None:
    """Whatever the interleaving, each committed change names the one before it as
    `previous`, and the desired rule is the last one logged: a writer that read a rule
    another replaced meanwhile is refused (409), never logged against a stale one."""
    await commit(rig, ConfigKind.RULE, RULE)
    thresholds = [300.0, 400.0, 500.0, 600.0, 700.0]
    outcomes = await asyncio.gather(
        *(commit(rig, ConfigKind.RULE, RULE.model_copy(update={"threshold_ms": t}))
          for t in thresholds),
        return_exceptions=True,
    )
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(o, Conflict) for o in refused), refused
    trail = [e.payload for e in await all_events(rig) if e.kind == "rule_changed"]
    assert len(trail) == 1 + len(thresholds) - len(refused)
    for before, after in itertools.pairwise(trail):
        assert after["previous"] == before["rule"]
    desired = await rig.backends.database.read(
        desired_configs.desired_config, kind=ConfigKind.RULE, service=SERVICE
    )
    assert isinstance(desired, BreakerRule)
    assert desired.threshold_ms == trail[-1]["rule"]["threshold_ms"]
