"""The API says where a rollout stands and what each event was, in words, beside the
numbers: `summary` on experiments (relative times in the live view) and on events."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from controlplane.decision.words import iso_time
from controlplane.kernel.clock import FakeClock
from tests.support.auth import ADMIN_ACTOR


async def test_experiments_and_events_carry_their_sentences(
    client: httpx.AsyncClient, create: Callable[..., Any], clock: FakeClock
) -> None:
    created = await create()
    assert created["summary"] == "draft: not started"
    url = f"/v1/experiments/{created['id']}"
    assert (await client.post(f"{url}/start")).status_code == 200
    clock.advance(20)
    due = iso_time(clock.now() + 40)

    shown = (await client.get(url)).json()
    assert shown["summary"] == f"holding step 1 of 4 (1%) until {due}"
    assert shown["live"]["summary"] == f"holding step 1 of 4 (1%) until {due[11:]} (in 40 s)"
    [listed] = (await client.get("/v1/experiments")).json()["items"]
    assert listed["summary"] == shown["summary"]

    assert (
        await client.post(f"{url}/pause", json={"reason": "change freeze"})
    ).status_code == 200
    events = (await client.get(f"{url}/events")).json()["items"]
    said = {e["kind"]: e["summary"] for e in events}
    assert said["start"] == f"started by {ADMIN_ACTOR}"
    assert said["pause"] == f"paused by {ADMIN_ACTOR}: change freeze"
    assert (await client.get(url)).json()["summary"] == (
        "paused at step 1 of 4, canary at 1%, until someone resumes it"
    )


async def test_a_rule_change_is_a_decision_log_line(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="canary.decisions")
    rule = {"threshold_ms": 800, "window_sec": 60, "failure_ratio": 0.3, "percentile": 95}
    assert (await client.put("/v1/services/payment-api/rule", json=rule)).status_code == 200
    [line] = [r.getMessage() for r in caplog.records if r.name == "canary.decisions"]
    assert line == (
        f"event=rule_changed experiment=- service=payment-api actor={ADMIN_ACTOR} from=- to=- "
        f"trace_id=- | breaker rule created by {ADMIN_ACTOR}"
    )
