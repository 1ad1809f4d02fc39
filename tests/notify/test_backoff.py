"""When a delivery is tried again or given up: a table of attempts, and the law that
the delay grows and stays within its bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.notify.backoff import (
    AttemptResult,
    Delivered,
    GiveUp,
    RetryAt,
    RetryPolicy,
    after_attempt,
    parse_retry_after,
    retry_delay,
)

POLICY = RetryPolicy(max_attempts=5, base_delay_sec=2.0, max_delay_sec=30.0, max_age_sec=600.0)
T0 = 1_800_000_000.0


@pytest.mark.parametrize(
    ("result", "attempts", "now", "jitter", "expected"),
    [
        (AttemptResult(200), 1, T0, 0.0, Delivered()),
        (AttemptResult(204), 5, T0, 0.0, Delivered()),
        (AttemptResult(500), 1, T0, 0.0, RetryAt(T0 + 1.0, 1.0)),
        (AttemptResult(500), 1, T0, 0.5, RetryAt(T0 + 1.5, 1.5)),
        (AttemptResult(503), 3, T0, 0.0, RetryAt(T0 + 4.0, 4.0)),
        # capped at max_delay_sec
        (AttemptResult(None, "ConnectError"), 4, T0, 0.999999, RetryAt(T0 + 15.99999, 15.99999)),
        # a 4xx is retried too: the receiver may be fixed before the attempts run out
        (AttemptResult(401), 2, T0, 0.0, RetryAt(T0 + 2.0, 2.0)),
        # a redirect is not followed and counts as a failure
        (AttemptResult(302), 1, T0, 0.0, RetryAt(T0 + 1.0, 1.0)),
        # Retry-After lengthens the pause, bounded by max_delay_sec
        (AttemptResult(429, retry_after_sec=20.0), 1, T0, 0.0, RetryAt(T0 + 20.0, 20.0)),
        (AttemptResult(429, retry_after_sec=5000.0), 1, T0, 0.0, RetryAt(T0 + 30.0, 30.0)),
        (AttemptResult(503, retry_after_sec=0.5), 2, T0, 0.0, RetryAt(T0 + 2.0, 2.0)),
        (AttemptResult(500), 5, T0, 0.0, GiveUp("gave up after 5 attempts; last: HTTP 500")),
        (
            AttemptResult(None, "timeout"),
            2,
            T0 + 599.0,
            0.0,
            GiveUp("gave up: older than 600s at the next attempt; last: timeout"),
        ),
    ],
)
def test_after_an_attempt(
    result: AttemptResult, attempts: int, now: float, jitter: float, expected: object
) -> None:
    verdict = after_attempt(
        POLICY, result=result, attempts=attempts, queued_at=T0, now=now, jitter=jitter
    )
    if isinstance(expected, RetryAt):
        assert isinstance(verdict, RetryAt)
        assert verdict.at == pytest.approx(expected.at)
        assert verdict.delay_sec == pytest.approx(expected.delay_sec)
    else:
        assert verdict == expected


@given(st.integers(1, 1000), st.floats(0.0, 1.0, exclude_max=True))
def test_the_delay_is_bounded_and_grows_until_its_cap(attempts: int, jitter: float) -> None:
    delay = retry_delay(POLICY, attempts, jitter)
    assert POLICY.base_delay_sec / 2 <= delay <= POLICY.max_delay_sec
    assert retry_delay(POLICY, attempts + 1, 0.0) >= retry_delay(POLICY, attempts, 0.0)


@pytest.mark.parametrize(("attempts", "jitter"), [(0, 0.0), (1, 1.0), (1, -0.1)])
def test_out_of_range_inputs_are_refused(attempts: int, jitter: float) -> None:
    with pytest.raises(ValueError):
        retry_delay(POLICY, attempts, jitter)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": 101},
        {"base_delay_sec": 0.0},
        {"base_delay_sec": 10.0, "max_delay_sec": 5.0},
        {"max_delay_sec": 10.0, "max_age_sec": 5.0},
    ],
)
def test_a_policy_out_of_bounds_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("30", 30.0),
        (" 7 ", 7.0),
        ("0", None),
        ("86401", None),
        ("-1", None),
        ("1.5", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
        ("9" * 40, None),
    ],
)
def test_retry_after_is_read_in_seconds_only(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds
