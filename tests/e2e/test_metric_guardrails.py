"""Provider metrics judged beside the samples, end to end, on a real Prometheus.

    `canary serve` with CANARY_PROMETHEUS_URL, two collectors, the sidecar, the
    upstreams; a real Prometheus scraping, every second, an exporter in this test
    whose per-variant counters and gauges the test drives

- a canary whose error ratio *in Prometheus* rises is tripped and rolled back while
  its latency, judged from the sidecar's samples, stays healthy;
- a canary whose memory gauge passes its bound is paused (the weight held, no trip),
  and resumes when the gauge falls back; with Prometheus stopped mid-rollout nothing
  trips, the step holds (no-data policy `hold`) and an event says why; the rollout is
  promoted once Prometheus answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.helpers import HOLD, RULE, THRESHOLD_MS, Launch, canary_window, controller_events
from tests.support.metrics_exporter import MetricsExporter, serving
from tests.support.prometheus import PrometheusProcess

pytestmark = [pytest.mark.e2e, pytest.mark.real, pytest.mark.timeout(240)]

APP = "shop"
ERRORS = f'sum(increase(app_errors_total{{app="{APP}",variant="$variant"}}[$window]))'
REQUESTS = f'sum(increase(app_requests_total{{app="{APP}",variant="$variant"}}[$window]))'
MEMORY = f'max(app_memory_bytes{{app="{APP}",variant="$variant"}})'


@dataclass
class Service:
    """What the service's own counters say, per variant, moved by a ticker."""

    exporter: MetricsExporter
    error_share: dict[str, float] = field(
        default_factory=lambda: {"baseline": 0.005, "canary": 0.005}
    )
    memory: dict[str, float] = field(
        default_factory=lambda: {"baseline": 2e8, "canary": 2e8}
    )
    requests: dict[str, float] = field(default_factory=lambda: {"baseline": 0.0, "canary": 0.0})
    errors: dict[str, float] = field(default_factory=lambda: {"baseline": 0.0, "canary": 0.0})

    def tick(self, seconds: float, rate: float = 200.0) -> None:
        for variant in ("baseline", "canary"):
            labels = {"app": APP, "variant": variant}
            self.requests[variant] += rate * seconds
            self.errors[variant] += rate * seconds * self.error_share[variant]
            self.exporter.counter("app_requests_total", labels, self.requests[variant])
            self.exporter.counter("app_errors_total", labels, self.errors[variant])
            self.exporter.gauge("app_memory_bytes", labels, self.memory[variant])


@contextlib.contextmanager
def prometheus_on(exporter: MetricsExporter) -> Iterator[PrometheusProcess]:
    with serving(exporter):
        prometheus = PrometheusProcess(exporter.port)
        prometheus.start()
        try:
            prometheus.wait_scraped()
            yield prometheus
        finally:
            prometheus.close()


@contextlib.asynccontextmanager
async def ticking(service: Service) -> AsyncIterator[None]:
    async def run() -> None:
        while True:
            service.tick(0.25)
            await asyncio.sleep(0.25)  # the counters' own pace, as a live service's

    task = asyncio.create_task(run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_canary_whose_prometheus_error_ratio_rises_is_cut_with_healthy_latency(
    launch: Launch,
) -> None:
    service = Service(MetricsExporter())
    service.tick(0)
    with prometheus_on(service.exporter) as prometheus:
        stack = await launch(env={"CANARY_PROMETHEUS_URL": prometheus.url})
        rule = {**RULE, "compare": "baseline", "metrics": [{
            "name": "error_ratio", "kind": "ratio", "query": ERRORS, "total_query": REQUESTS,
            "compare": "baseline", "margin": 0.01, "interval_sec": 1, "action": "stop",
        }]}  # fmt: skip
        await stack.put_rule(rule)
        async with ticking(service):
            experiment = await stack.create_and_start(
                "errors", [(10, HOLD), (25, HOLD), (50, HOLD), (100, HOLD)]
            )
            stack.start_load()
            raised: list[int] = []

            async def raise_errors(data: dict[str, Any]) -> None:
                if not raised and data["state"] == "running" and data["current_step"] >= 1:
                    service.error_share["canary"] = 0.2  # the sidecar sees nothing of it
                    raised.append(1)

            final = await stack.run_to_end(experiment, timeout=150, on_poll=raise_errors)

    assert raised, "the canary never reached its second step"
    assert final["state"] == "rolled_back", final
    events = await stack.events(experiment)
    trip = controller_events(events, "tripped")[0]
    evidence = trip["payload"]["evidence"]
    assert "error_ratio" in str(trip.get("reason")), str(trip)[:4000]
    guardrails = evidence["window"]["guardrails"]
    metric = guardrails["error_ratio"]
    assert metric["breached"] is True, metric
    # the window mixes the readings before and after the rise (a fast trip sees more of
    # the old 0%): well above its bound and a quarter of the raised 20% at least
    assert metric["observed"] > max(metric["bound"], 0.05), metric
    # the query as sent names the canary, and only by the label value
    assert any('variant="canary"' in q for q in str(evidence).split("'")), evidence
    # latency from the sidecar's samples was within its bound all along
    assert guardrails["latency"]["breached"] is False, guardrails["latency"]
    assert canary_window(trip)["p95_ms"] < THRESHOLD_MS


async def test_a_memory_gauge_pauses_then_resumes_and_prometheus_down_holds(
    launch: Launch,
) -> None:
    service = Service(MetricsExporter())
    service.tick(0)
    with prometheus_on(service.exporter) as prometheus:
        stack = await launch(env={"CANARY_PROMETHEUS_URL": prometheus.url})
        rule = {**RULE, "metrics": [{
            "name": "memory", "kind": "gauge", "query": MEMORY, "bound": 5e8,
            "interval_sec": 1, "action": "pause", "no_data": "hold",
        }]}  # fmt: skip
        await stack.put_rule(rule)
        async with ticking(service):
            experiment = await stack.create_and_start(
                "memory", [(10, HOLD), (50, HOLD), (100, HOLD)]
            )
            stack.start_load()
            phase: list[str] = []

            async def drive(data: dict[str, Any]) -> None:
                kinds = {e["kind"] for e in await stack.events(experiment)}
                if not phase and data["state"] == "running" and data["current_step"] >= 1:
                    service.memory["canary"] = 8e8
                    phase.append("high")
                elif phase == ["high"] and "guardrail_hold" in kinds:
                    assert data["trips"] == 0, data
                    service.memory["canary"] = 2e8
                    phase.append("low")
                elif phase == ["high", "low"] and "guardrail_released" in kinds:
                    prometheus.stop()
                    phase.append("down")
                elif phase[-1:] == ["down"] and _no_data_said(await stack.events(experiment)):
                    prometheus.start()
                    phase.append("up")

            final = await stack.run_to_end(experiment, timeout=200, on_poll=drive)

    assert phase == ["high", "low", "down", "up"], phase
    assert final["state"] == "promoted", final
    assert final["trips"] == 0, final
    events = await stack.events(experiment)
    hold = controller_events(events, "guardrail_hold")[0]
    assert "memory" in str(hold["payload"]), hold
    assert controller_events(events, "guardrail_released"), [e["kind"] for e in events]
    assert not controller_events(events, "tripped")


def _no_data_said(events: list[dict[str, Any]]) -> bool:
    """An event says the metric had no data because Prometheus did not answer."""
    for event in events:
        text = str(event.get("payload", ""))
        if event["kind"] == "no_data" and "memory" in text and "prometheus" in text.lower():
            return True
    return False
