"""When a remote JWKS may be fetched, as pure functions of the cache's state and the
time (decision 0041): what a request with a given `kid` does now, and the state after
a fetch starts, succeeds or fails.

- a known `kid` uses the cached key; keys older than `refresh_after_sec` are refreshed
  in the background (the request does not wait), and dropped once older than
  `expire_after_sec` (a key the issuer withdrew is trusted that long at most);
- an unknown `kid` refetches at most once per `min_refetch_sec`, else it is refused;
- a failed fetch is remembered: no fetch before `retry_at`, a jittered exponential
  back-off; meanwhile a request that needs the issuer fails at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from controlplane.auth.jwks import KeySet, SigningKey


@dataclass(frozen=True)
class FetchPolicy:
    timeout_sec: float = 5.0  # the whole fetch: connect, headers and body
    refresh_after_sec: float = 300.0
    expire_after_sec: float = 3600.0
    min_refetch_sec: float = 60.0
    backoff_base_sec: float = 2.0
    backoff_max_sec: float = 300.0


@dataclass(frozen=True)
class JwksState:
    keys: KeySet | None = None
    fetched_at: float = -math.inf  # monotonic time of the last successful fetch
    attempted_at: float = -math.inf  # ... of the last fetch started
    failures: int = 0  # consecutive failed fetches
    retry_at: float = -math.inf  # no fetch before this
    error: str = ""  # why the last fetch failed: a JwksFailure reason


class KeyLookup(StrEnum):
    """What a request does with the key its token's `kid` names."""

    USE = "use"  # the key is cached
    FETCH = "fetch"  # fetch (or join the fetch in flight), then look again
    UNKNOWN_KID = "unknown_kid"  # keys are cached, none has this kid: 401
    UNAVAILABLE = "unavailable"  # no usable keys and no fetch allowed now: 503


@dataclass(frozen=True)
class FetchPlan:
    lookup: KeyLookup
    key: SigningKey | None = None
    refresh: bool = False  # start a fetch in the background as well


def live_keys(state: JwksState, now: float, policy: FetchPolicy) -> KeySet | None:
    """The cached keys, unless none were fetched or they have expired."""
    if state.keys is None or now - state.fetched_at >= policy.expire_after_sec:
        return None
    return state.keys


def plan_fetch(state: JwksState, kid: str | None, now: float, policy: FetchPolicy) -> FetchPlan:
    """What a request whose token names `kid` does at `now`."""
    may_fetch = now >= state.retry_at
    keys = live_keys(state, now, policy)
    if keys is None:
        return FetchPlan(KeyLookup.FETCH) if may_fetch else FetchPlan(KeyLookup.UNAVAILABLE)
    key = keys.select(kid)
    if key is not None:
        stale = now - state.fetched_at >= policy.refresh_after_sec
        return FetchPlan(KeyLookup.USE, key, refresh=stale and may_fetch)
    if may_fetch and now - state.attempted_at >= policy.min_refetch_sec:
        return FetchPlan(KeyLookup.FETCH)
    return FetchPlan(KeyLookup.UNKNOWN_KID)


def started(state: JwksState, now: float) -> JwksState:
    return replace(state, attempted_at=now)


def succeeded(state: JwksState, keys: KeySet, now: float) -> JwksState:
    return replace(state, keys=keys, fetched_at=now, failures=0, retry_at=-math.inf, error="")


def failed(
    state: JwksState, error: str, now: float, policy: FetchPolicy, jitter: float
) -> JwksState:
    """After a failed fetch; `jitter` is uniform in [0, 1)."""
    failures = state.failures + 1
    delay = backoff_sec(failures, policy, jitter)
    return replace(state, failures=failures, retry_at=now + delay, error=error)


def backoff_sec(failures: int, policy: FetchPolicy, jitter: float) -> float:
    """Half the exponential delay, plus up to the other half at random: replicas that
    failed together do not all retry together, and none retries sooner than half."""
    ceiling = min(policy.backoff_max_sec, policy.backoff_base_sec * 2.0 ** min(failures - 1, 30))
    return ceiling / 2 + ceiling / 2 * min(max(jitter, 0.0), 1.0)
