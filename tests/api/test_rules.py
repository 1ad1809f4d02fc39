"""/v1/services/{service}/rule: SQL holds the rule and logs each change, the leader
publishes it to etcd, and the API says whether it has (`applied`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from controlplane.db import experiments as records
from controlplane.db.models import DesiredConfig
from controlplane.kernel.rules import parse_rule
from controlplane.runtime import Backends
from tests.support.auth import ADMIN_ACTOR

Publish = Callable[[], Awaitable[None]]

RULE = {"threshold_ms": 800, "window_sec": 60, "failure_ratio": 0.3, "percentile": 95}


def rule_of(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in ("applied", "applied_note")}


async def test_put_commits_the_rule_the_leader_publishes_and_get_says_when_it_is_in_force(
    client: httpx.AsyncClient, backends: Backends, publish: Publish
) -> None:
    response = await client.put("/v1/services/payment-api/rule", json=RULE)
    assert response.status_code == 200, response.text
    answered = response.json()
    assert answered["service"] == "payment-api" and answered["threshold_ms"] == 800
    assert answered["applied"] is False and "not published yet" in answered["applied_note"]
    key = backends.keys.rule("payment-api")
    assert await backends.kv.get(key) is None, "the API writes SQL only"

    await publish()
    stored = await backends.kv.get(key)
    assert stored is not None and parse_rule(stored.value).threshold_ms == 800
    fetched = await client.get("/v1/services/payment-api/rule")
    assert fetched.status_code == 200
    assert fetched.json() == {**rule_of(answered), "applied": True, "applied_note": None}

    # a change made in etcd by hand is no rule of the API's: it answers the committed
    # rule, not in force, until the leader's next pass puts it back
    changed = parse_rule(stored.value).model_copy(update={"threshold_ms": 950.0})
    await backends.kv.put(key, changed.to_json().encode())
    held = (await client.get("/v1/services/payment-api/rule")).json()
    assert (held["threshold_ms"], held["applied"]) == (800, False)
    assert "another one" in held["applied_note"]
    await publish()
    restored = await backends.kv.get(key)
    assert restored is not None and parse_rule(restored.value).threshold_ms == 800
    assert (await client.get("/v1/services/payment-api/rule")).json()["applied"] is True


async def test_what_a_get_answered_can_be_put_back_as_it_is(
    client: httpx.AsyncClient, publish: Publish
) -> None:
    await client.put("/v1/services/payment-api/rule", json=RULE)
    await publish()
    answered = (await client.get("/v1/services/payment-api/rule")).json()
    again = await client.put("/v1/services/payment-api/rule", json=answered)
    assert again.status_code == 200, again.text
    assert again.json() == answered, "no change, and still in force"


async def test_each_change_is_a_service_event_in_sql(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    headers = {"X-Canary-User": "bob"}  # not who the trail names: the token is
    await client.put("/v1/services/payment-api/rule", json=RULE, headers=headers)
    await client.put("/v1/services/payment-api/rule", json=RULE, headers=headers)  # no change
    await client.put(
        "/v1/services/payment-api/rule", json={**RULE, "service": "payment-api", "max_trips": 5}
    )
    events, total = await backends.database.read(records.list_events, service="payment-api")
    assert total == 2
    assert all(e.kind == "rule_changed" and e.experiment_id is None for e in events)
    assert events[0].actor == ADMIN_ACTOR and events[0].payload["previous"] is None
    assert events[1].payload["previous"]["max_trips"] == 3
    assert events[1].payload["rule"]["max_trips"] == 5


async def test_invalid_rules_answer_422_naming_the_fields(client: httpx.AsyncClient) -> None:
    cases = [
        ({**RULE, "threshold_ms": 0}, "body.threshold_ms"),
        ({**RULE, "percentile": 97}, "body.percentile"),
        ({**RULE, "failure_ratio": 1.5}, "body.failure_ratio"),
        ({**RULE, "compare": "median"}, "body.compare"),
        ({**RULE, "service": "other-api"}, "body.service"),
        ({"window_sec": 60}, "body.threshold_ms"),
        ({**RULE, "grpc_failure_codes": [14, 17]}, "body.grpc_failure_codes"),
        ({**RULE, "grpc_failure_codes": "all"}, "body.grpc_failure_codes.literal['nonzero']"),
        ({**RULE, "grpc_failure_codes": ["14"]}, "body.grpc_failure_codes.list[int].0"),
    ]
    for body, path in cases:
        response = await client.put("/v1/services/payment-api/rule", json=body)
        assert response.status_code == 422, body
        assert response.headers["content-type"] == "application/problem+json"
        paths = [".".join(map(str, e["loc"])) for e in response.json()["errors"]]
        assert path in paths, (body, paths)
    bad_service = await client.put("/v1/services/Not%20A%20Service/rule", json=RULE)
    assert bad_service.status_code == 422


async def test_missing_rule_answers_404(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/services/nobody/rule")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


async def test_a_malformed_rule_in_etcd_is_reported_as_not_in_force_then_replaced(
    client: httpx.AsyncClient, backends: Backends, publish: Publish
) -> None:
    assert (await client.put("/v1/services/payment-api/rule", json=RULE)).status_code == 200
    key = backends.keys.rule("payment-api")
    for bad in (json.dumps({"service": "payment-api", "threshold_ms": -5}).encode(),
                b"{not json", b"\xff\xfe garbage", b"[1, 2, 3]"):
        await backends.kv.put(key, bad)
        answer = (await client.get("/v1/services/payment-api/rule")).json()
        assert (answer["threshold_ms"], answer["applied"]) == (800, False), bad
        assert "unreadable" in answer["applied_note"]
        await publish()
        assert (await client.get("/v1/services/payment-api/rule")).json()["applied"] is True
    assert (await client.get("/healthz")).status_code == 200


async def test_an_unreadable_rule_in_sql_is_reported_not_fatal(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    assert (await client.put("/v1/services/payment-api/rule", json=RULE)).status_code == 200

    def break_row(*, session: Any) -> None:
        row = session.get(DesiredConfig, ("rule", "payment-api"))
        row.document = {"service": "payment-api", "threshold_ms": -5}

    async with backends.database.transaction() as tx:
        await tx.run(break_row)
    response = await client.get("/v1/services/payment-api/rule")
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/problem+json"
    assert "invalid" in response.json()["detail"]
    # a valid PUT replaces it
    assert (await client.put("/v1/services/payment-api/rule", json=RULE)).status_code == 200
    assert (await client.get("/v1/services/payment-api/rule")).status_code == 200


async def test_a_rule_chooses_how_overload_is_judged_and_refuses_anything_else(
    client: httpx.AsyncClient, backends: Backends, publish: Publish
) -> None:
    response = await client.put("/v1/services/batch-api/rule", json={**RULE, "overload": "judge"})
    assert response.status_code == 200, response.text
    assert response.json()["overload"] == "judge"
    await publish()
    stored = await backends.kv.get(backends.keys.rule("batch-api"))
    assert stored is not None and json.loads(stored.value)["overload"] == "judge"
    # hold, the default, is stored as before the field existed: older readers accept it
    held = await client.put("/v1/services/batch-api/rule", json={**RULE, "overload": "hold"})
    assert held.status_code == 200 and held.json().get("overload", "hold") == "hold"
    await publish()
    plain = await backends.kv.get(backends.keys.rule("batch-api"))
    assert plain is not None and "overload" not in json.loads(plain.value)
    for value in ("ignore", "HOLD", "", 1, None, ["hold"]):
        bad = await client.put("/v1/services/batch-api/rule", json={**RULE, "overload": value})
        assert bad.status_code == 422, bad.text
        assert ["body", "overload"] in [e["loc"][:2] for e in bad.json()["errors"]], bad.json()


async def test_a_rule_chooses_first_byte_latency_and_refuses_anything_else(
    client: httpx.AsyncClient, backends: Backends, publish: Publish
) -> None:
    response = await client.put(
        "/v1/services/stream-api/rule", json={**RULE, "latency": "first_byte"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["latency"] == "first_byte"
    await publish()
    stored = await backends.kv.get(backends.keys.rule("stream-api"))
    assert stored is not None and json.loads(stored.value)["latency"] == "first_byte"
    total = await client.put("/v1/services/plain-api/rule", json=RULE)
    await publish()
    # a total rule is stored as before the field existed: older readers accept it
    plain = await backends.kv.get(backends.keys.rule("plain-api"))
    assert plain is not None and "latency" not in json.loads(plain.value)
    assert total.json().get("latency", "total") == "total"
    for value in ("ttfb", "FIRST_BYTE", "", 1, None, ["total"]):
        bad = await client.put("/v1/services/stream-api/rule", json={**RULE, "latency": value})
        assert bad.status_code == 422, bad.text
        assert bad.headers["content-type"] == "application/problem+json"
        assert ["body", "latency"] in [e["loc"][:2] for e in bad.json()["errors"]], bad.json()
    inline = await client.post(
        "/v1/experiments",
        json={
            "service": "stream-api",
            "baseline": "http://stream-v1:8080",
            "canary": "http://stream-v2:8080",
            "rule": {**RULE, "latency": "sse"},
        },
    )
    assert inline.status_code == 422, inline.text
    assert inline.headers["content-type"] == "application/problem+json"
    assert any("latency" in e["loc"] for e in inline.json()["errors"]), inline.json()


async def test_a_rule_only_etcd_holds_is_no_rule_and_the_404_says_what_etcd_holds(
    client: httpx.AsyncClient, backends: Backends, publish: Publish
) -> None:
    key = backends.keys.rule("payment-api")
    await backends.kv.put(key, json.dumps({"service": "payment-api", **RULE}).encode())
    response = await client.get("/v1/services/payment-api/rule")
    assert response.status_code == 404
    assert "etcd still holds one" in response.json()["detail"]
    await publish()  # the import is done: a hand's key is removed, not adopted
    assert await backends.kv.get(key) is None
    assert "etcd" not in (await client.get("/v1/services/payment-api/rule")).json()["detail"]


ERRORS_Q = 'sum(increase(http_requests_total{app="shop",variant="$variant",code=~"5.."}[$window]))'
TOTAL_Q = 'sum(increase(http_requests_total{app="shop",variant="$variant"}[$window]))'
ERROR_RATIO = {
    "name": "error_ratio",
    "kind": "ratio",
    "query": ERRORS_Q,
    "total_query": TOTAL_Q,
    "compare": "baseline",
    "margin": 0.01,
    "action": "stop",
}
MEMORY = {
    "name": "memory",
    "kind": "gauge",
    "query": 'max(process_resident_memory_bytes{app="shop",variant="$variant"})',
    "bound": 512_000_000,
    "action": "pause",
    "no_data": "ignore",
}


async def test_a_rule_carries_provider_metrics_with_their_actions(
    client: httpx.AsyncClient, backends: Backends, publish: Publish
) -> None:
    body = {**RULE, "action": "rollback", "metrics": [ERROR_RATIO, MEMORY]}
    response = await client.put("/v1/services/shop/rule", json=body)
    assert response.status_code == 200, response.text
    answered = response.json()
    assert [m["name"] for m in answered["metrics"]] == ["error_ratio", "memory"]
    assert answered["action"] == "rollback" and answered["metrics"][1]["action"] == "pause"
    await publish()
    stored = await backends.kv.get(backends.keys.rule("shop"))
    assert stored is not None and parse_rule(stored.value).metrics[0].margin == 0.01
    # a rule without metrics is stored as before the field existed
    await client.put("/v1/services/plain-api/rule", json=RULE)
    await publish()
    plain = await backends.kv.get(backends.keys.rule("plain-api"))
    assert plain is not None and "metrics" not in json.loads(plain.value)


async def test_a_rule_with_bad_metrics_is_refused_naming_the_field_and_why(
    client: httpx.AsyncClient,
) -> None:
    cases: list[tuple[Any, str]] = [
        ({**MEMORY, "query": 'max(mem{variant=$variant})'}, "whole label value"),
        ({**MEMORY, "query": 'max(mem{variant="$variant"}[$range])'}, "unknown placeholder"),
        ({**MEMORY, "query": 'max(mem{variant="x"}) # $windowed'}, "unknown placeholder"),
        ({**MEMORY, "query": "max(mem)"}, "must select the variant"),
        ({**MEMORY, "query": 'max(mem{variant="$variant"}[5m:$window])'}, "as a range"),
        ({**MEMORY, "name": "latency"}, "not latency or failures"),
        ({**MEMORY, "name": "Memory"}, "metric name"),
        ({**MEMORY, "action": "explode"}, "pause"),
        ({**MEMORY, "bound": None}, "needs a bound"),
        ({**ERROR_RATIO, "total_query": None}, "total_query"),
        ({**MEMORY, "kind": "ratio", "total_query": TOTAL_Q, "bound": 2}, "between 0 and 1"),
        ({**MEMORY, "shape": "round"}, "Extra inputs"),
    ]
    for metric, why in cases:
        body = {**RULE, "metrics": [metric]}
        response = await client.put("/v1/services/shop/rule", json=body)
        assert response.status_code == 422, metric
        assert response.headers["content-type"] == "application/problem+json"
        errors = response.json()["errors"]
        assert any(e["loc"][:3] == ["body", "metrics", 0] for e in errors), errors
        assert any(why in e["msg"] for e in errors), (why, errors)
    twice = await client.put("/v1/services/shop/rule", json={**RULE, "metrics": [MEMORY, MEMORY]})
    assert twice.status_code == 422
    assert any(
        e["loc"][:2] == ["body", "metrics"] and "repeat: memory" in e["msg"]
        for e in twice.json()["errors"]
    ), twice.json()
    inline = await client.post(
        "/v1/experiments",
        json={
            "service": "shop",
            "baseline": "http://shop-v1:8080",
            "canary": "http://shop-v2:8080",
            "rule": {**RULE, "metrics": [{**MEMORY, "query": "up"}]},
        },
    )
    assert inline.status_code == 422, inline.text
    assert any("metrics" in e["loc"] for e in inline.json()["errors"]), inline.json()
