# ruff: noqa: F811
"""The controller hands a metric board's latest evidence to the rollout.

The rig of test_controller_integration (real Postgres or SQLite, etcd, Redis, one
FakeClock). The board here is a plain stand-in implementing the controller's side
of the interface (`MetricBoardLike`: track, forget, latest): the real board and
Prometheus are tested on their own (tests/providers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from controlplane.experiments.service_configs import write_config
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.service_configs import ConfigKind
from controlplane.providers.evidence import MetricEvidence, Reading

# the integration test's `rig` fixture, used by name as each test's parameter
from tests.controller.test_controller_integration import (
    RULE,
    SERVICE,
    Rig,
    rig,  # noqa: F401
)

QUERY = 'max(process_resident_memory_bytes{app="shop",variant="$variant"})'
MEMORY = MetricSpec(name="memory", kind="gauge", query=QUERY, bound=100.0, action="pause")


class StandInBoard:
    """Answers `latest` with the memory gauge the test sets, read at the rig's clock."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.memory: float | None = 50.0
        self.tracked: list[tuple[str, str, tuple[MetricSpec, ...], int, tuple[str, str]]] = []
        self.forgotten: list[str] = []

    def track(
        self,
        experiment_id: str,
        service: str,
        specs: Sequence[MetricSpec],
        window_sec: int,
        variants: tuple[str, str],
    ) -> None:
        self.tracked.append((experiment_id, service, tuple(specs), window_sec, variants))

    def forget(self, experiment_id: str) -> None:
        self.forgotten.append(experiment_id)

    def latest(self, experiment_id: str) -> Mapping[str, MetricEvidence]:
        canary = Reading(self.memory) if self.memory is not None else Reading.missing("down")
        sent = QUERY.replace("$variant", "canary")
        return {
            "memory": MetricEvidence(
                "memory", canary, Reading(40.0), self.rig.clock.now(), (sent,)
            )
        }


async def put_rule(rig: Rig, rule: BreakerRule) -> None:
    """The service's rule as the API writes it: the database, then etcd follows."""
    await write_config(
        store=rig.backends.store, changes=rig.backends.route_changes, clock=rig.clock,
        kind=ConfigKind.RULE, service=SERVICE, config=rule, actor="user:test",
    )  # fmt: skip
    await rig.controller.reconciler.reconcile(rig.backends, rig.fence)


async def with_metrics(rig: Rig) -> BreakerRule:
    rule = RULE.model_copy(update={"metrics": [MEMORY]})
    await put_rule(rig, rule)
    book = rig.controller._rulebook
    assert book is not None
    async with asyncio.timeout(10):
        while True:  # the rulebook's watch delivers the new rule
            found = book.get(SERVICE)
            if found is not None and found.rule.metrics:
                return rule
            await asyncio.sleep(0.01)


async def test_a_breaching_gauge_pauses_the_rollout_then_lets_it_go(rig: Rig) -> None:
    board = StandInBoard(rig)
    rig.controller.metric_board = board
    await with_metrics(rig)
    await rig.second(canary_ms=40)
    assert board.tracked == [
        (str(rig.experiment_id), SERVICE, (MEMORY,), RULE.window_sec, ("baseline", "canary"))
    ]
    board.memory = 500.0
    for _ in range(4):
        await rig.second(canary_ms=40)
    events = await rig.events()
    holds = [p for k, p in events if k == "guardrail_hold"]
    assert len(holds) == 1 and holds[0]["guardrail"] == "memory"
    assert holds[0]["queries"] == [QUERY.replace("$variant", "canary")]
    assert await rig.route() == (1000, "running"), "a pause holds the weight"
    # the step's hold (30 s) passes: still held, no advance
    for _ in range(30):
        await rig.second(canary_ms=40)
    assert await rig.route() == (1000, "running")
    board.memory = 50.0
    for _ in range(6):
        await rig.second(canary_ms=40)
        if (await rig.route())[0] != 1000:
            break
    kinds = [k for k, _ in await rig.events()]
    assert "guardrail_released" in kinds
    assert await rig.route() == (5000, "running"), "released, the due step advances"


async def test_without_a_board_a_metric_has_no_data_and_the_event_says_why(rig: Rig) -> None:
    await with_metrics(rig)
    for _ in range(3):
        await rig.second(canary_ms=40)
    events = await rig.events()
    no_data = [p for k, p in events if k == "no_data"]
    assert no_data and no_data[0]["metric"] == "memory"
    assert no_data[0]["reason"] == "no metric provider configured (CANARY_PROMETHEUS_URL)"
    assert await rig.route() == (1000, "running")


async def test_a_rule_without_metrics_forgets_the_experiment(rig: Rig) -> None:
    board = StandInBoard(rig)
    rig.controller.metric_board = board
    await with_metrics(rig)
    await rig.second(canary_ms=40)
    assert board.tracked
    await put_rule(rig, RULE)
    book = rig.controller._rulebook
    assert book is not None
    async with asyncio.timeout(10):
        while (found := book.get(SERVICE)) is None or found.rule.metrics:
            await asyncio.sleep(0.01)
    await rig.second(canary_ms=40)
    assert board.forgotten == [str(rig.experiment_id)]
