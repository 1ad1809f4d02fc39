"""Values that once got through the API and broke things later: each is a clear 422
(or 404 for an id out of range) as problem+json naming the field, and nothing is stored."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
from sqlalchemy.exc import DataError, IntegrityError, OperationalError

from controlplane.api.app import create_app
from controlplane.db.session import translate_db_error
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends
from tests.api.conftest import API_BASE, experiment_body
from tests.support.auth import bearer

PROBLEM = "application/problem+json"


def assert_problem(response: httpx.Response, status: int, *fields: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    named = {".".join(str(p) for p in e["loc"]) for e in body.get("errors") or []}
    for field in fields:
        assert any(field in n for n in named), (field, named)
    return body


async def assert_nothing_stored(client: httpx.AsyncClient) -> None:
    listed = await client.get("/v1/experiments")
    assert listed.json()["total"] == 0


def with_rule(**rule: Any) -> dict[str, Any]:
    return experiment_body(rule={"threshold_ms": 800, **rule})


def raw(body: dict[str, Any], token: str, replacement: str) -> str:
    """The body as JSON text with a placeholder replaced by text JSON cannot carry."""
    return json.dumps(body).replace(json.dumps(token), replacement)


BAD_EXPERIMENTS: list[tuple[str, Any, str]] = [
    ("infinite threshold", raw(with_rule(threshold_ms="@"), "@", "Infinity"), "threshold_ms"),
    ("overflowing threshold", raw(with_rule(threshold_ms="@"), "@", "1e400"), "threshold_ms"),
    ("NaN threshold", raw(with_rule(threshold_ms="@"), "@", "NaN"), "threshold_ms"),
    ("huge cooldown", with_rule(cooldown_sec=1e308), "cooldown_sec"),
    (
        "upstream with credentials",
        experiment_body(
            variants={
                "baseline": {"upstream": "http://user:s3cr3t-pw@payments-v1:8080"},
                "canary": {"upstream": "http://payments-v2:8080"},
            }
        ),
        "variants.baseline.upstream",
    ),
    (
        "upstream with a fragment",
        experiment_body(
            variants={
                "baseline": {"upstream": "http://payments-v1:8080"},
                "canary": {"upstream": "http://payments-v2:8080/#x"},
            }
        ),
        "variants.canary.upstream",
    ),
    (
        "metadata upstream",
        experiment_body(
            variants={
                "baseline": {"upstream": "http://payments-v1:8080"},
                "canary": {"upstream": "http://169.254.169.254/latest"},
            }
        ),
        "variants.canary.upstream",
    ),
    (
        "weight rounding to 0 bp",
        experiment_body(steps=[{"weight_pct": 1e-9, "hold_sec": 0}]),
        "weight_pct",
    ),
    (
        "weight as a bool",
        experiment_body(steps=[{"weight_pct": True, "hold_sec": 0}]),
        "weight_pct",
    ),
    (
        "weight as a string",
        experiment_body(steps=[{"weight_pct": "5", "hold_sec": 0}]),
        "weight_pct",
    ),
    ("hold as a bool", experiment_body(steps=[{"weight_pct": 5, "hold_sec": True}]), "hold_sec"),
    ("sticky header with CRLF", experiment_body(sticky={"header": "x-a\r\nx-b"}), "sticky.header"),
    ("empty sticky header", experiment_body(sticky={"header": ""}), "sticky.header"),
    ("100 KB sticky header", experiment_body(sticky={"header": "h" * 100_000}), "sticky.header"),
    (
        "sticky cookie with a separator",
        experiment_body(sticky={"header": None, "cookie": "a;b"}),
        "sticky.cookie",
    ),
    ("name with a terminal escape", experiment_body(name="\x1b[31mred\x1b[0m"), "name"),
    ("name with CRLF", experiment_body(name="a\r\nforged: line"), "name"),
    ("name with a bidi override", experiment_body(name="abc\u202edef"), "name"),
    ("name too long", experiment_body(name="n" * 129), "name"),
    ("service with a slash", experiment_body(service="a/b"), "service"),
]


@pytest.mark.parametrize(
    ("body", "field"), [pytest.param(b, f, id=i) for i, b, f in BAD_EXPERIMENTS]
)
async def test_bad_values_in_an_experiment_are_refused(
    client: httpx.AsyncClient, body: Any, field: str
) -> None:
    if isinstance(body, str):
        response = await client.post(
            "/v1/experiments", content=body, headers={"content-type": "application/json"}
        )
    else:
        response = await client.post("/v1/experiments", json=body)
    problem = assert_problem(response, 422, field)
    assert "s3cr3t" not in response.text
    assert "ck_" not in response.text
    assert problem["type"].endswith("validation-failed")
    await assert_nothing_stored(client)


async def test_a_refusal_reads_as_the_validator_wrote_it(client: httpx.AsyncClient) -> None:
    # pydantic's "Value error, " names the Python exception, not the problem
    body = experiment_body(
        steps=[{"weight_pct": 50, "hold_sec": 0}, {"weight_pct": 5, "hold_sec": 0}]
    )
    problem = assert_problem(await client.post("/v1/experiments", json=body), 422, "steps")
    messages = [error["msg"] for error in problem["errors"]]
    assert any(m.startswith("weights must increase strictly") for m in messages), messages
    assert not any(m.startswith(("Value error", "Assertion failed")) for m in messages)


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ('{"threshold_ms": Infinity}', "threshold_ms"),
        ('{"threshold_ms": 1e400}', "threshold_ms"),
        ('{"threshold_ms": 800, "cooldown_sec": 1e308}', "cooldown_sec"),
        ('{"threshold_ms": true}', "threshold_ms"),
        ('{"threshold_ms": 800, "min_samples": 1e30}', "min_samples"),
    ],
)
async def test_bad_values_in_a_rule_are_refused(
    client: httpx.AsyncClient, rule: str, field: str
) -> None:
    response = await client.put(
        "/v1/services/payment-api/rule", content=rule, headers={"content-type": "application/json"}
    )
    assert_problem(response, 422, field)
    assert (await client.get("/v1/services/payment-api/rule")).status_code == 404


async def test_a_patch_cannot_bring_in_what_a_create_refuses(
    client: httpx.AsyncClient, create: Any
) -> None:
    created = await create()
    response = await client.patch(
        f"/v1/experiments/{created['id']}",
        json={"name": "ok\x07", "steps": [{"weight_pct": 1e-9, "hold_sec": 0}]},
    )
    assert_problem(response, 422, "name", "weight_pct")
    stored = (await client.get(f"/v1/experiments/{created['id']}")).json()
    assert stored["name"] == created["name"]


@pytest.mark.parametrize(
    "experiment_id", ["99999999999999999999", str(2**63), str(2**31), str(2**63 - 1), "-1", "0"]
)
@pytest.mark.parametrize(
    ("method", "suffix"),
    [("GET", ""), ("PATCH", ""), ("DELETE", ""), ("GET", "/events"), ("POST", "/start")],
)
async def test_ids_out_of_range_are_not_found(
    client: httpx.AsyncClient, experiment_id: str, method: str, suffix: str
) -> None:
    response = await client.request(
        method, f"/v1/experiments/{experiment_id}{suffix}", json={} if method != "GET" else None
    )
    assert_problem(response, 404)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"offset": str(2**63)}, "offset"),
        ({"offset": "-1"}, "offset"),
        ({"limit": str(2**64)}, "limit"),
        ({"limit": "0"}, "limit"),
    ],
)
async def test_pages_out_of_range_name_the_parameter(
    client: httpx.AsyncClient, query: dict[str, str], field: str
) -> None:
    assert_problem(await client.get("/v1/experiments", params=query), 422, field)


async def test_the_largest_offset_is_an_empty_page(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/experiments", params={"offset": str(2**63 - 1)})
    assert response.status_code == 200
    assert response.json()["items"] == []


async def test_a_reason_with_control_characters_is_refused(
    client: httpx.AsyncClient, create: Any
) -> None:
    created = await create()
    response = await client.post(
        f"/v1/experiments/{created['id']}/start", json={"reason": "go\x1b]0;owned\x07"}
    )
    assert_problem(response, 422, "reason")


async def test_bodies_must_be_json_and_small(client: httpx.AsyncClient, settings: Settings) -> None:
    wrong_type = await client.post(
        "/v1/experiments", content=b"name=x", headers={"content-type": "text/plain"}
    )
    assert_problem(wrong_type, 415)
    large = await client.post(
        "/v1/experiments",
        content=b" " * (settings.max_body_bytes + 1),
        headers={"content-type": "application/json"},
    )
    assert_problem(large, 413)
    await assert_nothing_stored(client)


async def test_an_allow_list_admits_only_its_hosts(settings: Settings, backends: Backends) -> None:
    allowing = settings.model_copy(update={"upstream_allow": "payments-v1,10.0.0.0/8"})
    app = create_app(allowing, backends=backends)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=API_BASE, headers=bearer()
        ) as http:
            ok = experiment_body(
                variants={
                    "baseline": {"upstream": "http://payments-v1:8080"},
                    "canary": {"upstream": "http://10.1.2.3:8080"},
                }
            )
            assert (await http.post("/v1/experiments", json=ok)).status_code == 201
            response = await http.post("/v1/experiments", json=experiment_body())
            assert_problem(response, 422, "variants.canary.upstream")


async def test_an_unexpected_error_is_a_generic_problem_with_a_logged_correlation_id(
    settings: Settings, backends: Backends, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(settings, backends=backends)

    async def broken() -> None:
        raise RuntimeError("SELECT secret FROM ck_steps_weight_bp")

    app.add_api_route("/v1/broken", broken)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=API_BASE, headers=bearer()
        ) as http:
            with caplog.at_level(logging.ERROR):
                response = await http.get("/v1/broken")
    body = assert_problem(response, 500)
    assert "SELECT" not in response.text and "ck_steps" not in response.text
    correlation = body["correlation_id"]
    assert response.headers["x-correlation-id"] == correlation
    logged = [r for r in caplog.records if correlation in r.getMessage()]
    assert logged and logged[0].exc_info is not None


@pytest.mark.parametrize(
    "error",
    [
        IntegrityError("INSERT INTO steps", {}, Exception("CHECK constraint ck_steps_weight_bp")),
        DataError("SELECT", {}, Exception("integer out of range: SELECT 1")),
        OperationalError("SELECT", {}, Exception("no such table: experiments")),
    ],
)
def test_database_errors_carry_no_database_text(error: Exception) -> None:
    translated = translate_db_error(error)  # type: ignore[arg-type]
    text = str(translated)
    assert "ck_" not in text and "SELECT" not in text and "INSERT" not in text
    assert "experiments" not in text and "out of range:" not in text


def test_every_route_documents_its_problems(settings: Settings) -> None:
    document = create_app(settings).openapi()
    assert "Problem" in document["components"]["schemas"]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            for status in ("400", "404", "422", "500"):
                content = responses[status]["content"]
                assert list(content) == [PROBLEM], (method, path, status)
            if "requestBody" in operation:
                assert {"413", "415"} <= set(responses), (method, path)
