"""The one retry delay: its table, its bounds, its jitter and its resets.

Every retrying loop (informer, etcd watch, collector round, sample sends, worker
restarts, webhook deliveries, the controller's campaign and LISTEN) waits it out, so
these laws hold for all of them.
"""

from __future__ import annotations

import math
import random

import pytest

from controlplane.kernel.backoff import Backoff, BackoffPolicy


@pytest.mark.parametrize(
    ("policy", "delays"),
    [
        (BackoffPolicy(initial=0.1, maximum=2.0, jitter=0.0), [0.1, 0.2, 0.4, 0.8, 1.6, 2, 2]),
        (BackoffPolicy(initial=0.05, maximum=2.0, jitter=0.0), [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2]),
        (BackoffPolicy(initial=1.0, maximum=10.0, multiplier=3.0, jitter=0.0), [1, 3, 9, 10, 10]),
        (BackoffPolicy(initial=0.5, maximum=0.5, jitter=0.0), [0.5, 0.5, 0.5]),
        (BackoffPolicy(initial=0.5, maximum=4.0, multiplier=1.0, jitter=0.0), [0.5, 0.5, 0.5]),
    ],
)
def test_delays_grow_by_the_multiplier_up_to_the_maximum(
    policy: BackoffPolicy, delays: list[float]
) -> None:
    assert [policy.delay(n, 0.0) for n in range(1, len(delays) + 1)] == pytest.approx(delays)


@pytest.mark.parametrize("failures", [-5, 0, 1, 5, 64, 65, 10_000, 2**62])
@pytest.mark.parametrize("draw", [0.0, 0.5, 0.999999, -3.0, 7.0, math.nan])
def test_every_delay_is_within_the_policy_bounds(failures: int, draw: float) -> None:
    policy = BackoffPolicy(initial=0.05, maximum=5.0, jitter=0.5)
    delay = policy.delay(failures, draw)
    assert math.isfinite(delay)
    assert policy.initial * (1 - policy.jitter) <= delay <= policy.maximum


def test_no_failure_counts_as_the_first() -> None:
    policy = BackoffPolicy(initial=0.1, maximum=2.0, jitter=0.0)
    assert policy.delay(0, 0.0) == policy.delay(-1, 0.0) == policy.delay(1, 0.0) == 0.1


def test_jitter_takes_at_most_its_share_off_the_delay() -> None:
    policy = BackoffPolicy(initial=1.0, maximum=1.0, jitter=0.25)
    assert policy.delay(3, 0.0) == 1.0
    assert policy.delay(3, 0.999999) == pytest.approx(0.75, abs=1e-5)


@pytest.mark.parametrize("failures", [1, 3, 6, 30])
def test_seeded_draws_spread_over_the_whole_jitter_range(failures: int) -> None:
    """A thousand clients at the same failure count do not come back in step, even at
    the cap: the delays cover [ceiling * (1 - jitter), ceiling] and nothing outside."""
    policy = BackoffPolicy(initial=0.1, maximum=2.0, jitter=0.5)
    rng = random.Random(20261206)
    delays = [policy.delay(failures, rng.random()) for _ in range(1_000)]
    ceiling = policy.ceiling(failures)
    low, high = ceiling * (1 - policy.jitter), ceiling
    assert all(low <= d <= high for d in delays)
    # every tenth of the range is hit: the draw reaches the spread
    tenths = {min(int((d - low) / (high - low) * 10), 9) for d in delays}
    assert tenths == set(range(10))
    assert len(set(delays)) > 990


def test_a_success_starts_the_sequence_again() -> None:
    backoff = Backoff(BackoffPolicy(initial=0.1, maximum=1.0, jitter=0.5), draw=lambda: 0.0)
    assert [backoff.next_delay() for _ in range(5)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0])
    assert backoff.failures == 5
    backoff.reset()
    assert backoff.failures == 0
    assert backoff.next_delay() == pytest.approx(0.1)


def test_each_loop_counts_its_own_failures() -> None:
    policy = BackoffPolicy(initial=0.1, maximum=1.0, jitter=0.0)
    first, second = Backoff(policy), Backoff(policy)
    first.next_delay()
    first.next_delay()
    assert second.next_delay() == pytest.approx(0.1)
    assert first.next_delay() == pytest.approx(0.4)


def test_only_a_session_that_stayed_up_long_enough_starts_the_sequence_again() -> None:
    policy = BackoffPolicy(initial=0.1, maximum=10.0, jitter=0.0, reset_after=30.0)
    backoff = Backoff(policy, draw=lambda: 0.0)
    assert backoff.after_session(None) == pytest.approx(0.1)  # never got up
    assert backoff.after_session(None) == pytest.approx(0.2)
    assert backoff.after_session(29.0) == pytest.approx(0.4)  # up, but not for long
    assert backoff.after_session(30.0) == pytest.approx(0.1)  # healthy: a first failure


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0.0},
        {"initial": -1.0},
        {"initial": 2.0, "maximum": 1.0},
        {"multiplier": 0.5},
        {"jitter": 1.0},
        {"jitter": -0.1},
        {"maximum": math.inf},
        {"initial": math.nan},
        {"reset_after": -1.0},
    ],
)
def test_an_unbounded_or_nonsensical_policy_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        BackoffPolicy(**kwargs)
