"""A slow, silent or garbage-serving identity provider: its JWKS served by a real socket
server that the test scripts (hold the request, answer garbage, answer keys), while the
API answers through its real ASGI app. Nothing here measures speed: each assertion is
about the order of events (the API answered before the issuer did) or about how many
connections the issuer saw."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator

import httpx
import pytest

from controlplane.api.app import create_app
from controlplane.auth.jwks import MAX_JWKS_BYTES, MAX_JWKS_KEYS
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends
from tests.api.conftest import API_BASE
from tests.api.test_oidc import OTHER_KEY, jwks, oidc, sign
from tests.support.auth import bearer
from tests.support.jwks_server import Issuer, http_answer, serving

WAIT_SEC = 30.0  # a bound on waiting for an event, never a speed expectation
PROBLEM = "application/problem+json"
UNAVAILABLE = "urn:canary:problem:identity-provider-unavailable"


KEYS = http_answer(json.dumps(jwks()).encode())


@pytest.fixture
async def issuer() -> AsyncIterator[Issuer]:
    async with serving(Issuer(answer=KEYS)) as served:
        yield served


@pytest.fixture
async def api(
    settings: Settings, backends: Backends, issuer: Issuer
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(oidc(settings, oidc_jwks_url=issuer.url), backends=backends)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=API_BASE) as http,
    ):
        yield http


def junk() -> str:
    """A well-formed JWT that names a key no issuer has (a random kid)."""
    return sign(OTHER_KEY, kid=secrets.token_hex(8))


async def with_token(api: httpx.AsyncClient, token: str) -> httpx.Response:
    return await api.get("/v1/experiments", headers={"Authorization": f"Bearer {token}"})


def unavailable(answer: httpx.Response) -> bool:
    return (
        answer.status_code == 503
        and answer.headers["content-type"] == PROBLEM
        and answer.json()["type"] == UNAVAILABLE
    )


async def counted(api: httpx.AsyncClient, series: str) -> float:
    """The value of one series of /metrics (0 when it is not there)."""
    text = (await api.get("/metrics", headers=bearer())).text
    found = [row for row in text.splitlines() if row.startswith(series + " ")]
    return float(found[0].split()[-1]) if found else 0.0


async def fetches(api: httpx.AsyncClient, outcome: str) -> float:
    return await counted(api, f'canary_api_oidc_jwks_fetches_total{{outcome="{outcome}"}}')


async def until_fetched(api: httpx.AsyncClient, outcome: str) -> None:
    """Returns once a fetch ended with `outcome` (polled: it ends in the background)."""
    while await fetches(api, outcome) < 1:
        await asyncio.sleep(0.01)


async def test_a_silent_issuer_delays_no_api_token_request_nor_readyz(
    api: httpx.AsyncClient, issuer: Issuer, clock: FakeClock
) -> None:
    issuer.hold = True
    waiting = [asyncio.create_task(with_token(api, junk())) for _ in range(60)]
    await asyncio.wait_for(issuer.accepted.wait(), WAIT_SEC)

    # the issuer holds the one fetch: API tokens, writes and the probe still answer
    listed = await api.get("/v1/experiments", headers=bearer())
    ready = await api.get("/readyz")
    me = await api.get("/v1/me", headers=bearer())
    assert (listed.status_code, ready.status_code, me.status_code) == (200, 200, 200)
    assert issuer.answered == 0 and not any(t.done() for t in waiting)

    issuer.answer_now(http_answer(b"<html>gateway timeout</html>", content_type="text/html"))
    answers = await asyncio.wait_for(asyncio.gather(*waiting), WAIT_SEC)
    assert all(unavailable(a) for a in answers), {a.status_code for a in answers}
    assert (issuer.connections, issuer.most_open) == (1, 1)

    # the failure is remembered: no request reaches the issuer during the back-off
    later = [await with_token(api, t) for t in (junk(), sign(), junk())]
    assert all(unavailable(a) for a in later)
    assert {a.headers["retry-after"] for a in later} <= {"1", "2"}  # the back-off left
    assert issuer.connections == 1

    clock.advance(2.0)  # the first back-off is at most the base, 2 s
    issuer.hold = False
    issuer.answer = KEYS
    assert (await with_token(api, sign())).status_code == 200
    assert issuer.connections == 2


@pytest.mark.parametrize(
    ("label", "answer", "outcome"),
    [
        ("html", http_answer(b"<html>login</html>", content_type="text/html"), "not_json"),
        ("json list", http_answer(b"[]"), "bad_shape"),
        ("keys not a list", http_answer(b'{"keys": "rsa"}'), "bad_shape"),
        ("empty key set", http_answer(b'{"keys": []}'), "no_usable_key"),
        (
            "only a symmetric key",
            http_answer(b'{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "rsa-1"}]}'),
            "no_usable_key",
        ),
        (
            "only broken keys",
            http_answer(b'{"keys": [{"kty": "RSA", "kid": "rsa-1", "n": "!", "e": "AQAB"}]}'),
            "no_usable_key",
        ),
        (
            "one kid twice",
            http_answer(json.dumps({"keys": jwks()["keys"][:1] * 2}).encode()),
            "duplicate_kid",
        ),
        (
            "too many keys",
            http_answer(json.dumps({"keys": jwks()["keys"][:1] * (MAX_JWKS_KEYS + 1)}).encode()),
            "too_many_keys",
        ),
        ("huge, declared", http_answer(b" " * (MAX_JWKS_BYTES + 1)), "too_large"),
        ("huge, streamed", http_answer(b" " * (4 * MAX_JWKS_BYTES), length=False), "too_large"),
        ("server error", http_answer(b"{}", status=500), "http_status"),
        ("redirect", http_answer(b"", status=302), "http_status"),
    ],
)
async def test_a_garbage_jwks_is_one_remembered_failure_and_503s_never_500s(
    api: httpx.AsyncClient,
    issuer: Issuer,
    caplog: pytest.LogCaptureFixture,
    label: str,
    answer: bytes,
    outcome: str,
) -> None:
    issuer.answer = answer
    with caplog.at_level(logging.WARNING, logger="controlplane.auth.jwks_remote"):
        answers = [await with_token(api, t) for t in (sign(), junk(), sign(), junk())]
    assert all(unavailable(a) for a in answers), (label, [a.text for a in answers])
    assert issuer.connections == 1, label
    warned = [r for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len(warned) == 1, label
    assert await fetches(api, outcome) == 1.0, label


@pytest.mark.parametrize(
    ("label", "first"),
    [
        ("silent", b""),
        (
            "headers, then a body that never ends",
            b"HTTP/1.1 200 OK\r\nContent-Length: 900\r\n\r\n{",
        ),
    ],
)
async def test_an_issuer_that_never_finishes_is_cut_off_by_the_fetch_deadline(
    settings: Settings, backends: Backends, issuer: Issuer, label: str, first: bytes
) -> None:
    issuer.hold, issuer.first, issuer.answer = True, first, b""
    app_settings = oidc(settings, oidc_jwks_url=issuer.url).model_copy(
        update={"oidc_jwks_timeout_sec": 0.2}
    )
    app = create_app(app_settings, backends=backends)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=API_BASE) as http,
    ):
        answer = await with_token(http, sign())
        assert unavailable(answer), (label, answer.text)
        assert "last fetch: timeout" in answer.json()["detail"]
        assert unavailable(await with_token(http, sign()))
        assert issuer.connections == 1 and issuer.answered == 0


async def test_unknown_kids_refetch_at_most_once_per_interval_and_a_rotated_key_is_learnt(
    api: httpx.AsyncClient, issuer: Issuer, clock: FakeClock
) -> None:
    assert (await with_token(api, sign())).status_code == 200
    refused = [await with_token(api, junk()) for _ in range(20)]
    assert {a.status_code for a in refused} == {401}
    assert issuer.connections == 1

    clock.advance(60)
    assert (await with_token(api, junk())).status_code == 401
    assert (await with_token(api, junk())).status_code == 401
    assert issuer.connections == 2

    rotated = {"keys": [{**jwks()["keys"][0], "kid": "rsa-2"}]}
    issuer.answer = http_answer(json.dumps(rotated).encode())
    assert (await with_token(api, sign(kid="rsa-2"))).status_code == 401  # too soon
    clock.advance(60)
    assert (await with_token(api, sign(kid="rsa-2"))).status_code == 200
    assert issuer.connections == 3


async def test_stale_keys_are_refreshed_behind_the_request_and_expire_when_refresh_fails(
    api: httpx.AsyncClient, issuer: Issuer, clock: FakeClock
) -> None:
    assert (await with_token(api, sign())).status_code == 200
    clock.advance(300)
    issuer.hold = True
    issuer.accepted.clear()
    # stale: the request is answered from the cache while the refresh is held
    assert (await with_token(api, sign())).status_code == 200
    await asyncio.wait_for(issuer.accepted.wait(), WAIT_SEC)
    assert issuer.answered == 1 and issuer.connections == 2

    issuer.answer_now(http_answer(b"not json"))
    await asyncio.wait_for(until_fetched(api, "not_json"), WAIT_SEC)
    # the failed refresh keeps the keys until they expire, then the API says 503
    assert (await with_token(api, sign())).status_code == 200
    clock.advance(3600 - 300)
    assert unavailable(await with_token(api, sign()))


async def test_keys_unfit_for_signing_are_skipped_and_counted_beside_good_ones(
    api: httpx.AsyncClient, issuer: Issuer
) -> None:
    good = jwks()["keys"]
    odd = [{"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"}, {**good[0], "kid": "e", "use": "enc"}]
    issuer.answer = http_answer(json.dumps({"keys": good + odd}).encode())
    assert (await with_token(api, sign())).status_code == 200
    assert (await with_token(api, sign(kid="hmac"))).status_code == 401
    skipped = "canary_api_oidc_jwks_keys_skipped_total"
    assert await counted(api, f'{skipped}{{reason="not_asymmetric"}}') == 1.0
    assert await counted(api, f'{skipped}{{reason="not_for_signing"}}') == 1.0


async def test_a_client_that_gives_up_does_not_cancel_the_fetch_others_wait_for(
    api: httpx.AsyncClient, issuer: Issuer
) -> None:
    issuer.hold = True
    quitter = asyncio.create_task(with_token(api, sign()))
    await asyncio.wait_for(issuer.accepted.wait(), WAIT_SEC)
    stayer = asyncio.create_task(with_token(api, sign()))
    quitter.cancel()
    await asyncio.gather(quitter, return_exceptions=True)
    issuer.answer_now(KEYS)
    assert (await asyncio.wait_for(stayer, WAIT_SEC)).status_code == 200
    assert issuer.connections == 1
