"""Degraded canary samples in the stream → collector → controller → route cut in etcd.

Everything real (PostgreSQL + etcd + Redis, then SQLite + memory + memory) except
time: one FakeClock drives the sample timestamps, the collector's windows and the
controller's decisions, so cooldowns and windows pass without sleeping.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane.collector.service import Collector
from controlplane.controller.runner import Controller
from controlplane.db.experiments import list_events
from controlplane.db.migrate import upgrade
from controlplane.experiments.actions import apply_action, create_experiment
from controlplane.experiments.lifecycle import LifecycleAction
from controlplane.experiments.store import ExperimentSpec, StepSpec
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.kv import Fence
from controlplane.kernel.routes import parse_route
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.settings import Settings
from controlplane.kernel.tracing_config import TracingConfig
from controlplane.runtime import Backends, open_backends
from controlplane.tracer import tracer_provider

SERVICE = "shop"
RATE = 200  # samples per second and variant


@dataclass
class Rig:
    backends: Backends
    clock: FakeClock
    collector: Collector
    controller: Controller
    fence: Fence
    experiment_id: int
    rng: np.random.Generator
    seq: int = 0

    async def second(self, *, canary_ms: float, baseline_ms: float = 40.0) -> None:
        """One simulated second of traffic, collected, then one controller round."""
        self.clock.advance(1.0)
        builder = BatchBuilder()
        start = self.clock.now() - 1.0
        canary_weight, _ = await self.route()
        # with the canary cut to 0, the sidecars send it nothing
        variants = [("baseline", baseline_ms)] + ([("canary", canary_ms)] if canary_weight else [])
        for variant, median in variants:
            rts = self.rng.lognormal(np.log(median * 1000), 0.25, RATE)
            for i, rt in enumerate(rts):
                builder.add(start + i / RATE, variant, int(rt), 200)
        self.seq += 1
        meta = BatchMeta(str(self.experiment_id), "sidecar-test", self.seq, len(builder))
        assert self.backends.streams is not None
        await self.backends.streams.append(
            SERVICE, [entry_fields(meta, builder.encode())], maxlen=100_000
        )
        for _ in range(3):
            await self.collector.step()
        await self.collector.publish_due()
        await self.controller.evaluate_all(self.backends, self.fence)
        # what the round committed reaches etcd in the same tick: the reconciler's pass
        await self.controller.reconciler.reconcile(self.backends, self.fence)

    async def route(self) -> tuple[int, str]:
        kv = await self.backends.kv.get(self.backends.keys.route(SERVICE))
        assert kv is not None
        route = parse_route(kv.value)
        return route.weight_of("canary"), route.state.value

    async def events(self) -> list[str]:
        def read(*, session):  # type: ignore[no-untyped-def]
            rows, _ = list_events(session=session, experiment_id=self.experiment_id)
            return [(e.kind, e.payload) for e in rows]

        return await self.backends.database.read(read)  # type: ignore[no-any-return]


RULE = BreakerRule(
    service=SERVICE,
    threshold_ms=200,
    window_sec=5,
    min_samples=100,
    cooldown_sec=20,
    consecutive_breaches=2,
    max_trips=2,
    half_open_weight=500,
)


@pytest.fixture
async def rig(backend_settings: Settings) -> AsyncIterator[Rig]:
    upgrade(backend_settings.database_url)
    clock = FakeClock()
    backends = await open_backends(backend_settings, clock=clock)
    assert backends.streams is not None and backends.board is not None
    await backends.kv.put(backends.keys.rule(SERVICE), RULE.to_json().encode())
    spec = ExperimentSpec(
        name="checkout v2",
        service=SERVICE,
        baseline_upstream="http://127.0.0.1:9001",
        canary_upstream="http://127.0.0.1:9002",
        steps=(StepSpec(1000, 30), StepSpec(5000, 30), StepSpec(10000, 30)),
        sticky_header="x-user-id",
        sticky_cookie=None,
        rule=None,
    )
    experiment = await create_experiment(
        store=backends.store, clock=clock, spec=spec, actor="user:test"
    )
    await apply_action(
        store=backends.store, changes=backends.route_changes, clock=clock,
        experiment_id=experiment.id, action=LifecycleAction.START, actor="user:test",
    )
    collector = Collector(
        backends.streams, backends.board, backends.kv, backends.keys,
        consumer_name=f"c-{uuid.uuid4().hex[:6]}", clock=clock, block_ms=20,
    )
    await collector.load_config()
    controller = Controller(identity="test-controller")
    await controller.reconciler.reconcile(backends, None)
    await controller.open(backends)
    assert controller._rulebook is not None
    await asyncio.wait_for(controller._rulebook.loaded.wait(), 10)
    leadership = backends.kv.leadership(backends.keys.election, identity="t", ttl=3600)
    fence = await leadership.campaign()
    try:
        yield Rig(backends, clock, collector, controller, fence, experiment.id,
                  np.random.default_rng(7))
    finally:
        await leadership.resign()
        await controller.stop()
        await collector.flush()
        await collector.stop_watching()
        await backends.close()


async def test_degraded_canary_trips_and_cuts_the_route_in_etcd(rig: Rig) -> None:
    assert await rig.route() == (1000, "running")
    for _ in range(4):
        await rig.second(canary_ms=40)
    assert await rig.route() == (1000, "running"), "a healthy canary must not trip"

    for _ in range(10):
        await rig.second(canary_ms=500)
        if (await rig.route())[0] == 0:
            break
    assert await rig.route() == (0, "tripped")

    kinds = [kind for kind, _ in await rig.events()]
    assert "tripped" in kinds
    payload = next(p for k, p in await rig.events() if k == "tripped")
    evidence = payload["evidence"]
    assert payload["rule"]["threshold_ms"] == 200
    assert "route_revision" in payload
    text = repr(evidence)
    for number in ("count", "p95", "above_threshold"):
        assert number in text, f"the trip event lacks {number}: {text[:400]}"


async def test_each_evaluation_is_a_span_and_the_trip_says_so(rig: Rig) -> None:
    exporter = InMemorySpanExporter()
    provider = tracer_provider(TracingConfig(None, 1.0), SimpleSpanProcessor(exporter), {})
    rig.controller.tracer = provider.get_tracer("canary.controller")
    await rig.second(canary_ms=40)
    for _ in range(10):
        await rig.second(canary_ms=500)
        if (await rig.route())[0] == 0:
            break
    provider.shutdown()
    spans = exporter.get_finished_spans()
    assert spans and {s.name for s in spans} == {"controller.evaluate"}
    attributes = [dict(s.attributes or {}) for s in spans]
    assert {a["canary.experiment"] for a in attributes} == {str(rig.experiment_id)}
    assert {a["canary.service"] for a in attributes} == {SERVICE}
    tripped = [a for a in attributes if "tripped" in str(a["canary.decision.events"])]
    assert len(tripped) == 1
    assert tripped[0]["canary.breaker"] == "open" and tripped[0]["canary.canary_bp"] == 0
    assert tripped[0]["canary.decision.changed"] is True
    # the healthy second's evaluation: closed, nothing to do
    assert attributes[0]["canary.breaker"] == "closed"


async def test_half_open_probe_after_cooldown_then_rollback_on_second_trip(rig: Rig) -> None:
    for _ in range(12):
        await rig.second(canary_ms=500)
        if (await rig.route())[0] == 0:
            break
    assert (await rig.route())[0] == 0

    # the cooldown passes with no canary traffic (weight 0): baseline only
    for _ in range(int(RULE.cooldown_sec) + 1):
        await rig.second(canary_ms=500)
        if (await rig.route())[1] == "half_open":
            break
    assert await rig.route() == (RULE.half_open_weight, "half_open")

    # the probe sees the canary still slow: second trip = max_trips → rolled back
    for _ in range(RULE.window_sec * 4):
        await rig.second(canary_ms=500)
        if (await rig.route())[1] == "rolled_back":
            break
    assert await rig.route() == (0, "rolled_back")
    kinds = [kind for kind, _ in await rig.events()]
    assert kinds.count("tripped") + kinds.count("probe_failed") >= 2
    assert "rolled_back" in kinds


async def test_an_unreadable_rollout_state_skips_that_experiment_not_the_round(rig: Rig) -> None:
    from controlplane.db.models import Experiment

    await _start_cart(rig)

    def corrupt(*, session):  # type: ignore[no-untyped-def]
        row = session.get(Experiment, rig.experiment_id)
        row.rollout_state = {"status": "running"}  # written by another version, say

    async with rig.backends.database.transaction() as tx:
        await tx.run(corrupt)

    rig.clock.advance(1.0)
    await rig.controller.evaluate_all(rig.backends, rig.fence)

    assert rig.controller.stats.errors == 1
    assert rig.controller.stats.evaluations == 1, "the other experiment is still evaluated"


async def test_a_snapshot_store_outage_is_no_data_not_a_step_down(rig: Rig) -> None:
    """Redis away: the round completes (no BackendError escapes to the leader loop)."""
    from controlplane.kernel.streams_redis import RedisStreams
    from tests.support.processes import free_port

    healthy = rig.backends.board
    dead = RedisStreams(f"redis://127.0.0.1:{free_port()}/0")
    rig.backends.board = dead
    try:
        rig.clock.advance(1.0)
        await rig.controller.evaluate_all(rig.backends, rig.fence)
        assert rig.controller.stats.snapshot_errors >= 1
        assert await rig.route() == (1000, "running")
    finally:
        rig.backends.board = healthy
        await dead.close()


async def test_the_leader_records_one_history_point_per_second_of_what_it_judged(
    rig: Rig,
) -> None:
    start = int(rig.clock.now())
    for _ in range(4):
        await rig.second(canary_ms=40)
    for _ in range(10):
        await rig.second(canary_ms=500)
        if (await rig.route())[0] == 0:
            break
    end = int(rig.clock.now())

    points = await rig.backends.history.read(
        experiment_id=rig.experiment_id, start=start, end=end, width=1
    )

    assert [p.at for p in points] == list(range(start + 1, end + 1)), "one per second"
    assert rig.controller.history.stats.written == len(points)
    assert {p.threshold_ms for p in points} == {RULE.threshold_ms}
    assert {p.window_sec for p in points} == {RULE.window_sec}
    healthy, tripped = points[3], points[-1]
    assert healthy.canary.p95_ms is not None and healthy.canary.p95_ms < RULE.threshold_ms
    assert tripped.canary.p95_ms is not None and tripped.canary.p95_ms > RULE.threshold_ms
    assert healthy.baseline.rps == pytest.approx(200, rel=0.05)
    # the point of a second carries the weight judged at it: the cut shows from the next
    assert points[0].canary_weight_bp == 1000
    marks, _ = await rig.backends.history.marks(
        experiment_id=rig.experiment_id, start=datetime.fromtimestamp(start, UTC),
        end=datetime.fromtimestamp(end + 1, UTC), kinds={"tripped"}, limit=10,
    )
    assert [m.kind for m in marks] == ["tripped"]


async def test_an_ended_experiment_keeps_at_most_the_ended_bound_of_points(rig: Rig) -> None:
    rig.controller.history.new_term()
    start = int(rig.clock.now())
    for _ in range(30):
        await rig.second(canary_ms=40)
    await apply_action(
        store=rig.backends.store, changes=rig.backends.route_changes, clock=rig.clock,
        experiment_id=rig.experiment_id, action=LifecycleAction.ROLLBACK, actor="user:test",
    )
    bound = 8
    rig.controller.history.ended_points = bound
    rig.clock.advance(1.0)
    await rig.controller.evaluate_all(rig.backends, rig.fence)

    spans = await rig.backends.history.spans(experiment_ids=[rig.experiment_id])
    count, first, _ = spans[rig.experiment_id]
    assert first == start + 1
    assert count <= bound + 1
    assert rig.controller.history.stats.compactions >= 1


async def _start_cart(rig: Rig) -> int:
    """A second running experiment, on another service, that gets no samples."""
    other = await create_experiment(
        store=rig.backends.store, clock=rig.clock, actor="user:test",
        spec=ExperimentSpec(
            name="cart v2", service="cart", baseline_upstream="http://127.0.0.1:9003",
            canary_upstream="http://127.0.0.1:9004", steps=(StepSpec(1000, 30),),
            sticky_header="x-user-id", sticky_cookie=None,
            rule=RULE.model_copy(update={"service": "cart"}).model_dump(mode="json"),
        ),
    )  # fmt: skip
    await apply_action(
        store=rig.backends.store, changes=rig.backends.route_changes,
        clock=rig.clock, experiment_id=other.id, action=LifecycleAction.START, actor="user:test",
    )  # fmt: skip
    return other.id


async def _versions(rig: Rig, *ids: int) -> list[int]:
    async with rig.backends.store.transaction() as tx:
        return [(await tx.load_experiment(experiment_id=i)).version for i in ids]


class CountingStore:
    """The real store, counting the transactions opened on it."""

    def __init__(self, store: object) -> None:
        self.store = store
        self.opened = 0

    def transaction(self):  # type: ignore[no-untyped-def]
        self.opened += 1
        return self.store.transaction()  # type: ignore[attr-defined]


async def test_a_round_commits_every_memory_only_decision_in_one_transaction(rig: Rig) -> None:
    await rig.second(canary_ms=40)
    cart = await _start_cart(rig)  # its first look sets its no-data clock: memory
    before = await _versions(rig, rig.experiment_id, cart)
    counting = CountingStore(rig.backends.store)
    rig.backends.store = counting  # type: ignore[assignment]
    try:
        # past the window: the checkout's look starts its no-data clock (a look that
        # moved only the time of its window would be kept, not written: decision 0077)
        rig.clock.advance(RULE.window_sec + 1.0)
        applied = rig.controller.stats.decisions_applied
        await rig.controller.evaluate_all(rig.backends, rig.fence)
    finally:
        rig.backends.store = counting.store  # type: ignore[assignment]
    after = await _versions(rig, rig.experiment_id, cart)
    assert after == [before[0] + 1, before[1] + 1], "both experiments' memory is saved"
    assert rig.controller.stats.decisions_applied - applied == 2
    # the list of experiments, then one commit for every experiment's memory
    assert counting.opened == 2


async def test_a_row_moved_during_the_round_keeps_its_change_and_the_others_are_saved(
    rig: Rig,
) -> None:
    from controlplane.db.models import Experiment

    await rig.second(canary_ms=40)
    cart = await _start_cart(rig)
    commit = rig.controller._commit_memory

    async def raced(backends: Backends, memory: list) -> None:  # type: ignore[type-arg]
        # the API moves the cart between the round's read and its commit
        def touch(*, session):  # type: ignore[no-untyped-def]
            row = session.get(Experiment, cart)
            row.updated_at = datetime(2031, 1, 1, tzinfo=UTC)

        async with backends.database.transaction() as tx:
            await tx.run(touch)
        assert {e.id for e, _ in memory} == {rig.experiment_id, cart}
        await commit(backends, memory)

    before = await _versions(rig, rig.experiment_id, cart)
    conflicts = rig.controller.stats.conflicts
    rig.controller._commit_memory = raced  # type: ignore[method-assign]
    rig.clock.advance(RULE.window_sec + 1.0)  # both looks start a no-data clock
    await rig.controller.evaluate_all(rig.backends, rig.fence)
    after = await _versions(rig, rig.experiment_id, cart)
    assert after[0] == before[0] + 1, "the other experiment's memory is saved"
    assert after[1] == before[1] + 1, "only the API's write moved the cart"
    async with rig.backends.store.transaction() as tx:
        row = await tx.load_experiment(experiment_id=cart)
    assert row.updated_at.year == 2031
    assert rig.controller.stats.conflicts == conflicts + 1


class RecordingBoard:
    """The real board, recording each pipelined read's experiments and what the
    controller had judged before it."""

    def __init__(self, board: object, controller: Controller) -> None:
        self.board = board
        self.controller = controller
        self.reads: list[tuple[list[str], int]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.board, name)

    async def read_many(self, experiments: list[str]) -> list[dict[str, str]]:
        self.reads.append((list(experiments), self.controller.stats.evaluations))
        return await self.board.read_many(experiments)  # type: ignore[attr-defined, no-any-return]


async def test_a_round_reads_each_hash_just_before_judging_it_not_all_up_front(
    rig: Rig,
) -> None:
    await rig.second(canary_ms=40)
    cart = await _start_cart(rig)
    recording = RecordingBoard(rig.backends.board, rig.controller)
    rig.backends.board = recording  # type: ignore[assignment]
    rig.controller.read_ahead = 1
    try:
        rig.clock.advance(1.0)
        evaluations = rig.controller.stats.evaluations
        await rig.controller.evaluate_all(rig.backends, rig.fence)
    finally:
        rig.backends.board = recording.board  # type: ignore[assignment]
    # one read per experiment here (read_ahead 1), the second after the first judged:
    # a long round judges its last experiments on hashes as fresh as its first ones'
    assert [judged for _, judged in recording.reads] == [evaluations, evaluations + 1]
    assert sorted(ids for ids, _ in recording.reads) == sorted(
        [[str(rig.experiment_id)], [str(cart)]]
    )
