"""How many workers may run, and what happens when one exits unasked."""

from __future__ import annotations

import pytest

from sidecar.workers.policy import (
    WORKERS_MAX,
    GiveUp,
    Restart,
    RestartPolicy,
    after_exit,
    max_workers,
    workers_error,
)

POLICY = RestartPolicy(initial_delay=0.5, max_delay=4.0, window=60.0, max_exits=5)


@pytest.mark.parametrize(
    ("workers", "cpus", "allowed"),
    [
        (1, 1, True),
        (4, 1, True),
        (5, 1, False),
        (8, 2, True),
        (9, 2, False),
        (0, 2, False),
        (-1, 2, False),
        (WORKERS_MAX, 128, True),
        (WORKERS_MAX + 1, 128, False),
    ],
)
def test_workers_are_bounded_by_the_cpus_available(workers: int, cpus: int, allowed: bool) -> None:
    error = workers_error(workers, cpus)
    assert (error is None) is allowed
    if error is not None:
        assert "\n" not in error
        assert f"between 1 and {max_workers(cpus)}" in error
        assert f"got {workers}" in error


def test_the_first_exit_restarts_after_the_initial_delay() -> None:
    assert after_exit(POLICY, (), now=100.0, draw=0.0) == Restart(0.5, (100.0,))


@pytest.mark.parametrize(
    ("earlier", "delay"),
    [
        ((99.0,), 1.0),
        ((98.0, 99.0), 2.0),
        ((97.0, 98.0, 99.0), 4.0),
    ],
)
def test_the_delay_doubles_with_each_recent_exit(earlier: tuple[float, ...], delay: float) -> None:
    decision = after_exit(POLICY, earlier, now=100.0, draw=0.0)
    assert decision == Restart(delay, (*earlier, 100.0))


def test_the_delay_stops_at_its_maximum() -> None:
    policy = RestartPolicy(initial_delay=1.0, max_delay=3.0, max_exits=10)
    decision = after_exit(policy, (95.0, 96.0, 97.0, 98.0, 99.0), now=100.0, draw=0.0)
    assert isinstance(decision, Restart)
    assert decision.delay == 3.0


def test_exits_older_than_the_window_are_forgotten() -> None:
    decision = after_exit(POLICY, (10.0, 20.0, 30.0, 39.0), now=100.0, draw=0.0)
    assert decision == Restart(0.5, (100.0,))


def test_the_last_allowed_exit_within_the_window_gives_up() -> None:
    decision = after_exit(POLICY, (96.0, 97.0, 98.0, 99.0), now=100.0, draw=0.0)
    assert isinstance(decision, GiveUp)
    assert "5 exits within 60 s" in decision.reason


def test_an_exit_just_inside_the_window_still_counts() -> None:
    inside = after_exit(POLICY, (40.5, 97.0, 98.0, 99.0), now=100.0, draw=0.0)
    outside = after_exit(POLICY, (40.0, 97.0, 98.0, 99.0), now=100.0, draw=0.0)
    assert isinstance(inside, GiveUp)
    assert outside == Restart(4.0, (97.0, 98.0, 99.0, 100.0))


def test_the_restart_delay_takes_the_jitter_share_off_the_doubled_delay() -> None:
    policy = RestartPolicy(initial_delay=0.5, max_delay=4.0, jitter=0.5)
    decision = after_exit(policy, (98.0, 99.0), now=100.0, draw=0.999999)
    assert isinstance(decision, Restart)
    assert decision.delay == pytest.approx(1.0, abs=1e-5)  # 2.0, less half of it
