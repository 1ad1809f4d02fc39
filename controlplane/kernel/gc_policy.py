"""The cyclic garbage collector's policy for the long-running processes.

A full (oldest-generation) collection walks every object the process tracks and holds
the GIL while it does: at N = 1,000 experiments a controller tracks ~380,000 objects and
one such pass took 140 to 420 ms, during which neither its loop nor its admin thread ran
(decision 0071). CPython starts one after every 10 collections of the middle
generation, as soon as the objects that survived them reach a quarter of the old
ones: with the controller's caches churning, every few seconds.

What the rounds make is freed by reference counting: their records, windows and
decoded seconds hold no cycles. The young generations keep collecting as usual, so a
cycle made and dropped by a request is found there within milliseconds; only the
survivors wait for a full pass, which now comes after `FULL_EVERY` middle-generation
collections (minutes at the rate a busy controller makes them). What startup made
(modules, the app, settings) is frozen: no collection walks it again.
"""

from __future__ import annotations

import gc
import sys

from prometheus_client import CollectorRegistry, GCCollector

# middle-generation collections between two full ones (CPython's default: 10)
FULL_EVERY = 1000
# CPython 3.14 collects the old objects incrementally, a slice with each young
# collection, and reads no third threshold: the freeze alone is kept there
INCREMENTAL_FROM = (3, 14)


def for_long_running_process(*, full_every: int = FULL_EVERY) -> None:
    """Collect once, freeze what is left, and make full collections rare. Called once
    by each long-running command when its startup is done."""
    if not 1 <= full_every <= 1_000_000:
        raise ValueError(f"full_every must be within 1 and 1,000,000, not {full_every}")
    gc.collect()
    gc.freeze()
    if sys.version_info >= INCREMENTAL_FROM:
        return  # the oldest generation is collected a slice at a time there
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, full_every)


def export_gc_metrics(registry: CollectorRegistry) -> None:
    """`python_gc_collections_total{generation}` and the objects collected, on a
    process's own registry: a full collection that comes too often shows there."""
    GCCollector(registry=registry)
