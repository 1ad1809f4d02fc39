"""Lifecycle actions: state changes, the desired routes they commit (which one pass of
the reconciler publishes to the KV store), the events trail."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from controlplane.auth.roles import Role
from controlplane.controller.reconciler import RouteReconciler
from controlplane.db import experiments as records
from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.routes import Route, parse_route
from controlplane.runtime import Backends
from tests.support.auth import ADMIN_ACTOR, bearer

Create = Callable[..., Any]
Stored = Callable[..., Any]


@pytest.fixture
def reconciler() -> RouteReconciler:
    """The leader's reconciler, driven one pass at a time by the test."""
    return RouteReconciler()


@pytest.fixture
def stored_route(
    backends: Backends, reconciler: RouteReconciler
) -> Callable[..., Any]:
    """The service's route in the KV store after one reconciler pass."""

    async def read(service: str = "payment-api") -> Route | None:
        await reconciler.reconcile(backends, None)
        value = await backends.kv.get(backends.keys.route(service))
        return None if value is None else parse_route(value.value)

    return read


async def act(client: httpx.AsyncClient, experiment_id: int, action: str, **kw: Any) -> Any:
    response = await client.post(f"/v1/experiments/{experiment_id}/{action}", **kw)
    assert response.status_code == 200, response.text
    return response.json()


async def test_start_publishes_the_first_step_and_revisions_grow_to_promotion(
    client: httpx.AsyncClient, create: Create, stored_route: Stored
) -> None:
    experiment = await create()
    eid = experiment["id"]

    started = await act(client, eid, "start")
    assert (started["state"], started["current_step"], started["canary_weight_bp"]) == (
        "running",
        0,
        100,
    )
    route = await stored_route()
    assert route is not None
    assert route.experiment == eid and route.state == "running"
    assert route.salt == experiment["salt"] and route.sticky.header == "x-user-id"
    assert sum(v.weight for v in route.variants) == 10_000
    assert (route.weight_of("baseline"), route.weight_of("canary")) == (9_900, 100)
    revisions = [route.revision]

    for action, state, canary in [("pause", "paused", 100), ("resume", "running", 100)]:
        answered = await act(client, eid, action)
        assert answered["state"] == state
        route = await stored_route()
        assert route is not None
        assert route.state == state and route.weight_of("canary") == canary
        assert sum(v.weight for v in route.variants) == 10_000
        assert answered["route_revision"] == route.revision
        revisions.append(route.revision)

    # promoted: the canary is the stable version, alone in the route
    answered = await act(client, eid, "promote")
    route = await stored_route()
    assert route is not None and route.state == "promoted"
    assert [(v.name, v.upstream, v.weight) for v in route.variants] == [
        ("baseline", experiment["variants"]["canary"]["upstream"], 10_000)
    ]
    assert answered["route_revision"] == route.revision
    revisions.append(route.revision)
    assert revisions == sorted(set(revisions)), revisions


async def test_rollback_and_abort_send_everything_to_the_baseline(
    client: httpx.AsyncClient, create: Create, stored_route: Stored
) -> None:
    first = await create()
    await act(client, first["id"], "start")
    await act(client, first["id"], "rollback")
    route = await stored_route()
    assert route is not None and route.state == "rolled_back"
    assert [(v.name, v.upstream, v.weight) for v in route.variants] == [
        ("baseline", first["variants"]["baseline"]["upstream"], 10_000)
    ]

    second = await create()
    await act(client, second["id"], "start")
    await act(client, second["id"], "pause")
    aborted = await act(client, second["id"], "abort")
    assert aborted["state"] == "aborted"
    after = await stored_route()
    assert after is not None and after.experiment == second["id"]
    assert after.state == "rolled_back" and after.weight_of("canary") == 0
    assert after.revision > route.revision


async def test_aborting_a_draft_publishes_nothing(
    client: httpx.AsyncClient, create: Create, stored_route: Stored
) -> None:
    draft = await create(service="quiet-api")
    assert (await act(client, draft["id"], "abort"))["state"] == "aborted"
    assert await stored_route("quiet-api") is None


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
    client: httpx.AsyncClient, create: Create, stored_route: Stored
) -> None:
    first, second, elsewhere = await create(), await create(), await create(service="other")
    await act(client, first["id"], "start")
    await act(client, first["id"], "pause")
    refused = await client.post(f"/v1/experiments/{second['id']}/start")
    assert refused.status_code == 409
    assert f"experiment {first['id']}" in refused.json()["detail"]
    assert (await client.get(f"/v1/experiments/{second['id']}")).json()["state"] == "draft"
    route = await stored_route()
    assert route is not None and route.experiment == first["id"]

    await act(client, elsewhere["id"], "start")  # another service is free
    await act(client, first["id"], "promote")
    await act(client, second["id"], "start")  # free again once the first ended
    route = await stored_route()
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
    # the service's first start made its baseline the stable version; the rollback kept it
    baseline = {"upstream": experiment["variants"]["baseline"]["upstream"], "version": None}
    seeded, kept = events[1]["payload"]["release"], events[4]["payload"]["release"]
    assert (seeded["kind"], seeded["stable_before"], seeded["stable_after"]) == (
        "seeded", None, baseline
    )
    assert (kept["kind"], kept["stable_before"], kept["stable_after"]) == (
        "rolled_back", baseline, baseline
    )
    assert "release" not in events[2]["payload"] and "release" not in events[3]["payload"]
    revisions = [e["payload"]["route_revision"] for e in events[1:]]
    assert revisions == sorted(set(revisions))
    assert all(e["at"].endswith("Z") or e["at"].endswith("+00:00") for e in events)

    second = (await client.get(f"/v1/experiments/{eid}/events", params={"offset": 3})).json()
    assert [e["kind"] for e in second["items"]] == ["resume", "rollback"]


async def test_an_action_answers_after_the_commit_even_while_etcd_is_down(
    client: httpx.AsyncClient, create: Create, backends: Backends
) -> None:
    """No handler writes etcd: the route follows the commit, and the detail says it has
    not been seen in etcd."""
    experiment = await create()
    await backends.kv.close()  # the store is gone: every call raises BackendUnavailable
    started = await act(client, experiment["id"], "start")
    assert (started["state"], started["canary_weight_bp"]) == ("running", 100)
    detail = (await client.get(f"/v1/experiments/{experiment['id']}")).json()
    assert detail["route_revision"] == started["route_revision"] > 0
    assert detail["route_applied"] is None and "could not be read" in detail["route_note"]


async def test_the_detail_says_whether_etcd_holds_the_desired_route(
    client: httpx.AsyncClient, create: Create, stored_route: Stored
) -> None:
    experiment = await create()
    url = f"/v1/experiments/{experiment['id']}"
    assert (await client.get(url)).json()["route_applied"] is None  # a draft has no route
    await act(client, experiment["id"], "start")
    assert (await client.get(url)).json()["route_applied"] is False  # committed only
    route = await stored_route()
    detail = (await client.get(url)).json()
    assert route is not None and route.revision == detail["route_revision"]
    assert detail["route_applied"] is True


async def test_a_commit_that_fails_after_the_decision_leaves_nothing_in_etcd(
    client: httpx.AsyncClient, create: Create, stored_route: Stored,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    experiment = await create()
    eid = experiment["id"]
    running = await act(client, eid, "start")
    assert (await stored_route()) is not None
    record_event = records.record_event

    def fail_on_pause(**kwargs: Any) -> Any:
        if kwargs["kind"] == "pause":
            raise BackendUnavailable("injected: the database went away before the commit")
        return record_event(**kwargs)

    monkeypatch.setattr(records, "record_event", fail_on_pause)
    response = await client.post(f"/v1/experiments/{eid}/pause")
    assert response.status_code == 503
    monkeypatch.setattr(records, "record_event", record_event)

    route = await stored_route()
    assert route is not None and route.state == "running"
    assert route.revision == running["route_revision"]
    after = (await client.get(f"/v1/experiments/{eid}")).json()
    assert (after["state"], after["route_revision"], after["route_applied"]) == (
        "running", running["route_revision"], True
    )
    events = (await client.get(f"/v1/experiments/{eid}/events")).json()["items"]
    assert [e["kind"] for e in events] == ["created", "start"]


async def test_a_start_that_fails_to_commit_publishes_no_route(
    client: httpx.AsyncClient, create: Create, stored_route: Stored,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
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
    assert await stored_route() is None
    assert (await client.get(f"/v1/experiments/{eid}")).json()["state"] == "draft"

    # the user starts it again: it runs from its first step
    started = await act(client, eid, "start")
    route = await stored_route()
    assert route is not None and route.revision == started["route_revision"] == 1
    assert route.weight_of("canary") == started["canary_weight_bp"] > 0
