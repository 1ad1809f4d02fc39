"""/v1/services/{service}/rule: etcd holds the rule, SQL logs each change."""

from __future__ import annotations

import json

import httpx

from controlplane.db import experiments as records
from controlplane.kernel.rules import parse_rule
from controlplane.runtime import Backends
from tests.support.auth import ADMIN_ACTOR

RULE = {"threshold_ms": 800, "window_sec": 60, "failure_ratio": 0.3, "percentile": 95}


async def test_put_stores_the_rule_in_etcd_and_get_reads_it_back(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    response = await client.put("/v1/services/payment-api/rule", json=RULE)
    assert response.status_code == 200, response.text
    assert response.json()["service"] == "payment-api"
    stored = await backends.kv.get(backends.keys.rule("payment-api"))
    assert stored is not None
    assert parse_rule(stored.value).threshold_ms == 800

    fetched = await client.get("/v1/services/payment-api/rule")
    assert fetched.status_code == 200
    assert fetched.json() == response.json()

    # etcd is the source of truth: a change made there is what the API answers
    changed = parse_rule(stored.value).model_copy(update={"threshold_ms": 950.0})
    await backends.kv.put(stored.key, changed.to_json().encode())
    assert (await client.get("/v1/services/payment-api/rule")).json()["threshold_ms"] == 950


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


async def test_a_malformed_stored_rule_is_reported_not_fatal(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    key = backends.keys.rule("payment-api")
    await backends.kv.put(key, json.dumps({"service": "payment-api", "threshold_ms": -5}).encode())
    response = await client.get("/v1/services/payment-api/rule")
    assert response.status_code == 502
    problem = response.json()
    assert "invalid" in problem["detail"] and key in problem["detail"]
    assert [e["loc"] for e in problem["errors"]] == [["threshold_ms"]]

    await backends.kv.put(key, b"{not json")
    response = await client.get("/v1/services/payment-api/rule")
    assert response.status_code == 502
    assert "not JSON" in response.json()["detail"]

    # the API keeps serving, and a valid PUT repairs the key
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.put("/v1/services/payment-api/rule", json=RULE)).status_code == 200
    assert (await client.get("/v1/services/payment-api/rule")).status_code == 200


async def test_a_rule_chooses_how_overload_is_judged_and_refuses_anything_else(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    response = await client.put("/v1/services/batch-api/rule", json={**RULE, "overload": "judge"})
    assert response.status_code == 200, response.text
    assert response.json()["overload"] == "judge"
    stored = await backends.kv.get(backends.keys.rule("batch-api"))
    assert stored is not None and json.loads(stored.value)["overload"] == "judge"
    # hold, the default, is stored as before the field existed: older readers accept it
    held = await client.put("/v1/services/batch-api/rule", json={**RULE, "overload": "hold"})
    assert held.status_code == 200 and held.json().get("overload", "hold") == "hold"
    plain = await backends.kv.get(backends.keys.rule("batch-api"))
    assert plain is not None and "overload" not in json.loads(plain.value)
    for value in ("ignore", "HOLD", "", 1, None, ["hold"]):
        bad = await client.put("/v1/services/batch-api/rule", json={**RULE, "overload": value})
        assert bad.status_code == 422, bad.text
        assert ["body", "overload"] in [e["loc"][:2] for e in bad.json()["errors"]], bad.json()


async def test_a_rule_chooses_first_byte_latency_and_refuses_anything_else(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    response = await client.put(
        "/v1/services/stream-api/rule", json={**RULE, "latency": "first_byte"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["latency"] == "first_byte"
    stored = await backends.kv.get(backends.keys.rule("stream-api"))
    assert stored is not None and json.loads(stored.value)["latency"] == "first_byte"
    total = await client.put("/v1/services/plain-api/rule", json=RULE)
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
