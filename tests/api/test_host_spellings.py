"""Through the API: every other spelling of an address, and every link-local or metadata
address however reached, is a 422 naming the field, for experiment upstreams and for
webhook URLs alike; canonical addresses and names are still accepted; and a test send
to a stored URL that cannot be sent says why instead of answering 500."""

from __future__ import annotations

from typing import Any

import httpx

from controlplane.db import notifications as outbox
from controlplane.kernel.clock import utc_now
from controlplane.notify.records import Format, SubscriptionSpec
from controlplane.runtime import Backends
from tests.api.conftest import experiment_body
from tests.support.host_spellings import METADATA_URLS, NOT_HOSTS, OTHER_SPELLINGS

SUBSCRIPTIONS = "/v1/notifications/subscriptions"
PROBLEM = "application/problem+json"

REFUSED: list[tuple[str, str]] = [
    *((url, f"write it as {canonical}") for url, canonical in OTHER_SPELLINGS),
    *((url, "link-local or cloud metadata address") for url in METADATA_URLS),
    *NOT_HOSTS,
]
ACCEPTED = [
    "http://payments-v2:8080",
    "http://hooks.example.com./x",
    "http://10.0.0.7:9000",
    "http://127.0.0.1:9",
    "http://[2001:db8::1]:8080",
]


def upstream_body(url: str) -> dict[str, Any]:
    return experiment_body(
        variants={"baseline": {"upstream": "http://payments-v1:8080"}, "canary": {"upstream": url}}
    )


def refusal(answer: httpx.Response, field: tuple[str, ...]) -> str:
    """The message a 422 problem gives for `field`."""
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == PROBLEM
    errors = [e for e in answer.json()["errors"] if tuple(e["loc"][-len(field) :]) == field]
    assert errors, answer.text
    return str(errors[0]["msg"])


async def test_every_spelling_of_a_refused_host_is_a_422_for_an_upstream(
    client: httpx.AsyncClient,
) -> None:
    for url, says in REFUSED:
        answer = await client.post("/v1/experiments", json=upstream_body(url))
        assert says in refusal(answer, ("canary", "upstream")), url
    assert (await client.get("/v1/experiments")).json()["total"] == 0


async def test_every_spelling_of_a_refused_host_is_a_422_for_a_webhook(
    client: httpx.AsyncClient,
) -> None:
    kept = await client.post(SUBSCRIPTIONS, json={"name": "ok", "url": "http://hooks.example/x"})
    assert kept.status_code == 201, kept.text
    for url, says in REFUSED:
        created = await client.post(SUBSCRIPTIONS, json={"name": "x", "url": url})
        assert says in refusal(created, ("url",)), url
        patched = await client.patch(f"{SUBSCRIPTIONS}/{kept.json()['id']}", json={"url": url})
        assert says in refusal(patched, ("url",)), url
    for url in ("h2c://hooks.example/x", "h2://hooks.example/x"):  # upstreams only
        created = await client.post(SUBSCRIPTIONS, json={"name": "x", "url": url})
        assert "must start with http:// or https://" in refusal(created, ("url",)), url
    listed = (await client.get(SUBSCRIPTIONS)).json()
    assert listed["total"] == 1 and listed["items"][0]["url"] == "http://hooks.example/…"


async def test_canonical_addresses_and_names_are_still_accepted(
    client: httpx.AsyncClient,
) -> None:
    for index, url in enumerate(ACCEPTED):
        experiment = await client.post(
            "/v1/experiments", json={**upstream_body(url), "name": f"e{index}"}
        )
        assert experiment.status_code == 201, experiment.text
        hook = await client.post(SUBSCRIPTIONS, json={"name": f"h{index}", "url": url})
        assert hook.status_code == 201, hook.text


async def test_a_test_send_to_a_stored_url_that_cannot_be_sent_says_why(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    # stored before hosts were parsed strictly; the HTTP client cannot parse it at all
    async with backends.database.transaction() as tx:
        stored = await tx.run(
            outbox.create_subscription,
            spec=SubscriptionSpec(
                "old", "http://0251.0376.0251.0376/", None, (), Format.JSON, True
            ),
            secret="whsec_test-secret-0123456789abcdefghijklmnop",
            created_by="tests",
            now=utc_now(backends.clock),
        )

    answer = await client.post(f"{SUBSCRIPTIONS}/{stored.id}/test")

    assert answer.status_code == 200, answer.text
    outcome = answer.json()
    assert (outcome["delivered"], outcome["status"]) == (False, None)
    assert outcome["error"] == (
        "not sent: webhook URL host is 169.254.169.254 written in another form; "
        "write it as 169.254.169.254"
    )


async def test_an_allow_list_admitting_an_address_admits_only_its_canonical_spelling(
    client: httpx.AsyncClient, settings: Any
) -> None:
    from controlplane.api.deps import get_settings

    limited = settings.model_copy(update={"upstream_allow": "payments-v1, 169.254.169.254/32"})
    client._transport.app.dependency_overrides[get_settings] = lambda: limited  # type: ignore[attr-defined]
    spelled = await client.post("/v1/experiments", json=upstream_body("http://0xa9fea9fe/"))
    assert "write it as 169.254.169.254" in refusal(spelled, ("canary", "upstream"))
    canonical = await client.post("/v1/experiments", json=upstream_body("http://169.254.169.254/"))
    assert canonical.status_code == 201, canonical.text


async def test_an_overload_signal_source_takes_the_same_hosts(client: httpx.AsyncClient) -> None:
    def signal(source: str) -> dict[str, Any]:
        external = {"source": source, "light": 0.7, "heavy": 0.85, "severe": 0.95}
        return {"signals": {"external": external}}

    path = "/v1/services/checkout/overload"
    for url, says in REFUSED:
        answer = await client.put(path, json=signal(f"{url.rstrip('/')}/load"))
        assert answer.status_code == 422, (url, answer.text)
        assert answer.headers["content-type"] == PROBLEM
        # a source is refused earlier for any non-ASCII character
        assert says in answer.text or not url.isascii(), url
    accepted = await client.put(path, json=signal("http://127.0.0.1:9100/load"))
    assert accepted.status_code == 200, accepted.text
