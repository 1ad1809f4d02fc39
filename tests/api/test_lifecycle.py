"""Lifecycle actions: state changes, routes published to the KV store, the events trail."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from controlplane.auth.roles import Role
from controlplane.controller.runner import Controller
from controlplane.db import experiments as records
from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.routes import Route, parse_route
from controlplane.runtime import Backends
from tests.support.auth import ADMIN_ACTOR, bearer

Create = Callable[..., Any]


async def stored_route(backends: Backends, service: str = "payment-api") -> Route | None:
    value = await backends.kv.get(backends.keys.route(service))
    return None if value is None else parse_route(value.value)


async def act(client: httpx.AsyncClient, experiment_id: int, action: str, **kw: Any) -> Any:
    response = await client.post(f"/v1/experiments/{experiment_id}/{action}", **kw)
    assert response.status_code == 200, response.text
    return response.json()


async def test_start_publishes_the_first_step_and_revisions_grow_to_promotion(
    client: httpx.AsyncClient, create: Create, backends: Backends
) -> None:
    experiment = await create()
    eid = experiment["id"]

    started = await act(client, eid, "start")
    assert (started["state"], started["current_step"], started["canary_weight_bp"]) == (
        "running",
        0,
        100,
    )
    route = await stored_route(backends)
    assert route is not None
    assert route.experiment == eid and route.state == "running"
    assert route.salt == experiment["salt"] and route.sticky.header == "x-user-id"
    assert sum(v.weight for v in route.variants) == 10_000
    assert (route.weight_of("baseline"), route.weight_of("canary")) == (9_900, 100)
    revisions = [route.revision]

    for action, state, canary in [
        ("pause", "paused", 100),
        ("resume", "running", 100),
        ("promote", "promoted", 10_000),
    ]:
        answered = await act(client, eid, action)
        assert answered["state"] == state
        route = await stored_route(backends)
        assert route is not None
        assert route.state == state and route.weight_of("canary") == canary
        assert sum(v.weight for v in route.variants) == 10_000
        assert answered["route_revision"] == route.revision
        revisions.append(route.revision)
    assert revisions == sorted(set(revisions)), revisions


async def test_rollback_and_abort_send_everything_to_the_baseline(
    client: httpx.AsyncClient, create: Create, backends: Backends
) -> None:
    first = await create()
    await act(client, first["id"], "start")
    await act(client, first["id"], "rollback")
    route = await stored_route(backends)
    assert route is not None and route.state == "rolled_back" and route.weight_of("canary") == 0

    second = await create()
    await act(client, second["id"], "start")
    await act(client, second["id"], "pause")
    aborted = await act(client, second["id"], "abort")
    assert aborted["state"] == "aborted"
    after = await stored_route(backends)
    assert after is not None and after.experiment == second["id"]
    assert after.state == "rolled_back" and after.weight_of("canary") == 0
    assert after.revision > route.revision


async def test_aborting_a_draft_publishes_nothing(
    client: httpx.AsyncClient, create: Create, backends: Backends
) -> None:
    draft = await create(service="quiet-api")
    assert (await act(client, draft["id"], "abort"))["state"] == "aborted"
    assert await stored_route(backends, "quiet-api") is None


async def test_illegal_transitions_answer_409_naming_the_current_state(
    client: httpx.AsyncClient, create: Create
) -> None:
    experiment = await create()
    url = f"/v1/experiments/{experiment['id']}"
    for action in ("pause", "resume", "promote", "rollback"):
        response = await client.post(f"{url}/{action}")
        assert response.status_code == 409, action
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["current_state"] == "draft"
        assert "'draft'" in problem["detail"]
    await act(client, experiment["id"], "start")
    await act(client, experiment["id"], "promote")
    response = await client.post(f"{url}/start")
    assert response.status_code == 409
    assert response.json()["current_state"] == "promoted"


async def test_one_running_or_paused_experiment_per_service(
    client: httpx.AsyncClient, create: Create, backends: Backends
) -> None:
    first, second, elsewhere = await create(), await create(), await create(service="other")
    await act(client, first["id"], "start")
    await act(client, first["id"], "pause")
    refused = await client.post(f"/v1/experiments/{second['id']}/start")
    assert refused.status_code == 409
    assert f"experiment {first['id']}" in refused.json()["detail"]
    assert (await client.get(f"/v1/experiments/{second['id']}")).json()["state"] == "draft"
    route = await stored_route(backends)
    assert route is not None and route.experiment == first["id"]

    await act(client, elsewhere["id"], "start")  # another service is free
    await act(client, first["id"], "promote")
    await act(client, second["id"], "start")  # free again once the first ended
    route = await stored_route(backends)
    assert route is not None and route.experiment == second["id"]


async def test_every_transition_is_an_event_naming_who_and_the_numbers(
    client: httpx.AsyncClient, create: Create
) -> None:
    experiment = await create()
    eid = experiment["id"]
    # the operator's token names who acts; a self-declared user name changes nothing
    alice = {**bearer(Role.OPERATOR), "X-Canary-User": "alice"}
    await act(client, eid, "start", headers=alice, json={"reason": "release 2.4"})
    await act(client, eid, "pause")
    await act(client, eid, "resume", headers=alice)
    await act(client, eid, "rollback")
    page = (await client.get(f"/v1/experiments/{eid}/events")).json()
    events = page["items"]
    assert page["total"] == 5
    assert [(e["kind"], e["from_state"], e["to_state"]) for e in events] == [
        ("created", None, "draft"),
        ("start", "draft", "running"),
        ("pause", "running", "paused"),
        ("resume", "paused", "running"),
        ("rollback", "running", "rolled_back"),
    ]
    operator, admin = "token:test-operator", ADMIN_ACTOR
    assert [e["actor"] for e in events] == [admin, operator, admin, operator, admin]
    assert events[1]["reason"] == "release 2.4"
    assert events[1]["payload"]["canary_weight_bp"] == 100
    assert events[4]["payload"]["canary_weight_bp"] == 0
    revisions = [e["payload"]["route_revision"] for e in events[1:]]
    assert revisions == sorted(set(revisions))
    assert all(e["at"].endswith("Z") or e["at"].endswith("+00:00") for e in events)

    second = (await client.get(f"/v1/experiments/{eid}/events", params={"offset": 3})).json()
    assert [e["kind"] for e in second["items"]] == ["resume", "rollback"]


async def test_a_failed_route_write_changes_nothing_and_answers_503(
    client: httpx.AsyncClient, create: Create, backends: Backends
) -> None:
    experiment = await create()
    await backends.kv.close()  # the store is gone: every call raises BackendUnavailable
    response = await client.post(f"/v1/experiments/{experiment['id']}/start")
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    after = (await client.get(f"/v1/experiments/{experiment['id']}")).json()
    assert (after["state"], after["current_step"], after["canary_weight_bp"]) == ("draft", -1, 0)
    events = (await client.get(f"/v1/experiments/{experiment['id']}/events")).json()
    assert [e["kind"] for e in events["items"]] == ["created"]


async def test_a_route_left_by_an_action_that_did_not_commit_is_reconciled_and_listed(
    client: httpx.AsyncClient, create: Create, backends: Backends,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    experiment = await create()
    eid = experiment["id"]
    await act(client, eid, "start")
    record_event = records.record_event

    def fail_on_pause(**kwargs: Any) -> Any:
        if kwargs["kind"] == "pause":
            raise BackendUnavailable("injected: the database went away before the commit")
        return record_event(**kwargs)

    monkeypatch.setattr(records, "record_event", fail_on_pause)
    response = await client.post(f"/v1/experiments/{eid}/pause")
    assert response.status_code == 503
    monkeypatch.setattr(records, "record_event", record_event)
    orphan = await stored_route(backends)
    assert orphan is not None and orphan.state == "paused"
    assert (await client.get(f"/v1/experiments/{eid}")).json()["state"] == "running"

    await Controller(identity="test").evaluate_all(backends, None)

    after = (await client.get(f"/v1/experiments/{eid}")).json()
    route = await stored_route(backends)
    assert route is not None and route.state == "running"
    assert route.revision == after["route_revision"] > orphan.revision
    events = (await client.get(f"/v1/experiments/{eid}/events")).json()["items"]
    assert [e["kind"] for e in events] == ["created", "start", "route_reconciled"]
    assert events[-1]["actor"] == "controller"
    assert events[-1]["payload"]["stored"]["revision"] == orphan.revision
    assert events[-1]["payload"]["restored"]["state"] == "running"


async def test_a_start_that_did_not_commit_is_undone_by_the_next_round_and_listed(
    client: httpx.AsyncClient, create: Create, backends: Backends,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The draft stays a draft: the route goes back to the baseline only, not deleted."""
    experiment = await create()
    eid = experiment["id"]
    record_event = records.record_event

    def fail_on_start(**kwargs: Any) -> Any:
        if kwargs["kind"] == "start":
            raise BackendUnavailable("injected: the database went away before the commit")
        return record_event(**kwargs)

    monkeypatch.setattr(records, "record_event", fail_on_start)
    response = await client.post(f"/v1/experiments/{eid}/start")
    assert response.status_code == 503
    monkeypatch.setattr(records, "record_event", record_event)
    orphan = await stored_route(backends)
    assert orphan is not None and orphan.experiment == eid and orphan.weight_of("canary") > 0
    assert (await client.get(f"/v1/experiments/{eid}")).json()["state"] == "draft"

    await Controller(identity="test").evaluate_all(backends, None)

    after = (await client.get(f"/v1/experiments/{eid}")).json()
    assert after["state"] == "draft"
    route = await stored_route(backends)
    assert route is not None and route.revision == after["route_revision"] > orphan.revision
    assert (route.state, route.weight_of("canary"), route.weight_of("baseline")) == (
        "rolled_back", 0, 10_000
    )
    events = (await client.get(f"/v1/experiments/{eid}/events")).json()["items"]
    assert [e["kind"] for e in events] == ["created", "route_reconciled"]
    assert events[-1]["actor"] == "controller"
    assert events[-1]["payload"]["stored"]["revision"] == orphan.revision
    assert events[-1]["payload"]["restored"]["from"] == "baseline_only"

    # the user starts it again: it runs from its first step
    started = await act(client, eid, "start")
    route = await stored_route(backends)
    assert route is not None and route.revision == started["route_revision"]
    assert route.weight_of("canary") == started["canary_weight_bp"] > 0
