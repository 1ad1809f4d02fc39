"""Sharded controllers in one process, on the real backends (etcd + PostgreSQL, then
memory + SQLite): each replica judges only the experiments of its shards, together
all of them; a replica that stops hands its experiments to the other; a decision
fenced by a shard another replica has claimed since commits nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace

import pytest

from controlplane.controller.apply import apply_decision
from controlplane.controller.ownership import ShardFence
from controlplane.controller.runner import Controller
from controlplane.controller.shards import assign
from controlplane.db.migrate import upgrade
from controlplane.decision.model import Decision
from controlplane.experiments.actions import apply_action, create_experiment
from controlplane.experiments.lifecycle import BreakerState, ExperimentState, LifecycleAction
from controlplane.experiments.rollout_state import inline_rule, rollout_state_of
from controlplane.experiments.store import ExperimentSpec, StepSpec
from controlplane.kernel.clock import utc_now
from controlplane.kernel.errors import NotLeader
from controlplane.kernel.kv import Fence
from controlplane.kernel.settings import Settings
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.runtime import Backends, open_backends

SHARDS = 8
EXPERIMENTS = 12
RULE = {"threshold_ms": 300, "window_sec": 10, "min_samples": 50}


@pytest.fixture
async def backends(backend_settings: Settings) -> AsyncIterator[Backends]:
    upgrade(backend_settings.database_url)
    opened = await open_backends(backend_settings, streams=False)
    try:
        yield opened
    finally:
        await opened.close()


async def running(backends: Backends, count: int) -> list[int]:
    ids = []
    for i in range(count):
        spec = ExperimentSpec(
            name=f"sharded {i}", service=f"svc-{i}",
            baseline_upstream="http://127.0.0.1:9001", canary_upstream="http://127.0.0.1:9002",
            steps=(StepSpec(1000, 3600),), sticky_header="x-user-id", sticky_cookie=None,
            rule=dict(RULE),
        )  # fmt: skip
        record = await create_experiment(store=backends.store, clock=backends.clock, spec=spec,
                                         actor="test")  # fmt: skip
        await apply_action(store=backends.store, changes=backends.route_changes,
                           clock=backends.clock, experiment_id=record.id,
                           action=LifecycleAction.START, actor="test")  # fmt: skip
        ids.append(record.id)
    return ids


class Judged:
    """Which experiments a replica read windows for: the ones it judged."""

    def __init__(self) -> None:
        self.ids: set[int] = set()

    async def __call__(
        self, backends: Backends, experiment: str, window_sec: int
    ) -> Mapping[str, WindowSnapshot]:
        self.ids.add(int(experiment))
        return {}


def replica(identity: str, judged: Judged) -> Controller:
    return Controller(identity=identity, shards=SHARDS, lease_ttl=30, tick=0.05,
                      snapshot_reader=judged, fast_window=False)  # fmt: skip


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def settled(*controllers: Controller) -> bool:
    wanted = assign(SHARDS, [c.identity for c in controllers])
    held = {s: c.identity for c in controllers if c._owner is not None for s in c._owner.held}
    return held == wanted


async def test_replicas_judge_disjoint_shares_and_a_stopped_ones_go_to_the_other(
    backends: Backends,
) -> None:
    ids = await running(backends, EXPERIMENTS)
    seen_a, seen_b = Judged(), Judged()
    a, b = replica("ctl-a", seen_a), replica("ctl-b", seen_b)
    await a.start(backends)
    await b.start(backends)
    try:
        await until(lambda: settled(a, b), "two replicas share the shards")
        seen_a.ids.clear()
        seen_b.ids.clear()
        rounds = a.stats.evaluations + b.stats.evaluations
        await until(lambda: seen_a.ids | seen_b.ids == set(ids)
                    and a.stats.evaluations + b.stats.evaluations > rounds + 3 * EXPERIMENTS,
                    "every experiment judged, a few rounds over")  # fmt: skip
        assert seen_a.ids and seen_b.ids
        assert not seen_a.ids & seen_b.ids, "an experiment judged by both replicas"
        # one elected leader among them reconciles
        await until(lambda: a.stats.leader != b.stats.leader, "one leader")

        await b.stop()
        await until(lambda: settled(a), "ctl-a holds every shard")
        seen_a.ids.clear()
        await until(lambda: seen_a.ids == set(ids), "ctl-a judges every experiment")
    finally:
        await a.stop()
        await b.stop()


async def test_a_decision_fenced_by_a_lost_shard_commits_nothing(backends: Backends) -> None:
    (experiment_id,) = await running(backends, 1)
    key = backends.keys.controller_shard(3)
    async with backends.store.transaction() as tx:
        await tx.hold_shard(shard=3, fence=100, owner="ctl-a", now=utc_now(backends.clock))
        await tx.hold_shard(shard=3, fence=200, owner="ctl-b", now=utc_now(backends.clock))
        experiment = await tx.load_experiment(experiment_id=experiment_id)
    state = rollout_state_of(experiment, backends.clock.now())
    tripped = replace(state, breaker=BreakerState.OPEN, trips=1)
    decision = Decision(new_state=tripped, effects=(), reason="stale owner", evidence={},
                        next_check_at=None)  # fmt: skip
    rule = inline_rule(experiment)
    assert rule is not None

    with pytest.raises(NotLeader, match="shard 3"):
        await apply_decision(
            backends, experiment_id=experiment_id, version=experiment.version,
            decision=decision, rule=rule, fence=Fence(key, 100),
            shard=ShardFence(3, Fence(key, 100)), owner="ctl-a",
        )  # fmt: skip

    async with backends.store.transaction() as tx:
        after = await tx.load_experiment(experiment_id=experiment_id)
    assert after.version == experiment.version
    assert (after.state, after.breaker_state) == (ExperimentState.RUNNING, BreakerState.CLOSED)
