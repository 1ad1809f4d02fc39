"""/v1/services/{service}/overload: SQL holds the config and logs each change, the
leader publishes it where the sidecars watch (etcd), and the API says whether it has
(`applied`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import httpx

from controlplane.db import experiments as records
from controlplane.kernel.overload import OverloadConfig, parse_overload
from controlplane.runtime import Backends
from tests.support.auth import ADMIN_ACTOR

CONFIG = {"max_limit": 200, "queue_timeout_ms": 40, "low_priority_paths": ["/batch/"]}
URL = "/v1/services/payment-api/overload"
READ_ONLY = ("applied", "applied_note")
Publish = Callable[[], Awaitable[None]]


async def test_put_commits_what_the_leader_publishes_for_sidecars_and_get_reads_it_back(
    client: httpx.AsyncClient, backends: Backends, publish: Publish
) -> None:
    response = await client.put(URL, json=CONFIG)
    assert response.status_code == 200, response.text
    answered = response.json()
    assert answered["service"] == "payment-api"
    assert answered["max_limit"] == 200 and answered["min_limit"] == 1  # defaults filled
    assert answered["applied"] is False
    key = backends.keys.overload("payment-api")
    assert await backends.kv.get(key) is None, "the API writes SQL only"
    await publish()
    stored = await backends.kv.get(key)
    assert stored is not None
    # the stored value is the sidecars' schema: no service field (the key names it)
    assert "service" not in json.loads(stored.value)
    config = parse_overload(stored.value)
    assert config.max_limit == 200 and config.low_priority_paths == ("/batch/",)

    fetched = await client.get(URL)
    assert fetched.status_code == 200
    assert fetched.json() == {**answered, "applied": True, "applied_note": None}

    # a change made in etcd by hand is reported as not in force, then undone
    await backends.kv.put(
        stored.key, config.model_copy(update={"max_limit": 50}).model_dump_json().encode()
    )
    held = (await client.get(URL)).json()
    assert (held["max_limit"], held["applied"]) == (200, False)
    await publish()
    restored = await backends.kv.get(key)
    assert restored is not None and parse_overload(restored.value).max_limit == 200
    assert (await client.get(URL)).json()["applied"] is True


async def test_each_change_and_the_removal_are_service_events_in_sql(
    client: httpx.AsyncClient, backends: Backends, publish: Publish
) -> None:
    await client.put(URL, json=CONFIG)
    await client.put(URL, json={**CONFIG, "service": "payment-api"})  # no change: no event
    await client.put(URL, json={**CONFIG, "shed_status": 503})
    await publish()
    assert await backends.kv.get(backends.keys.overload("payment-api")) is not None
    removed = await client.delete(URL)
    assert removed.status_code == 204 and removed.content == b""
    assert (await client.get(URL)).status_code == 404
    await publish()
    assert await backends.kv.get(backends.keys.overload("payment-api")) is None
    events, total = await backends.database.read(records.list_events, service="payment-api")
    assert total == 3
    assert all(e.kind == "overload_changed" and e.experiment_id is None for e in events)
    assert all(e.actor == ADMIN_ACTOR for e in events)
    assert events[0].payload["previous"] is None
    assert events[1].payload["previous"]["shed_status"] == 429
    assert events[1].payload["overload"]["shed_status"] == 503
    assert events[2].payload["overload"] is None
    assert events[2].payload["previous"]["shed_status"] == 503
    assert "removed" in events[2].reason


async def test_an_empty_body_is_protection_with_every_default(client: httpx.AsyncClient) -> None:
    response = await client.put(URL, json={})
    assert response.status_code == 200, response.text
    config = {k: v for k, v in response.json().items() if k not in READ_ONLY}
    assert config == {**OverloadConfig().model_dump(mode="json"), "service": "payment-api"}


async def test_invalid_configs_answer_422_naming_the_fields(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    cases = [
        ({"max_limit": 0}, "body.max_limit"),
        ({"max_limit": 100_001}, "body.max_limit"),
        ({"max_limit": "10"}, "body.max_limit"),
        ({"max_limit": True}, "body.max_limit"),
        ({"queue_timeout_ms": -1}, "body.queue_timeout_ms"),
        ({"light_shed_share": 1.5}, "body.light_shed_share"),
        ({"shed_status": 500}, "body.shed_status"),
        ({"low_priority_paths": ["batch"]}, "body.low_priority_paths.0"),
        ({"low_priority_paths": ["/a b"]}, "body.low_priority_paths.0"),
        ({"low_priority_paths": ["/x"] * 65}, "body.low_priority_paths"),
        ({"limit": 10}, "body.limit"),
        ({"service": "other-api"}, "body.service"),
        ({"min_limit": 10, "max_limit": 5}, "body"),
        ({"light_at": 2.0, "heavy_at": 1.5}, "body"),
    ]
    for body, path in cases:
        response = await client.put(URL, json=body)
        assert response.status_code == 422, body
        assert response.headers["content-type"] == "application/problem+json"
        paths = [".".join(map(str, e["loc"])) for e in response.json()["errors"]]
        assert path in paths, (body, paths)
    assert (await client.put("/v1/services/Not%20A%20Service/overload", json={})).status_code == 422
    # nothing was written by any of them
    assert await backends.kv.get(backends.keys.overload("payment-api")) is None


async def test_missing_config_answers_404_to_get_and_delete(client: httpx.AsyncClient) -> None:
    for method in ("GET", "DELETE"):
        response = await client.request(method, "/v1/services/nobody/overload")
        assert response.status_code == 404, method
        assert response.headers["content-type"] == "application/problem+json"


async def test_a_malformed_config_in_etcd_is_reported_as_not_in_force_then_replaced(
    client: httpx.AsyncClient, backends: Backends, publish: Publish
) -> None:
    assert (await client.put(URL, json=CONFIG)).status_code == 200
    key = backends.keys.overload("payment-api")
    for bad in (json.dumps({"max_limit": -5}).encode(), b"{not json", b"\x00\x01",
                json.dumps({"max_limit": 200, "limit": 3}).encode()):
        await backends.kv.put(key, bad)
        answer = (await client.get(URL)).json()
        assert (answer["max_limit"], answer["applied"]) == (200, False), bad
        assert "unreadable" in answer["applied_note"]
        await publish()
        assert (await client.get(URL)).json()["applied"] is True
    # the trail holds the API's changes only: one, the PUT
    events, _ = await backends.database.read(records.list_events, service="payment-api")
    assert [e.kind for e in events if e.actor == ADMIN_ACTOR] == ["overload_changed"]


async def test_a_second_delete_answers_404_and_logs_nothing(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    assert (await client.put(URL, json=CONFIG)).status_code == 200
    assert (await client.delete(URL)).status_code == 204
    again = await client.delete(URL)
    assert again.status_code == 404
    _, total = await backends.database.read(records.list_events, service="payment-api")
    assert total == 2


async def test_after_a_delete_the_404_says_etcd_holds_it_until_the_leader_removes_it(
    client: httpx.AsyncClient, backends: Backends, publish: Publish
) -> None:
    assert (await client.put(URL, json=CONFIG)).status_code == 200
    await publish()
    assert (await client.delete(URL)).status_code == 204
    pending = await client.get(URL)
    assert pending.status_code == 404
    assert "etcd still holds one" in pending.json()["detail"]
    await publish()
    gone = await client.get(URL)
    assert gone.status_code == 404 and "etcd" not in gone.json()["detail"]
