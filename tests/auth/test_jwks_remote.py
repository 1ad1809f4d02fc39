"""The remote key source on its own, against a JWKS server on a real socket: the
back-off grows as failures repeat (counted at the server), and a stopping app ends the
fetch in flight."""

from __future__ import annotations

import asyncio
import json

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from controlplane.auth.jwks_remote import RemoteJwks
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.errors import IdentityProviderUnavailable
from tests.support.jwks_server import Issuer, http_answer, serving

WAIT_SEC = 30.0  # a bound on waiting for an event, never a speed expectation
PUBLIC = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
KEYS = http_answer(
    json.dumps({"keys": [{**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(PUBLIC)), "kid": "k"}]})
    .encode()
)  # fmt: skip
GARBAGE = http_answer(b"<html>", content_type="text/html")


async def test_each_failure_doubles_the_wait_before_the_next_fetch() -> None:
    clock = FakeClock()
    async with serving(Issuer(answer=GARBAGE)) as issuer:
        source = RemoteJwks(issuer.url, clock=clock, jitter=lambda: 1.0)  # the full ceiling
        seen = []
        for step in (0.0, 1.9, 0.1, 3.9, 0.1, 7.9, 0.1):
            clock.advance(step)
            with pytest.raises(IdentityProviderUnavailable):
                await source.key_for("k")
            seen.append(issuer.connections)
        assert seen == [1, 1, 2, 2, 3, 3, 4]  # waits of 2, 4 and 8 s

        issuer.answer = KEYS
        clock.advance(16.0)
        assert (await source.key_for("k")).kid == "k"
        assert (source.state.failures, issuer.connections) == (0, 5)


async def test_stopping_ends_the_fetch_in_flight_and_a_later_request_fetches_anew() -> None:
    clock = FakeClock()
    async with serving(Issuer(answer=KEYS, hold=True)) as issuer:
        source = RemoteJwks(issuer.url, clock=clock)
        waiting = asyncio.create_task(source.key_for("k"))
        await asyncio.wait_for(issuer.accepted.wait(), WAIT_SEC)
        await source.aclose()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert issuer.answered == 0

        issuer.hold = False
        assert (await source.key_for("k")).kid == "k"
        assert issuer.connections == 2
