"""An issuer's JWKS fetched over HTTP(S) on the event loop, cached, one fetch at a time.

No worker thread is ever used: a request that waits for the issuer holds a coroutine,
not one of the threads the database calls share, so a slow issuer cannot starve the
API-token path or the probes. The fetch is bounded as a whole (`timeout_sec` for
connect, headers and body together), in size (`MAX_JWKS_BYTES`, read as it streams),
and in keys (`parse_jwks`). When to fetch is decided by `jwks_schedule` (decision 0041).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import ssl
from collections.abc import Callable
from typing import Protocol

import httpx

from controlplane.auth.jwks import MAX_JWKS_BYTES, JwksFailure, SigningKey, parse_jwks
from controlplane.auth.jwks_schedule import (
    FetchPlan,
    FetchPolicy,
    JwksState,
    KeyLookup,
    failed,
    live_keys,
    plan_fetch,
    started,
    succeeded,
)
from controlplane.kernel.clock import Clock
from controlplane.kernel.errors import IdentityProviderUnavailable, Unauthenticated

log = logging.getLogger(__name__)


class JwksCounters(Protocol):
    """Where fetch outcomes (`ok` or a failure's reason) and skipped keys are counted."""

    def jwks_fetched(self, outcome: str) -> None: ...

    def jwks_keys_skipped(self, reason: str, keys: int) -> None: ...


class _Uncounted:
    def jwks_fetched(self, outcome: str) -> None:
        return None

    def jwks_keys_skipped(self, reason: str, keys: int) -> None:
        return None


class RemoteJwks:
    """The key source for a JWKS URL; `jitter()` returns a float in [0, 1)."""

    def __init__(
        self,
        url: str,
        *,
        clock: Clock,
        policy: FetchPolicy | None = None,
        jitter: Callable[[], float] = random.random,
        counters: JwksCounters | None = None,
    ) -> None:
        self.url = url
        self.policy = policy or FetchPolicy()
        self._clock = clock
        self._jitter = jitter
        self._counters = counters or _Uncounted()
        self._state = JwksState()
        self._inflight: asyncio.Task[None] | None = None

    @property
    def state(self) -> JwksState:
        return self._state

    async def key_for(self, kid: str | None) -> SigningKey:
        """The key `kid` names. Waits at most for the one fetch in flight (itself
        bounded); Unauthenticated for a kid the issuer does not publish,
        IdentityProviderUnavailable when there are no keys to check against."""
        planned = plan_fetch(self._state, kid, self._clock.monotonic(), self.policy)
        if planned.lookup is KeyLookup.FETCH:
            # shielded: a request that gives up must not cancel the fetch others await
            await asyncio.shield(self._fetch_in_flight())
            planned = plan_fetch(self._state, kid, self._clock.monotonic(), self.policy)
            if planned.lookup is KeyLookup.FETCH:  # due again at once (a zero interval): never loop
                live = live_keys(self._state, self._clock.monotonic(), self.policy)
                refused = KeyLookup.UNAVAILABLE if live is None else KeyLookup.UNKNOWN_KID
                planned = FetchPlan(refused)
        if planned.lookup is KeyLookup.USE and planned.key is not None:
            if planned.refresh:
                self._fetch_in_flight()
            return planned.key
        if planned.lookup is KeyLookup.UNKNOWN_KID:
            raise Unauthenticated("no key of the issuer has the token's kid")
        retry = math.ceil(max(1.0, self._state.retry_at - self._clock.monotonic()))
        raise IdentityProviderUnavailable(
            f"the identity provider's keys are unavailable (last fetch: {self._state.error}); "
            f"next attempt in {retry} s",
            retry_after_sec=retry,
        )

    def _fetch_in_flight(self) -> asyncio.Task[None]:
        """The fetch in flight, started if there is none: never two at once."""
        if self._inflight is None:
            self._state = started(self._state, self._clock.monotonic())
            self._inflight = asyncio.get_running_loop().create_task(self._fetch())
        return self._inflight

    async def _fetch(self) -> None:
        try:
            keys = parse_jwks(await self._download())
        except JwksFailure as exc:
            self._fail(exc)
        except Exception as exc:  # a bug here must not answer 500 to every waiter
            log.exception("OIDC: fetching the JWKS at %s failed unexpectedly", self.url)
            self._fail(JwksFailure(f"unexpected {type(exc).__name__}", "error"))
        else:
            if self._state.failures:
                log.info("OIDC: the JWKS at %s answers again", self.url)
            self._state = succeeded(self._state, keys, self._clock.monotonic())
            self._counters.jwks_fetched("ok")
            for reason, skipped in keys.skipped.items():
                self._counters.jwks_keys_skipped(reason, skipped)
            if keys.skipped:
                log.info("OIDC: the JWKS at %s: skipped keys %s", self.url, dict(keys.skipped))
        finally:
            self._inflight = None

    def _fail(self, exc: JwksFailure) -> None:
        now = self._clock.monotonic()
        # the reason only: the 503 goes to any caller, the full message to the log
        self._state = failed(self._state, exc.reason, now, self.policy, self._jitter())
        self._counters.jwks_fetched(exc.reason)
        kept = live_keys(self._state, now, self.policy)
        consequence = (
            f"keeping the keys fetched {now - self._state.fetched_at:.0f} s ago"
            if kept is not None
            else "OIDC requests answer 503"
        )
        # one line per failed fetch, so at most one per back-off period
        log.warning(
            "OIDC: the JWKS at %s cannot be used: %s; %s; next attempt in %.0f s",
            self.url,
            exc,
            consequence,
            self._state.retry_at - now,
        )

    async def _download(self) -> bytes:
        timeout = self.policy.timeout_sec
        try:
            async with asyncio.timeout(timeout):
                async with (
                    httpx.AsyncClient(
                        timeout=timeout, follow_redirects=False, verify=_tls()
                    ) as http,
                    http.stream("GET", self.url, headers=_ASK) as answer,
                ):
                    if answer.status_code != 200:
                        raise JwksFailure(
                            f"the issuer answered HTTP {answer.status_code}", "http_status"
                        )
                    return await _bounded_body(answer)
        except TimeoutError:
            raise JwksFailure(f"no answer within {timeout:g} s", "timeout") from None
        except httpx.HTTPError as exc:
            raise JwksFailure(
                f"cannot fetch it: {type(exc).__name__}: {exc}"[:300], "unreachable"
            ) from None

    async def aclose(self) -> None:
        """Cancel the fetch in flight (the app is stopping) and wait for it to end."""
        task = self._inflight
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@functools.cache
def _tls() -> ssl.SSLContext:
    """The system's certificate authorities, as the issuer's other clients use."""
    return ssl.create_default_context()


# no compression: a small compressed body may inflate far past MAX_JWKS_BYTES at once
_ASK = {"Accept": "application/json", "Accept-Encoding": "identity"}


async def _bounded_body(answer: httpx.Response) -> bytes:
    """The body, refused as soon as it passes MAX_JWKS_BYTES (declared or streamed)."""
    if answer.headers.get("content-encoding", "identity").lower() != "identity":
        raise JwksFailure("the JWKS came compressed though asked not to be", "encoded")
    declared = answer.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_JWKS_BYTES:
        raise JwksFailure(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes", "too_large")
    body = bytearray()
    async for chunk in answer.aiter_raw():
        body += chunk
        if len(body) > MAX_JWKS_BYTES:
            raise JwksFailure(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes", "too_large")
    return bytes(body)
