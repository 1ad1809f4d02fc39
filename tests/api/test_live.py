"""GET /v1/experiments/{id}: the live rollout, on both backend sets."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy.orm import Session

from controlplane.api.live import next_check
from controlplane.db import experiments as records
from controlplane.decision.model import RolloutState
from controlplane.decision.tally import Tally, VariantTally
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.settings import Settings
from controlplane.kernel.streams_memory import MemoryStreams
from controlplane.kernel.streams_redis import RedisStreams
from controlplane.runtime import Backends
from tests.api.conftest import experiment_body
from tests.api.traffic import collecting


def iso(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def parsed(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def test_a_draft_has_no_step_and_nothing_due(
    client: httpx.AsyncClient, create: Callable[..., Any]
) -> None:
    created = await create()

    live = (await client.get(f"/v1/experiments/{created['id']}")).json()["live"]

    assert live["step"] is None
    assert live["next_check_at"] is None and live["next_check_for"] is None
    assert (live["breaker_state"], live["trips"]) == ("closed", 0)
    assert (live["canary_weight_bp"], live["baseline_weight_bp"]) == (0, 10_000)


async def test_after_a_start_the_first_step_is_due_after_its_hold(
    client: httpx.AsyncClient, create: Callable[..., Any], clock: FakeClock
) -> None:
    created = await create()
    started_at = clock.now()
    assert (await client.post(f"/v1/experiments/{created['id']}/start")).status_code == 200
    clock.advance(7)

    body = (await client.get(f"/v1/experiments/{created['id']}")).json()
    live = body["live"]

    step = live["step"]
    assert (step["index"], step["weight_bp"], step["hold_sec"]) == (0, 100, 60)
    assert parsed(step["started_at"]) == iso(started_at)
    assert parsed(step["due_at"]) == iso(started_at + 60)
    assert (live["canary_weight_bp"], live["baseline_weight_bp"]) == (100, 9900)
    assert live["route_revision"] == body["route_revision"] >= 1
    assert (live["next_check_for"], parsed(live["next_check_at"])) == (
        "step_due",
        iso(started_at + 60),
    )
    assert (live["breaker_state"], live["trips"]) == ("closed", 0)
    # this app was opened without the streams: no board to read snapshots from
    assert live["snapshots"] is None and "no snapshot board" in live["snapshots_note"]
    assert live["rule_source"] is None and "no breaker rule" in live["rule_note"]


async def test_an_open_breaker_is_due_at_the_end_of_its_cooldown(
    client: httpx.AsyncClient,
    create: Callable[..., Any],
    clock: FakeClock,
    backends: Backends,
) -> None:
    """The controller's row after a trip, as controller/apply.py writes it."""
    created = await create()
    await client.post(f"/v1/experiments/{created['id']}/start")
    rule = {"threshold_ms": 300, "cooldown_sec": 45}
    assert (await client.put("/v1/services/payment-api/rule", json=rule)).status_code == 200
    opened_at = clock.now() + 12
    clock.advance(20)

    def trip(*, session: Session) -> None:
        row = records.get_experiment(session=session, experiment_id=created["id"])
        state = RolloutState(
            status=ExperimentState.RUNNING, breaker=BreakerState.OPEN, step_index=0,
            step_started_at=opened_at - 12, canary_bp=0, weight_since=opened_at, trips=1,
            opened_at=opened_at,
        )  # fmt: skip
        row.breaker_state, row.trips, row.canary_weight_bp = "open", 1, 0
        row.rollout_state = {
            **state.to_dict(),
            "next_check_at": opened_at + 45,
            "last_reason": "canary p95 412 ms > 300 ms",
        }

    async with backends.database.transaction() as tx:
        await tx.run(trip)

    live = (await client.get(f"/v1/experiments/{created['id']}")).json()["live"]

    assert (live["breaker_state"], live["trips"], live["max_trips"]) == ("open", 1, 3)
    assert live["next_check_for"] == "cooldown_end"
    assert parsed(live["next_check_at"]) == iso(opened_at + 45)
    assert parsed(live["controller_next_check_at"]) == iso(opened_at + 45)
    assert live["last_reason"] == "canary p95 412 ms > 300 ms"
    assert live["rule_source"] == "service"
    assert live["step"]["due_at"] is None, "an open breaker does not count the hold down"
    assert (live["canary_weight_bp"], live["baseline_weight_bp"]) == (0, 10_000)


async def test_a_half_open_probe_shows_its_time_to_verdict_from_its_traffic(
    client: httpx.AsyncClient,
    create: Callable[..., Any],
    clock: FakeClock,
    backends: Backends,
) -> None:
    created = await create()
    await client.post(f"/v1/experiments/{created['id']}/start")
    rule = {"threshold_ms": 300, "window_sec": 10, "min_samples": 30, "half_open_weight": 100}
    assert (await client.put("/v1/services/payment-api/rule", json=rule)).status_code == 200
    probe_at = clock.now()
    clock.advance(84)

    def probing(*, session: Session) -> None:
        row = records.get_experiment(session=session, experiment_id=created["id"])
        state = RolloutState(
            status=ExperimentState.RUNNING, breaker=BreakerState.HALF_OPEN, step_index=0,
            step_started_at=probe_at, canary_bp=100, weight_since=probe_at, trips=1,
            opened_at=probe_at - 30, probe_started_at=probe_at,
            tally=Tally(since=probe_at, canary=VariantTally(count=12)),
        )  # fmt: skip
        row.breaker_state, row.trips, row.canary_weight_bp = "half_open", 1, 100
        row.rollout_state = state.to_dict()

    async with backends.database.transaction() as tx:
        await tx.run(probing)

    live = (await client.get(f"/v1/experiments/{created['id']}")).json()["live"]
    probe = live["probe"]
    assert (probe["weight_bp"], probe["samples"], probe["samples_needed"]) == (100, 12, 30)
    assert parsed(probe["window_ends_at"]) == iso(probe_at + 10)
    assert parsed(probe["verdict_expected_at"]) == iso(probe_at + 84 + 18 * 7)
    assert "2 min 6 s (the samples, not the window, set the pace)" in probe["sentence"]


RULE = BreakerRule(service="svc", threshold_ms=100, window_sec=10, cooldown_sec=30)


def state(
    breaker: BreakerState, status: ExperimentState = ExperimentState.RUNNING
) -> RolloutState:
    return RolloutState(
        status=status, breaker=breaker, step_index=1, step_started_at=1000.0, canary_bp=500,
        weight_since=1000.0, opened_at=1100.0, probe_started_at=1200.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("rollout", "rule", "expected"),
    [
        (state(BreakerState.CLOSED), RULE, (1060.0, "step_due")),
        (state(BreakerState.CLOSED), None, (1060.0, "step_due")),
        (state(BreakerState.OPEN), RULE, (1130.0, "cooldown_end")),
        (state(BreakerState.HALF_OPEN), RULE, (1210.0, "probe_due")),
        (state(BreakerState.OPEN), None, (None, None)),
        (state(BreakerState.CLOSED, ExperimentState.PAUSED), RULE, (None, None)),
        (state(BreakerState.CLOSED, ExperimentState.PROMOTED), RULE, (None, None)),
        (None, RULE, (None, None)),
    ],
)
def test_next_check_follows_the_breaker_state(
    rollout: RolloutState | None, rule: BreakerRule | None, expected: tuple[Any, Any]
) -> None:
    assert next_check(rollout, rule, 60) == expected


async def test_the_collectors_latest_snapshot_per_variant_is_shown(
    stream_client: httpx.AsyncClient, stream_backends: Backends, clock: FakeClock
) -> None:
    created = (await stream_client.post("/v1/experiments", json=experiment_body())).json()
    await stream_client.post(f"/v1/experiments/{created['id']}/start")
    sent: dict[str, list[np.ndarray]] = {"baseline": [], "canary": []}
    failed: dict[str, list[np.ndarray]] = {"baseline": [], "canary": []}
    async with collecting(stream_backends, clock) as traffic:
        for _ in range(5):
            second = await traffic.second(
                "payment-api", created["id"], median_ms={"baseline": 40, "canary": 80},
                failure_rate=0.05,
            )  # fmt: skip
            for variant in sent:
                sent[variant].append(second.rt_ms[variant])
                failed[variant].append(second.failed[variant])

    live = (await stream_client.get(f"/v1/experiments/{created['id']}")).json()["live"]

    assert live["snapshots_error"] is None and live["snapshots_note"] is None
    assert set(live["snapshots"]) == {"baseline", "canary"}
    for variant, snapshot in live["snapshots"].items():
        rts = np.concatenate(sent[variant])
        failures = int(np.concatenate(failed[variant]).sum())
        assert (snapshot["count"], snapshot["failures"]) == (len(rts), failures)
        assert snapshot["failure_ratio"] == pytest.approx(failures / len(rts))
        for q, name in ((50, "p50_ms"), (95, "p95_ms"), (99, "p99_ms")):
            exact = np.percentile(rts, q, method="inverted_cdf")
            # the collector's sketch has a 1% relative error (plus the µs encoding)
            assert snapshot[name] == pytest.approx(exact, rel=0.02), (variant, name)
        assert snapshot["window_sec"] == 60
        assert snapshot["ts"] == pytest.approx(clock.now())


async def test_an_unreachable_board_omits_the_snapshots_but_answers(
    client: httpx.AsyncClient,
    create: Callable[..., Any],
    backends: Backends,
    settings: Settings,
) -> None:
    created = await create()
    await client.post(f"/v1/experiments/{created['id']}/start")
    broken: MemoryStreams | RedisStreams
    if settings.redis_url.startswith("memory"):
        broken = MemoryStreams()
        await broken.close()
    else:
        broken = RedisStreams("redis://127.0.0.1:1/0", connect_timeout=0.2, retries=0)
    backends.board = broken
    try:
        response = await client.get(f"/v1/experiments/{created['id']}")
    finally:
        backends.board = None
        await broken.close()

    assert response.status_code == 200, response.text
    live = response.json()["live"]
    assert live["snapshots"] is None
    assert "could not be read" in live["snapshots_error"]
    assert live["step"]["weight_bp"] == 100, "the rest of the live view is still there"


async def test_a_guardrails_pause_is_shown_with_its_reason(
    client: httpx.AsyncClient,
    create: Callable[..., Any],
    clock: FakeClock,
    backends: Backends,
) -> None:
    """The controller's row while a pause holds the weight (decision 0049)."""
    created = await create()
    await client.post(f"/v1/experiments/{created['id']}/start")
    started = clock.now()
    reason = "held at 1000 bp by memory: memory 6e+08 > bound 5.12e+08 (gauge): pause"

    def hold(*, session: Session) -> None:
        row = records.get_experiment(session=session, experiment_id=created["id"])
        state = RolloutState(
            status=ExperimentState.RUNNING, breaker=BreakerState.CLOSED, step_index=0,
            step_started_at=started, canary_bp=1000, weight_since=started,
            held_by=("memory",), held_since=started + 5, held_reason=reason,
        )  # fmt: skip
        row.rollout_state = state.to_dict()

    async with backends.database.transaction() as tx:
        await tx.run(hold)
    live = (await client.get(f"/v1/experiments/{created['id']}")).json()["live"]
    assert live["held_by"] == ["memory"] and live["held_reason"] == reason
    assert parsed(live["held_since"]) == iso(started + 5)
    # a rollout nothing holds says so
    other = await create()
    await client.post(f"/v1/experiments/{other['id']}/start")
    live = (await client.get(f"/v1/experiments/{other['id']}")).json()["live"]
    assert live["held_by"] == [] and live["held_reason"] is None
