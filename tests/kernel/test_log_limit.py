"""A key is logged at most once an interval, and the keys held are bounded."""

from __future__ import annotations

from controlplane.kernel.log_limit import EveryInterval


def test_a_key_is_due_once_an_interval_and_keys_apart() -> None:
    limit = EveryInterval(interval=60.0)
    assert limit.due(1, 0.0)
    assert not limit.due(1, 59.9)
    assert limit.due(2, 59.9)
    assert limit.due(1, 60.0)
    assert not limit.due(1, 119.0)


def test_past_max_keys_the_oldest_is_forgotten_and_due_again() -> None:
    limit = EveryInterval(interval=60.0, max_keys=3)
    for key in range(4):
        assert limit.due(key, 0.0)
    assert len(limit._last) == 3
    assert limit.due(0, 1.0)  # forgotten: due again
    assert not limit.due(3, 1.0)
