"""The two stories end to end, every part its own process on the real services.

    `canary serve` (PostgreSQL + etcd + Redis), two `canary collector`s, `canary
    sidecar`, a baseline and a canary upstream process, ~150 requests/s from 5000 users

- a healthy canary is promoted step by step;
- a canary that slows down x5 after its second step is tripped, cut to 0, probed
  half-open after the cooldown, and rolled back on its second trip;
- a healthy rollout survives a SIGKILLed collector and an etcd restart.

Each checks the final state, the event trail with its numbers, that the sidecar
failed no user request, and (where no collector was killed) that the collectors
counted exactly the samples the sidecar sent.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest

from tests.e2e.helpers import (
    HOLD,
    MIN_SAMPLES,
    RULE,
    THRESHOLD_MS,
    Launch,
    Stack,
    canary_window,
    controller_events,
    is_subsequence,
    kinds_of,
    poll,
)
from tests.support.processes import EtcdProcess

pytestmark = [pytest.mark.e2e, pytest.mark.real, pytest.mark.timeout(240)]


async def assert_no_sidecar_failures(stack: Stack) -> None:
    assert stack.load is not None
    stats = stack.load.stats
    assert stats.sent > 1000, f"too little load to judge: {stats}"
    assert stats.sidecar_failed == 0, (
        f"the sidecar failed {stats.sidecar_failed} user requests: {dict(stats.sidecar_reasons)}"
    )
    assert stats.by_variant["canary"] > 0 and stats.by_variant["baseline"] > 0, stats.by_variant


async def assert_samples_exact(stack: Stack) -> None:
    sent, counted = await stack.quiesce_samples()
    assert sent["sent"] > 1000, sent
    assert sent["dropped"] == 0, f"the sidecar dropped samples: {sent}"
    assert counted["ingested"] == sent["sent"], (
        f"collectors counted {counted['ingested']:.0f} samples ({counted['late']:.0f} late, "
        f"{counted['duplicate_batches']:.0f} duplicate batches ignored); "
        f"the sidecar sent {sent['sent']:.0f}"
    )


def assert_step_evidence(event: dict[str, Any]) -> None:
    payload = event["payload"]
    evidence = payload["evidence"]
    assert evidence["step_samples"]["canary"] >= MIN_SAMPLES, evidence["step_samples"]
    canary = canary_window(event)
    assert canary.get("count", 0) >= 1, f"{event['kind']} without canary numbers: {evidence}"
    assert canary["p95_ms"] < THRESHOLD_MS, canary
    assert "route_revision" in payload, payload


async def test_healthy_canary_is_promoted(launch: Launch) -> None:
    stack = await launch()
    await stack.put_rule(RULE)
    experiment = await stack.create_and_start("healthy", [(10, HOLD), (50, HOLD), (100, HOLD)])
    stack.start_load()

    final = await stack.run_to_end(experiment, timeout=90)

    assert final["state"] == "promoted", final
    route = await stack.route()
    assert route is not None and route.state.value == "promoted"
    # the canary is the service's stable version now, alone in the route
    assert [(v.name, v.upstream, v.weight) for v in route.variants] == [
        ("baseline", stack.canary.url, 10_000)
    ]
    events = await stack.events(experiment)
    kinds = kinds_of(events)
    assert is_subsequence(["start", "step_advanced", "step_advanced", "promoted"], kinds), kinds
    assert "tripped" not in kinds, kinds
    advanced = controller_events(events, "step_advanced")
    weights = [e["payload"]["evidence"]["weights"]["canary_bp_after"] for e in advanced]
    assert weights == [5000, 10_000], weights
    for event in [*advanced, *controller_events(events, "promoted")]:
        assert_step_evidence(event)
    await assert_no_sidecar_failures(stack)
    await assert_samples_exact(stack)


async def test_degraded_canary_is_tripped_and_rolled_back(launch: Launch) -> None:
    stack = await launch()
    await stack.put_rule(RULE)
    experiment = await stack.create_and_start(
        "degraded", [(10, HOLD), (25, HOLD), (50, HOLD), (100, HOLD)]
    )
    routes = await stack.follow_routes()
    stack.start_load()
    degraded_at: list[float] = []

    async def degrade_after_second_step(data: dict[str, Any]) -> None:
        if not degraded_at and data["state"] == "running" and data["current_step"] >= 2:
            stack.canary.set_factor(5.0)
            degraded_at.append(time.time())

    final = await stack.run_to_end(experiment, timeout=120, on_poll=degrade_after_second_step)

    assert degraded_at, "the canary never reached its third step"
    assert final["state"] == "rolled_back", final
    assert final["trips"] == RULE["max_trips"], final
    route = await stack.route()
    assert route is not None and route.state.value == "rolled_back"
    assert route.weight_of("canary") == 0
    events = await stack.events(experiment)
    kinds = kinds_of(events)
    assert is_subsequence(
        ["start", "step_advanced", "step_advanced", "tripped", "half_open"], kinds
    ), kinds
    after_probe = kinds[kinds.index("half_open") + 1 :]
    assert "probe_failed" in after_probe or "tripped" in after_probe, kinds
    assert kinds[-1] == "rolled_back" or "rolled_back" in after_probe, kinds

    trip = controller_events(events, "tripped")[0]
    evidence = trip["payload"]["evidence"]
    assert evidence["weights"]["canary_bp_before"] == 5000, evidence["weights"]
    assert evidence["weights"]["canary_bp_after"] == 0, evidence["weights"]
    assert "route_revision" in trip["payload"]
    canary = canary_window(trip)
    assert canary["count"] >= MIN_SAMPLES, canary
    assert canary["p95_ms"] > THRESHOLD_MS, canary
    half_open = controller_events(events, "half_open")[0]
    assert (
        half_open["payload"]["evidence"]["weights"]["canary_bp_after"] == RULE["half_open_weight"]
    )
    assert "route_revision" in half_open["payload"]
    probe = next(
        e
        for e in controller_events(events, "probe_failed") + controller_events(events, "tripped")
        if e["id"] > half_open["id"]
    )
    assert canary_window(probe)["p95_ms"] > THRESHOLD_MS, canary_window(probe)
    # the cooldown runs on the decisions' clock (evidence "at"), not the records' times
    decided = half_open["payload"]["evidence"]["at"] - trip["payload"]["evidence"]["at"]
    assert decided >= RULE["cooldown_sec"], f"half-open {decided:.3f} s after the trip"
    rolled_back = controller_events(events, "rolled_back")[0]
    assert rolled_back["payload"]["evidence"]["trips"] == RULE["max_trips"]
    assert rolled_back["payload"]["evidence"]["weights"]["canary_bp_after"] == 0

    # what the sidecars were told, in etcd: the steps, the cut, the probe, the rollback
    trail = [
        (route.weight_of("canary"), route.state.value)
        for _, route in routes.seen
        if str(route.experiment) == str(experiment)
    ]
    expected = [(1000, "running"), (2500, "running"), (5000, "running"), (0, "tripped"),
                (RULE["half_open_weight"], "half_open"), (0, "rolled_back")]  # fmt: skip
    assert is_subsequence(expected, trail), trail
    cut = routes.first_cut(experiment, degraded_at[0])
    assert cut is not None and cut > degraded_at[0], trail

    await assert_no_sidecar_failures(stack)
    await assert_samples_exact(stack)


async def test_rollout_survives_a_killed_collector_and_an_etcd_restart(
    own_etcd: EtcdProcess, launch: Launch
) -> None:
    stack = await launch(etcd=own_etcd.endpoint)
    await stack.put_rule(RULE)
    experiment = await stack.create_and_start("resilience", [(10, HOLD), (50, HOLD), (100, HOLD)])
    stack.start_load()
    faults: list[str] = []

    async def inject_faults(data: dict[str, Any]) -> None:
        if faults or data["state"] != "running" or data["current_step"] < 1:
            return
        victim = stack.collectors[0].proc
        victim.signal(signal.SIGKILL)
        await asyncio.to_thread(victim.wait_exit, 10)
        faults.append(f"SIGKILL {victim.name}")
        await asyncio.to_thread(own_etcd.stop)
        faults.append("etcd stopped")
        await asyncio.to_thread(own_etcd.start)
        faults.append("etcd started")

    final = await stack.run_to_end(experiment, timeout=150, on_poll=inject_faults)

    assert faults == ["SIGKILL collector-0", "etcd stopped", "etcd started"], faults
    assert final["state"] == "promoted", final
    route = await poll(stack.route, timeout=15, what="the route readable after the restart")
    assert route.state.value == "promoted"
    assert [(v.upstream, v.weight) for v in route.variants] == [(stack.canary.url, 10_000)]
    kinds = kinds_of(await stack.events(experiment))
    assert is_subsequence(["start", "step_advanced", "step_advanced", "promoted"], kinds), kinds
    await assert_no_sidecar_failures(stack)
    # the killed collector took its counters with it: no exact count here, but the
    # sidecar lost nothing while etcd was away
    sent = await stack.stop_load_and_flush()
    assert sent["dropped"] == 0, sent
    assert (await stack.collector_samples())["ingested"] > 0
