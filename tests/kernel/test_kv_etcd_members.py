"""Which etcd member the store asks next: in turn, passing over failed connections."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.kernel.kv_etcd import next_member


@pytest.mark.parametrize(
    ("failed", "turn", "expected"),
    [
        ([False], 0, 0),
        ([False, False, False], 0, 0),
        ([False, False, False], 2, 2),
        ([False, False, False], 3, 0),  # wraps
        ([True, False, False], 0, 1),  # passes over a failed one
        ([False, True, True], 1, 0),  # wraps past the failed ones
        ([False, True, False], 1, 2),
        ([True, True, True], 1, 1),  # all failed: the one in turn all the same
    ],
)
def test_the_member_in_turn_unless_its_connection_failed(
    failed: list[bool], turn: int, expected: int
) -> None:
    assert next_member(failed, turn) == expected


@given(st.lists(st.booleans(), min_size=1, max_size=7))
def test_turns_visit_every_healthy_member_before_any_twice(failed: list[bool]) -> None:
    healthy = [i for i, bad in enumerate(failed) if not bad]
    turn, seen = 0, []
    for _ in range(len(healthy) or 1):
        index = next_member(failed, turn)
        seen.append(index)
        turn = index + 1
    assert sorted(seen) == (healthy or [0])
