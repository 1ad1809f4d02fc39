"""A service's release lifecycle through the API (decision 0051): the stable version a
new experiment takes as its baseline, what promotion, rollback and abort do to it and
to the route, and GET /v1/services/{service}/releases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from controlplane.auth.roles import Role
from controlplane.controller.reconciler import RouteReconciler
from controlplane.kernel.routes import Route, parse_route
from controlplane.runtime import Backends
from tests.api.conftest import experiment_body
from tests.support.auth import ADMIN_ACTOR, bearer

Create = Callable[..., Any]
V1, V2, V3 = (f"http://payments-v{n}:8080" for n in (1, 2, 3))


@pytest.fixture
def stored_route(backends: Backends) -> Callable[..., Any]:
    """The service's route in the KV store after one reconciler pass."""
    reconciler = RouteReconciler()

    async def read(service: str = "payment-api") -> Route | None:
        await reconciler.reconcile(backends, None)
        value = await backends.kv.get(backends.keys.route(service))
        return None if value is None else parse_route(value.value)

    return read


async def act(client: httpx.AsyncClient, experiment_id: int, action: str) -> Any:
    response = await client.post(f"/v1/experiments/{experiment_id}/{action}")
    assert response.status_code == 200, response.text
    return response.json()


async def releases(client: httpx.AsyncClient, service: str = "payment-api", **params: Any) -> Any:
    response = await client.get(f"/v1/services/{service}/releases", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def variants(route: Route) -> list[tuple[str, str, int]]:
    return [(v.name, v.upstream, v.weight) for v in route.variants]


def next_release(canary: str, version: str | None = None) -> dict[str, Any]:
    """An experiment body that leaves its baseline out."""
    return {"canary": {"upstream": canary, "version": version}}


async def test_a_service_without_a_stable_version_needs_a_baseline(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/experiments", json=experiment_body(variants=next_release(V2))
    )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "no stable version" in problem["detail"]
    assert [e["loc"] for e in problem["errors"]] == [["body", "variants", "baseline"]]
    history = await releases(client)
    assert (history["stable"], history["items"], history["total"]) == (None, [], 0)


async def test_two_releases_in_a_row_the_second_from_the_first_ones_promoted_version(
    client: httpx.AsyncClient, create: Create, stored_route: Callable[..., Any]
) -> None:
    first = await create(variants={"baseline": {"upstream": V1, "version": "v1"},
                                   "canary": {"upstream": V2, "version": "v2"}})
    assert not first["baseline_follows_stable"]
    await act(client, first["id"], "start")
    seeded = await releases(client)
    assert (seeded["stable"]["upstream"], seeded["stable"]["version"]) == (V1, "v1")
    assert seeded["stable"]["experiment_id"] == first["id"]
    await act(client, first["id"], "promote")
    route = await stored_route()
    assert route is not None and route.state == "promoted"
    assert variants(route) == [("baseline", V2, 10_000)]

    second = await create(name="payments v3", variants=next_release(V3, "v3"))
    assert second["baseline_follows_stable"]
    assert second["variants"]["baseline"] == {"upstream": V2, "version": "v2"}
    started = await act(client, second["id"], "start")
    assert started["variants"]["baseline"] == {"upstream": V2, "version": "v2"}
    route = await stored_route()
    assert route is not None and route.experiment == second["id"]
    assert variants(route) == [("baseline", V2, 9_900), ("canary", V3, 100)]
    await act(client, second["id"], "rollback")
    route = await stored_route()
    assert route is not None and route.state == "rolled_back"
    assert variants(route) == [("baseline", V2, 10_000)]  # the stable version stays

    history = await releases(client)
    assert (history["stable"]["upstream"], history["stable"]["version"]) == (V2, "v2")
    assert history["stable"]["experiment_id"] == first["id"]
    assert history["total"] == 3
    v1, v2 = {"upstream": V1, "version": "v1"}, {"upstream": V2, "version": "v2"}
    assert [
        (r["kind"], r["experiment_id"], r["stable_before"], r["stable_after"], r["actor"])
        for r in history["items"]
    ] == [
        ("rolled_back", second["id"], v2, v2, ADMIN_ACTOR),
        ("promoted", first["id"], v1, v2, ADMIN_ACTOR),
        ("seeded", first["id"], None, v1, ADMIN_ACTOR),
    ]
    assert "promoted v2 (http://payments-v2:8080) to stable" in history["items"][1]["reason"]
    page = await releases(client, limit=1, offset=1)
    assert [r["kind"] for r in page["items"]] == ["promoted"] and page["total"] == 3


async def test_the_action_events_carry_the_release(
    client: httpx.AsyncClient, create: Create
) -> None:
    first = await create()
    await act(client, first["id"], "start")
    await act(client, first["id"], "promote")
    events = (await client.get(f"/v1/experiments/{first['id']}/events")).json()["items"]
    by_kind = {e["kind"]: e["payload"] for e in events}
    assert by_kind["start"]["release"]["kind"] == "seeded"
    promoted = by_kind["promote"]["release"]
    assert (promoted["kind"], promoted["stable_before"], promoted["stable_after"]) == (
        "promoted", {"upstream": V1, "version": None}, {"upstream": V2, "version": None}
    )


async def test_a_draft_made_while_another_release_runs_starts_from_its_promotion(
    client: httpx.AsyncClient, create: Create, stored_route: Callable[..., Any]
) -> None:
    """The next release is prepared before the current one ends: left without a
    baseline, it takes the stable version as it is when it starts, not when it was made."""
    first = await create()
    await act(client, first["id"], "start")
    draft = await create(name="payments v3", variants=next_release(V3))
    assert draft["variants"]["baseline"]["upstream"] == V1  # the stable version now
    await act(client, first["id"], "promote")
    started = await act(client, draft["id"], "start")
    assert started["variants"]["baseline"]["upstream"] == V2
    route = await stored_route()
    assert route is not None and variants(route) == [("baseline", V2, 9_900), ("canary", V3, 100)]
    events = (await client.get(f"/v1/experiments/{draft['id']}/events")).json()["items"]
    start = next(e for e in events if e["kind"] == "start")
    assert start["payload"]["baseline"] == {"upstream": V2, "version": None}
    assert "release" not in start["payload"]  # the stable version did not move
    assert [r["kind"] for r in (await releases(client))["items"]] == ["promoted", "seeded"]


async def test_a_baseline_given_by_hand_other_than_the_stable_version_rebases_it(
    client: httpx.AsyncClient, create: Create
) -> None:
    first = await create()
    await act(client, first["id"], "start")
    await act(client, first["id"], "abort")
    second = await create(variants={"baseline": {"upstream": V3}, "canary": {"upstream": V2}})
    assert not second["baseline_follows_stable"]
    await act(client, second["id"], "start")
    history = await releases(client)
    assert [(r["kind"], r["stable_after"]["upstream"]) for r in history["items"]] == [
        ("rebased", V3), ("aborted", V1), ("seeded", V1)
    ]
    assert history["stable"]["upstream"] == V3


async def test_editing_the_variants_of_a_draft_ends_following_the_stable_version(
    client: httpx.AsyncClient, create: Create
) -> None:
    first = await create()
    await act(client, first["id"], "start")
    draft = await create(name="next", variants=next_release(V3))
    named = await client.patch(f"/v1/experiments/{draft['id']}", json={"name": "next one"})
    assert named.status_code == 200 and named.json()["baseline_follows_stable"]
    edited = await client.patch(f"/v1/experiments/{draft['id']}", json={
        "variants": {"baseline": {"upstream": V2}, "canary": {"upstream": V3, "version": "v3"}}
    })  # fmt: skip
    assert edited.status_code == 200, edited.text
    assert not edited.json()["baseline_follows_stable"]
    assert edited.json()["variants"]["canary"]["version"] == "v3"


@pytest.mark.parametrize("version", ["", "-v1", "v 1", "v1/2", "x" * 65])
async def test_a_malformed_version_label_is_refused(
    client: httpx.AsyncClient, version: str
) -> None:
    body = experiment_body(variants={"baseline": {"upstream": V1},
                                     "canary": {"upstream": V2, "version": version}})
    response = await client.post("/v1/experiments", json=body)
    assert response.status_code == 422, response.text


async def test_a_viewer_reads_the_releases_and_a_bad_service_name_is_refused(
    client: httpx.AsyncClient,
) -> None:
    viewer = await client.get("/v1/services/payment-api/releases", headers=bearer(Role.VIEWER))
    assert viewer.status_code == 200
    anonymous = await client.get(
        "/v1/services/payment-api/releases", headers={"Authorization": ""}
    )
    assert anonymous.status_code == 401
    bad = await client.get("/v1/services/Not_A_Service/releases")
    assert bad.status_code == 422
