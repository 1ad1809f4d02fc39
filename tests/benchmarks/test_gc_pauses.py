"""The benchmarks' record of the garbage collector's pauses."""

from __future__ import annotations

import gc

from controlplane.benchmarks.gc_pauses import GcPauses


def test_every_collection_inside_is_counted_by_generation_and_none_after() -> None:
    with GcPauses() as pauses:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    gc.collect(2)  # outside: not counted
    figures = pauses.figures()
    assert figures["generation_0"]["collections"] >= 1
    assert figures["generation_2"]["collections"] >= 2
    assert figures["generation_2"]["longest_ms"] <= figures["generation_2"]["total_ms"]
    assert all(f["total_ms"] >= 0 for f in figures.values())


def test_stopped_twice_is_harmless_and_nothing_is_left_registered() -> None:
    pauses = GcPauses()
    before = len(gc.callbacks)
    pauses.start()
    pauses.stop()
    pauses.stop()
    assert len(gc.callbacks) == before
    assert pauses.figures()["generation_2"] == {
        "collections": 0, "total_ms": 0.0, "longest_ms": 0.0
    }
