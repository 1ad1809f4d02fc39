"""When the JWKS may be fetched: a table over the cache's state and the time, and the
laws of the back-off."""

from __future__ import annotations

import math

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given
from hypothesis import strategies as st

from controlplane.auth.jwks import KeySet, SigningKey
from controlplane.auth.jwks_schedule import (
    FetchPolicy,
    JwksState,
    KeyLookup,
    backoff_sec,
    failed,
    plan_fetch,
    started,
    succeeded,
)

POLICY = FetchPolicy()
_PUBLIC = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
KEYS = KeySet((SigningKey("k1", frozenset({"RS256"}), _PUBLIC),))
FETCHED = succeeded(started(JwksState(), 1000.0), KEYS, 1000.0)
FAILED_EMPTY = failed(started(JwksState(), 1000.0), "timeout", 1000.0, POLICY, jitter=0.0)
FAILED_KEPT = failed(started(FETCHED, 1400.0), "not JSON", 1400.0, POLICY, jitter=0.0)


@pytest.mark.parametrize(
    ("label", "state", "kid", "now", "lookup", "refresh"),
    [
        ("never fetched", JwksState(), "k1", 0.0, KeyLookup.FETCH, False),
        ("known kid", FETCHED, "k1", 1000.0, KeyLookup.USE, False),
        ("known kid, keys stale: use and refresh", FETCHED, "k1", 1300.0, KeyLookup.USE, True),
        ("unknown kid right after a fetch", FETCHED, "zz", 1059.0, KeyLookup.UNKNOWN_KID, False),
        ("unknown kid a minimum interval later", FETCHED, "zz", 1060.0, KeyLookup.FETCH, False),
        ("keys expired", FETCHED, "k1", 1000.0 + 3600, KeyLookup.FETCH, False),
        ("failed, no keys, in back-off", FAILED_EMPTY, "k1", 1000.5, KeyLookup.UNAVAILABLE, False),
        ("failed, no keys, back-off over", FAILED_EMPTY, "k1", 1001.0, KeyLookup.FETCH, False),
        ("refresh failed: stale keys still used", FAILED_KEPT, "k1", 1400.5, KeyLookup.USE, False),
        (
            "refresh failed, unknown kid: no fetch",
            FAILED_KEPT,
            "zz",
            1400.5,
            KeyLookup.UNKNOWN_KID,
            False,
        ),
        ("refresh failed, keys expired", FAILED_KEPT, "k1", 1000.0 + 3600, KeyLookup.FETCH, False),
        ("no kid, one key", FETCHED, None, 1000.0, KeyLookup.USE, False),
    ],
)
def test_plan_fetch(
    label: str, state: JwksState, kid: str | None, now: float, lookup: KeyLookup, refresh: bool
) -> None:
    decided = plan_fetch(state, kid, now, POLICY)
    assert (decided.lookup, decided.refresh) == (lookup, refresh), label
    assert (decided.key is not None) == (lookup is KeyLookup.USE), label


def test_expired_keys_in_back_off_are_unavailable_not_used() -> None:
    state = failed(started(FETCHED, 4600.0), "timeout", 4600.0, POLICY, jitter=0.0)
    assert plan_fetch(state, "k1", 4600.5, POLICY).lookup is KeyLookup.UNAVAILABLE


def test_consecutive_failures_grow_the_back_off_and_a_success_clears_it() -> None:
    state = JwksState()
    delays = []
    for _ in range(4):
        state = failed(started(state, 0.0), "x", 0.0, POLICY, jitter=1.0)
        delays.append(state.retry_at)
    assert delays == [2.0, 4.0, 8.0, 16.0]
    cleared = succeeded(state, KEYS, 20.0)
    assert (cleared.failures, cleared.retry_at, cleared.error) == (0, -math.inf, "")


@given(failures=st.integers(1, 10_000), jitter=st.floats(0.0, 1.0))
def test_the_back_off_stays_within_half_and_all_of_its_capped_ceiling(
    failures: int, jitter: float
) -> None:
    ceiling = min(POLICY.backoff_max_sec, POLICY.backoff_base_sec * 2.0 ** min(failures - 1, 30))
    assert ceiling / 2 <= backoff_sec(failures, POLICY, jitter) <= ceiling
    assert backoff_sec(failures, POLICY, jitter) <= POLICY.backoff_max_sec


@given(failures=st.integers(1, 60), jitter=st.floats(0.0, 1.0))
def test_the_back_off_never_shrinks_as_failures_add_up(failures: int, jitter: float) -> None:
    assert backoff_sec(failures + 1, POLICY, jitter) >= backoff_sec(failures, POLICY, jitter)
