"""A trip, a rollback and a promotion as ops tools see them: one decision log line
each (text and JSON), and the experiment's series on the API's /metrics, scraped with
a viewer token. The controller is driven round by round on a fake clock over the
real backends (and the embedded ones), as in test_controller_integration."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.api.app import create_app
from controlplane.auth.roles import Role
from controlplane.experiments.actions import apply_action, create_experiment
from controlplane.experiments.lifecycle import LifecycleAction
from controlplane.experiments.store import ExperimentSpec, StepSpec
from controlplane.kernel.logs import JsonFormatter
from controlplane.kernel.settings import Settings
from tests.api.conftest import API_BASE
from tests.controller.test_controller_integration import RULE, SERVICE, Rig
from tests.controller.test_controller_integration import rig as rig
from tests.support.auth import bearer, install_test_tokens

DECISIONS = "canary.decisions"


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(rig: Rig, settings: Settings) -> Samples:
    """/metrics as Prometheus reads it, with a viewer's token: (name, labels) → value."""
    install_test_tokens(settings.database_url)
    app = create_app(settings, backends=rig.backends)
    # as create_app does for the controller it runs (the rig drives this one itself)
    app.state.metrics.export(rig.controller)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=API_BASE, headers=bearer(Role.VIEWER)
        ) as http:
            answer = await http.get("/metrics")
    assert answer.status_code == 200, answer.text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def series(rig: Rig, **labels: str) -> frozenset[tuple[str, str]]:
    return frozenset({"experiment": str(rig.experiment_id), "service": SERVICE, **labels}.items())


def decision_lines(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records
        if r.name == DECISIONS and getattr(r, "structured", {}).get("event") == event
    ]


async def trip(rig: Rig) -> None:
    for _ in range(12):
        await rig.second(canary_ms=500)
        if (await rig.route())[0] == 0:
            return
    raise AssertionError("the slow canary did not trip")


async def test_a_trip_then_a_rollback_are_log_lines_and_series(
    rig: Rig, backend_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=DECISIONS)
    await trip(rig)

    [record] = decision_lines(caplog, "tripped")
    fields = record.structured  # type: ignore[attr-defined]
    assert (fields["experiment"], fields["service"], fields["actor"]) == (
        rig.experiment_id, SERVICE, "controller")
    assert (fields["from"], fields["to"]) == ("closed", "open")
    assert (fields["canary_bp_from"], fields["canary_bp_to"]) == (1000, 0)
    assert fields["guardrail"] == "latency" and fields["values"]["latency"]["breached"] is True
    assert fields["values"]["canary"]["percentile_ms"] > RULE.threshold_ms
    assert fields["summary"].startswith(f"tripped (trip 1 of {RULE.max_trips}): canary P95 ")
    assert f"> bound {RULE.threshold_ms:g} ms over the last" in fields["summary"]
    text = record.getMessage()
    assert text.startswith(
        f"event=tripped experiment={rig.experiment_id} service={SERVICE} actor=controller "
        "from=closed to=open canary_bp=1000->0 guardrail=latency latency.observed="
    )
    assert f"| {fields['summary']}" in text and "\n" not in text
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == fields["summary"] and line["logger"] == DECISIONS
    assert (line["event"], line["experiment"], line["to"]) == ("tripped", rig.experiment_id, "open")
    assert line["values"]["latency"]["bound"] == pytest.approx(0.05)

    metrics = await scrape(rig, backend_settings)
    assert metrics[("canary_experiment_status", series(rig, state="running"))] == 1
    assert metrics[("canary_experiment_breaker", series(rig, state="open"))] == 1
    assert metrics[("canary_experiment_canary_weight_percent", series(rig))] == 0
    assert metrics[("canary_experiment_trips_total", series(rig))] == 1
    assert metrics[("canary_experiment_guardrail_verdict", series(rig, guardrail="latency"))] == 2
    assert metrics[("canary_experiment_p95_seconds", series(rig, variant="canary"))] > 0.2
    assert metrics[("canary_experiment_p95_seconds", series(rig, variant="baseline"))] < 0.2
    assert metrics[("canary_service_trips_total", frozenset({("service", SERVICE)}))] == 1

    # the cooldown, the probe, and its failure: the max_trips-th trip rolls back
    for _ in range(int(RULE.cooldown_sec) + RULE.window_sec * 4):
        await rig.second(canary_ms=500)
        if (await rig.route())[1] == "rolled_back":
            break
    assert (await rig.route())[1] == "rolled_back"
    [probe] = decision_lines(caplog, "half_open")
    assert probe.structured["summary"].startswith("cooldown over: probing the canary at 5%")  # type: ignore[attr-defined]
    [rollback] = decision_lines(caplog, "rolled_back")
    assert rollback.structured["to"] == "rolled_back"  # type: ignore[attr-defined]
    assert rollback.structured["summary"].endswith("all traffic to the baseline")  # type: ignore[attr-defined]

    await rig.second(canary_ms=500)  # the round that sees it gone from the active ones
    metrics = await scrape(rig, backend_settings)
    assert metrics[("canary_experiment_status", series(rig, state="rolled_back"))] == 1
    assert ("canary_experiment_status", series(rig, state="running")) not in metrics
    assert metrics[("canary_service_rollbacks_total", frozenset({("service", SERVICE)}))] == 1
    assert metrics[("canary_service_promotions_total", frozenset({("service", SERVICE)}))] == 0


async def test_a_promotion_and_a_users_actions_are_log_lines_and_series(
    rig: Rig, backend_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=DECISIONS)

    async def act(experiment_id: int, action: LifecycleAction, reason: str = "") -> None:
        await apply_action(
            store=rig.backends.store, changes=rig.backends.route_changes, clock=rig.clock,
            experiment_id=experiment_id, action=action, actor="user:alice", reason=reason,
        )  # fmt: skip

    # the rig's experiment holds its steps 30 s: a user ends it for a quicker one,
    # once the controller has seen it (its board counts how the ones it saw ended)
    await rig.second(canary_ms=40)
    await act(rig.experiment_id, LifecycleAction.ABORT, "holds too long for this test")
    [abort] = decision_lines(caplog, "abort")
    assert abort.getMessage().startswith(
        f"event=abort experiment={rig.experiment_id} service={SERVICE} actor=user:alice "
        "from=running to=aborted canary_bp=0 "
    )
    assert abort.getMessage().endswith("| aborted by user:alice: holds too long for this test")
    quick = ExperimentSpec(
        name="checkout v3", service=SERVICE, baseline_upstream="http://127.0.0.1:9001",
        canary_upstream="http://127.0.0.1:9002", steps=(StepSpec(5000, 6), StepSpec(10000, 6)),
        sticky_header="x-user-id", sticky_cookie=None, rule=None,
    )  # fmt: skip
    created = await create_experiment(
        store=rig.backends.store, clock=rig.clock, spec=quick, actor="user:alice"
    )
    rig.experiment_id = created.id
    await act(created.id, LifecycleAction.START)
    await rig.controller.reconciler.reconcile(rig.backends, rig.fence)

    for _ in range(60):
        await rig.second(canary_ms=40)
        if (await rig.route())[1] == "promoted":
            break
    assert (await rig.route())[1] == "promoted"
    [step] = decision_lines(caplog, "step_advanced")
    assert step.structured["summary"].startswith("step 1 passed, canary 50% → 100% (step 2): ")  # type: ignore[attr-defined]
    assert "canary P95 " in step.structured["summary"]  # type: ignore[attr-defined]
    [promoted] = decision_lines(caplog, "promoted")
    fields = promoted.structured  # type: ignore[attr-defined]
    assert (fields["from"], fields["to"], fields["canary_bp_to"]) == ("running", "promoted", 10000)
    assert fields["summary"].startswith("promoted: every step passed, all traffic to the canary")

    await rig.second(canary_ms=40)
    metrics = await scrape(rig, backend_settings)
    assert metrics[("canary_experiment_status", series(rig, state="promoted"))] == 1
    assert metrics[("canary_experiment_canary_weight_percent", series(rig))] == 100
    assert metrics[("canary_service_promotions_total", frozenset({("service", SERVICE)}))] == 1
    # the aborted one counts as ended without promotion
    assert metrics[("canary_service_rollbacks_total", frozenset({("service", SERVICE)}))] == 1
