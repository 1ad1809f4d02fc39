"""/v1/notifications: subscriptions (admins), deliveries (viewers), the test send, and
problem+json on bad input; on PostgreSQL + etcd and on SQLite + in-process stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from controlplane.auth.roles import Role
from controlplane.db.models import NotificationSubscription
from controlplane.kernel.clock import FakeClock
from controlplane.notify.dispatcher import Dispatcher
from controlplane.notify.signing import verify
from controlplane.runtime import Backends
from tests.support.auth import ADMIN_ACTOR, bearer
from tests.support.webhooks import Receiver, receiving

SUBSCRIPTIONS = "/v1/notifications/subscriptions"
DELIVERIES = "/v1/notifications/deliveries"


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


@pytest.fixture
def hook_url(receiver: Receiver) -> Iterator[str]:
    with receiving(receiver) as url:
        yield url


async def subscribe(client: httpx.AsyncClient, url: str, **fields: Any) -> dict[str, Any]:
    answer = await client.post(SUBSCRIPTIONS, json={"name": "ops", "url": url, **fields})
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


async def test_the_secret_and_full_url_are_shown_once_at_creation(
    client: httpx.AsyncClient, backends: Backends, hook_url: str
) -> None:
    created = await subscribe(client, hook_url, kinds=["trip", "promoted"], service="checkout")
    assert created["secret"].startswith("whsec_") and created["url"] == hook_url
    assert created["kinds"] == ["promoted", "tripped"]
    assert created["created_by"] == ADMIN_ACTOR and created["format"] == "json"
    origin = hook_url.rsplit("/", 1)[0] + "/…"

    listed = await client.get(SUBSCRIPTIONS)
    one = await client.get(f"{SUBSCRIPTIONS}/{created['id']}")
    for text in (listed.text, one.text):
        assert created["secret"] not in text and hook_url not in text
    assert listed.json()["total"] == 1 and listed.json()["items"][0]["url"] == origin
    assert one.json()["url"] == origin and "secret" not in one.json()

    def stored(*, session: Any) -> str:
        return str(session.scalar(select(NotificationSubscription.secret)))

    assert await backends.database.read(stored) == created["secret"]  # kept so it can sign


async def test_a_given_secret_is_used_and_a_patch_replaces_fields(
    client: httpx.AsyncClient, hook_url: str
) -> None:
    created = await subscribe(client, hook_url, secret="s" * 32, format="slack")
    assert created["secret"] == "s" * 32 and created["format"] == "slack"
    changed = await client.patch(
        f"{SUBSCRIPTIONS}/{created['id']}",
        json={"enabled": False, "kinds": ["srm"], "service": "cart"},
    )
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert (body["enabled"], body["kinds"], body["service"], body["name"]) == (
        False,
        ["srm_cleared", "srm_detected"],
        "cart",
        "ops",
    )
    back = await client.patch(f"{SUBSCRIPTIONS}/{created['id']}", json={"service": None})
    assert back.json()["service"] is None
    gone = await client.delete(f"{SUBSCRIPTIONS}/{created['id']}")
    assert gone.status_code == 204
    assert (await client.get(f"{SUBSCRIPTIONS}/{created['id']}")).status_code == 404


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"url": "http://169.254.169.254/latest"}, "url", "webhook host is a link-local"),
        ({"url": "http://metadata.google.internal/x"}, "url", "metadata"),
        ({"url": "http://user:pw@hooks.example.com/x"}, "url", "credentials"),
        ({"url": "ftp://hooks.example.com/x"}, "url", "http"),
        ({"url": "https://hooks.example.com/x?token=1"}, "url", "query"),
        ({"kinds": ["created"]}, "kinds", "neither a topic"),
        ({"kinds": ["trip"] * 65}, "kinds", "at most"),
        ({"format": "xml"}, "format", ""),
        ({"secret": "short"}, "secret", "at least"),
        ({"secret": "a b" * 20}, "secret", "spaces"),
        ({"enabled": "yes"}, "enabled", ""),
        ({"service": "Not A Service"}, "service", ""),
        ({"name": "bell\u0007"}, "name", "control"),
        ({"extra": 1}, "extra", ""),
    ],
)
async def test_bad_input_is_a_422_problem_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], field: str, says: str
) -> None:
    answer = await client.post(
        SUBSCRIPTIONS, json={"name": "x", "url": "https://hooks.example.com/services/1", **body}
    )
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert any(field in [str(p) for p in e["loc"]] for e in problem["errors"]), problem
    assert says in json.dumps(problem)
    assert "pw@" not in answer.text


async def test_the_allow_list_limits_webhook_hosts(
    client: httpx.AsyncClient, settings: Any
) -> None:
    limited = settings.model_copy(update={"notify_allow": "hooks.example.com"})
    from controlplane.api.deps import get_settings

    client_app = client._transport.app  # type: ignore[attr-defined]
    client_app.dependency_overrides[get_settings] = lambda: limited
    refused = await client.post(SUBSCRIPTIONS, json={"name": "x", "url": "https://evil.example/x"})
    assert refused.status_code == 422
    assert "webhook host is not in the allowed hosts (CANARY_NOTIFY_ALLOW)" in refused.text
    allowed = await client.post(
        SUBSCRIPTIONS, json={"name": "y", "url": "https://hooks.example.com/x"}
    )
    assert allowed.status_code == 201, allowed.text


async def test_names_are_unique_and_unknown_ids_are_404(
    client: httpx.AsyncClient, hook_url: str
) -> None:
    await subscribe(client, hook_url)
    again = await client.post(SUBSCRIPTIONS, json={"name": "ops", "url": hook_url})
    assert again.status_code == 409 and again.headers["content-type"] == "application/problem+json"
    for ref in ("987654", str(2**40)):
        assert (await client.get(f"{SUBSCRIPTIONS}/{ref}")).status_code == 404
        assert (await client.delete(f"{SUBSCRIPTIONS}/{ref}")).status_code == 404


async def test_the_test_send_reaches_the_receiver_signed(
    client: httpx.AsyncClient, receiver: Receiver, hook_url: str, clock: FakeClock
) -> None:
    created = await subscribe(client, hook_url)
    answer = await client.post(f"{SUBSCRIPTIONS}/{created['id']}/test")
    assert answer.json() == {"delivered": True, "status": 200, "error": None, "event_id": 0}
    [request] = receiver.received()
    assert verify(
        created["secret"],
        timestamp=request.headers["x-canary-timestamp"],
        signature_value=request.headers["x-canary-signature"],
        body=request.body,
        now=clock.now(),
    )
    assert json.loads(request.body)["evidence"]["sample"] is True
    receiver.answer(500)
    failed = (await client.post(f"{SUBSCRIPTIONS}/{created['id']}/test")).json()
    assert failed == {"delivered": False, "status": 500, "error": "HTTP 500", "event_id": 0}


async def test_deliveries_are_listed_per_experiment_paginated_for_viewers(
    client: httpx.AsyncClient, backends: Backends, hook_url: str, create: Any
) -> None:
    await subscribe(client, hook_url)
    first, second = await create(), await create(service="cart")
    for experiment in (first, second):
        started = await client.post(f"/v1/experiments/{experiment['id']}/start")
        assert started.status_code == 200, started.text
    await client.post(f"/v1/experiments/{first['id']}/pause")
    dispatcher = Dispatcher(identity="t", rand=lambda: 0.0)
    # one delivery per experiment a round: the pause waits for the start
    assert [await dispatcher.run_once(backends) for _ in range(3)] == [2, 1, 0]

    viewer = bearer(Role.VIEWER)
    page = await client.get(
        DELIVERIES, params={"experiment": first["id"], "limit": 1}, headers=viewer
    )
    assert page.status_code == 200, page.text
    body = page.json()
    assert (body["total"], body["limit"], body["offset"]) == (2, 1, 0)
    [newest] = body["items"]
    assert (newest["kind"], newest["status"], newest["attempts"]) == ("pause", "delivered", 1)
    assert newest["subscription_name"] == "ops" and newest["last_status"] == 200
    rest = (
        await client.get(
            DELIVERIES, params={"experiment": first["id"], "offset": 1}, headers=viewer
        )
    ).json()
    assert [d["kind"] for d in rest["items"]] == ["start"]
    every = (await client.get(DELIVERIES, headers=viewer)).json()
    assert every["total"] == 3
    assert (await client.get(DELIVERIES, params={"status": "failed"})).json()["total"] == 0


@pytest.mark.parametrize(
    "params",
    [
        {"experiment": "0"},
        {"experiment": str(2**31)},
        {"experiment": "x"},
        {"status": "lost"},
        {"limit": "0"},
        {"limit": "501"},
        {"offset": "-1"},
    ],
)
async def test_bad_delivery_queries_are_422_problems(
    client: httpx.AsyncClient, params: dict[str, str]
) -> None:
    answer = await client.get(DELIVERIES, params=params)
    assert answer.status_code == 422
    assert answer.headers["content-type"] == "application/problem+json"
