"""The long-running processes' switch interval: set within its bounds, refused outside."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from controlplane.kernel.switch_interval import ANSWERING_SWITCH_INTERVAL_SEC, for_answering_threads


@pytest.fixture
def restored() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_the_answering_interval_is_set(restored: None) -> None:
    sys.setswitchinterval(0.005)
    for_answering_threads()
    assert sys.getswitchinterval() == pytest.approx(ANSWERING_SWITCH_INTERVAL_SEC)


@pytest.mark.parametrize("interval", [0.0, -1.0, 0.00001, 0.006, 1.0])
def test_an_interval_out_of_bounds_is_refused_and_nothing_changes(
    restored: None, interval: float
) -> None:
    sys.setswitchinterval(0.005)
    with pytest.raises(ValueError, match="switch interval"):
        for_answering_threads(interval)
    assert sys.getswitchinterval() == pytest.approx(0.005)
