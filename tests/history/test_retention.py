"""Which running experiments have their old points merged in a round (decision 0031)."""

from __future__ import annotations

import pytest

from controlplane.history.recorder import due_for_retention


@pytest.mark.parametrize(
    ("active", "retained_at", "now", "limit", "expected"),
    [
        (range(100), {}, 1000.0, 16, list(range(16))),
        (range(3), {}, 1000.0, 16, [0, 1, 2]),
        ([1, 2], {1: 990.0, 2: 900.0}, 1000.0, 16, [2]),
        ([1, 2, 3], {1: 900.0, 2: 800.0}, 1000.0, 2, [3, 2]),
        ([1, 2], {1: 950.0, 2: 999.0}, 1000.0, 16, []),
        ([], {}, 1000.0, 16, []),
    ],
    ids=["bounded", "all-fit", "only-the-due", "never-then-longest-waiting", "none-due", "none"],
)
def test_at_most_the_bound_longest_waiting_first(
    active: range | list[int], retained_at: dict[int, float], now: float, limit: int,
    expected: list[int],
) -> None:
    assert due_for_retention(active, retained_at, now, every=60.0, limit=limit) == expected


def test_every_experiment_is_merged_within_a_few_rounds_of_falling_due() -> None:
    retained: dict[int, float] = {}
    now = 1000.0
    rounds = 0
    while len(retained) < 100:
        for experiment in due_for_retention(range(100), retained, now, limit=16):
            retained[experiment] = now
        now += 0.25
        rounds += 1
    assert rounds == 7  # ceil(100 / 16)
    assert due_for_retention(range(100), retained, now, limit=16) == []
