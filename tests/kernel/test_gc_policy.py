"""The garbage collector's policy for long-running processes: full collections made rare,
what startup made frozen, cycles still found by the young generations."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator

import pytest

from controlplane.kernel.gc_policy import (
    FULL_EVERY,
    INCREMENTAL_FROM,
    for_long_running_process,
)


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_full_collections_wait_for_many_middle_ones_and_startup_is_frozen(
    restored_gc: None,
) -> None:
    young, middle, _ = gc.get_threshold()
    for_long_running_process()
    if sys.version_info >= INCREMENTAL_FROM:
        assert gc.get_threshold()[:2] == (young, middle)
    else:
        assert gc.get_threshold() == (young, middle, FULL_EVERY)
    assert gc.get_freeze_count() > 0


def test_a_cycle_made_afterwards_is_collected_without_a_full_collection(
    restored_gc: None,
) -> None:
    for_long_running_process()
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    # no explicit collection: the allocations of a busy process trigger the young
    # generations, which find the cycle
    kept = [[i] for i in range(50 * gc.get_threshold()[0])]
    assert gone() is None
    assert kept


@pytest.mark.parametrize("full_every", [0, -1, 1_000_001])
def test_a_full_every_out_of_bounds_is_refused(full_every: int, restored_gc: None) -> None:
    with pytest.raises(ValueError, match="full_every"):
        for_long_running_process(full_every=full_every)
