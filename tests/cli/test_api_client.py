"""The client's translation of answers: problem+json, other error bodies, no answer."""

from __future__ import annotations

import httpx
import pytest

from controlplane.client.api_client import ApiUnreachable, CanaryClient, ClientError
from controlplane.kernel.errors import ConfigError

API = "http://canary.test"


def client_answering(handler: httpx.MockTransport) -> CanaryClient:
    return CanaryClient(API, token="cnry_ci-bot-token", transport=handler)


def test_problem_json_becomes_a_client_error_with_its_fields() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer cnry_ci-bot-token"
        # every write is JSON, even a body-less action (the API refuses anything else)
        assert request.headers["Content-Type"] == "application/json"
        assert "X-Canary-User" not in request.headers
        body = {"title": "Conflict", "status": 409, "detail": "cannot pause a draft"}
        return httpx.Response(409, json=body, headers={"content-type": "application/problem+json"})

    with (
        client_answering(httpx.MockTransport(handler)) as client,
        pytest.raises(ClientError) as caught,
    ):
        client.pause(3)
    error = caught.value
    assert (error.status, error.title, error.detail) == (409, "Conflict", "cannot pause a draft")
    assert str(error) == "Conflict: cannot pause a draft [HTTP 409]"


def test_field_errors_replace_the_summary() -> None:
    body = {
        "title": "Invalid request",
        "status": 422,
        "detail": "invalid experiment",
        "errors": [{"loc": ["body", "steps", 0, "weight_pct"], "msg": "too big"}],
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(422, json=body))
    with client_answering(transport) as client, pytest.raises(ClientError) as caught:
        client.create_experiment({})
    assert caught.value.errors == body["errors"]
    assert str(caught.value) == "Invalid request: body.steps.0.weight_pct: too big [HTTP 422]"


def test_an_error_page_that_is_not_json_still_reads_as_one_line() -> None:
    page = "<html>\n<body>bad gateway\n</body></html>"
    transport = httpx.MockTransport(lambda request: httpx.Response(502, text=page))
    with client_answering(transport) as client, pytest.raises(ClientError) as caught:
        client.get_rule("checkout")
    assert caught.value.status == 502
    assert "\n" not in str(caught.value) and "bad gateway" in str(caught.value)


def test_no_answer_names_the_url() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    with (
        client_answering(httpx.MockTransport(handler)) as client,
        pytest.raises(ApiUnreachable) as caught,
    ):
        client.list_experiments()
    assert str(caught.value).startswith(f"cannot reach the canary API at {API}: no answer")


def test_a_url_without_scheme_is_refused_up_front() -> None:
    with pytest.raises(ConfigError, match="http"):
        CanaryClient("localhost:8080")


def test_events_are_read_page_after_page() -> None:
    trail = [{"id": i, "kind": "step"} for i in range(7)]

    def handler(request: httpx.Request) -> httpx.Response:
        limit = min(int(request.url.params["limit"]), 3)
        offset = int(request.url.params.get("offset", 0))
        items = trail[offset : offset + limit]
        return httpx.Response(
            200, json={"items": items, "total": 7, "limit": limit, "offset": offset}
        )

    with client_answering(httpx.MockTransport(handler)) as client:
        assert client.events(1) == trail
        assert client.latest_event(1) == trail[-1]
