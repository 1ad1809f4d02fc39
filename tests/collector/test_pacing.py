"""Publishes paced (decision 0080): a changed experiment at most every `publish_every`
seconds, one whose canary turned worse at once; nothing held back is lost."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.collector.pacing import (
    MAX_PUBLISH_EVERY_SEC,
    UNPACED_AFTER_ALARM_SEC,
    check_publish_every,
    held_back,
)
from controlplane.collector.sharding import read_merged_snapshots
from tests.collector.test_service import EXPERIMENT, SERVICE, make_batches, memory_collector


@pytest.mark.parametrize(
    ("changed", "heartbeat", "quiet_for", "every", "held"),
    [
        (True, False, 0.3, 1.0, True),  # changed within the interval: held back
        (True, False, 1.0, 1.0, False),  # the interval has passed
        (True, False, math.inf, 1.0, False),  # never published
        (True, True, 0.3, 1.0, False),  # a heartbeat is due anyway
        (False, False, 0.3, 1.0, False),  # nothing to publish: not this rule's to say
        (True, False, 0.05, 0.0, False),  # 0: every tick, as before
    ],
)
def test_held_back(
    changed: bool, heartbeat: bool, quiet_for: float, every: float, held: bool
) -> None:
    assert held_back(changed=changed, heartbeat=heartbeat, quiet_for=quiet_for,
                     publish_every=every) is held  # fmt: skip


def test_an_experiment_alarmed_lately_is_not_held_back() -> None:
    """For UNPACED_AFTER_ALARM_SEC after its alarm, its looks find its newest samples."""
    assert not held_back(changed=True, heartbeat=False, quiet_for=0.1, publish_every=1.0,
                         alarmed_ago=0.3)  # fmt: skip
    assert held_back(changed=True, heartbeat=False, quiet_for=0.1, publish_every=1.0,
                     alarmed_ago=UNPACED_AFTER_ALARM_SEC)  # fmt: skip


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_publish_every_is_bounded(value: float) -> None:
    if 0.0 <= value <= MAX_PUBLISH_EVERY_SEC:
        assert check_publish_every(value) == value
    else:
        with pytest.raises(ValueError, match="publish every: 0 to 5 s"):
            check_publish_every(value)


async def _run(publish_every: float, *, bad_from: int | None = None) -> dict[str, object]:
    """A batch every tick (0.1 s) for 3 s, a third of a second's samples each: what
    a busy service's sidecars flushing every 50 ms send. From tick `bad_from` every
    canary sample fails."""
    collector, streams, kv, clock = await memory_collector(publish_every=publish_every)
    writes: list[int] = []  # the ticks that published
    rng = np.random.default_rng(11)
    sent = 0
    alarm_ticks: list[int] = []
    try:
        for k in range(30):
            rt = rng.lognormal(np.log(20_000), 0.3, 8).astype(np.uint32)
            if bad_from is not None and k >= bad_from:
                rt[::4] = 950_000  # every canary sample fails
            await streams.append(SERVICE, make_batches(rt, clock.now(), first_seq=k + 1),
                                 maxlen=10_000)  # fmt: skip
            sent += rt.shape[0]
            published = collector.metrics.publishes._value.get()
            await collector.step()
            if collector.metrics.publishes._value.get() > published:
                writes.append(k)
            if not alarm_ticks and (await streams.alarms_since(-math.inf))[0]:
                alarm_ticks.append(k)
            clock.advance(0.1)
        pending_before_flush = (
            await streams.pending_many("collectors", [SERVICE], min_idle_ms=0)
        )[SERVICE]
        await collector.flush()  # what a stop does: publish and ack what is held
        snaps = await read_merged_snapshots(streams, EXPERIMENT, clock.now(), window_sec=30)
        return {
            "writes": writes,
            "paced": collector.metrics.publishes_paced._value.get(),
            "counted": sum(s.count for s in snaps.values()),
            "sent": sent,
            "alarm_tick": alarm_ticks[0] if alarm_ticks else None,
            "pending_before_flush": pending_before_flush.pending,
        }
    finally:
        await collector.stop_watching()
        await streams.close()
        await kv.close()


async def test_a_busy_experiment_is_published_once_a_second_and_loses_nothing() -> None:
    every_tick = await _run(0.0)
    paced = await _run(1.0)
    assert len(every_tick["writes"]) >= 20  # type: ignore[arg-type]
    assert every_tick["paced"] == 0
    # the first publish, then one a second (3 s)
    assert 3 <= len(paced["writes"]) <= 4  # type: ignore[arg-type]
    ticks = paced["writes"]
    assert isinstance(ticks, list)
    assert all(b - a >= 10 for a, b in itertools.pairwise(ticks))
    assert paced["paced"] > 20  # type: ignore[operator]
    # every sample reaches the window: held back, not dropped
    assert paced["counted"] == paced["sent"] == every_tick["counted"]
    # the held-back batches stay unacknowledged until the publish that carries them
    assert 0 < paced["pending_before_flush"] <= 10  # type: ignore[operator]


async def test_a_canary_that_turns_worse_is_published_at_once_with_its_alarm() -> None:
    every_tick = await _run(0.0, bad_from=15)
    paced = await _run(1.0, bad_from=15)
    assert every_tick["alarm_tick"] is not None
    # the screen runs at every tick whatever the pacing: the alarm comes at the same tick
    assert paced["alarm_tick"] == every_tick["alarm_tick"]
    # published at the tick it turned worse, within a second of the publish before
    ticks = paced["writes"]
    assert isinstance(ticks, list)
    assert paced["alarm_tick"] in ticks
    before = max(t for t in ticks if t < paced["alarm_tick"])  # type: ignore[operator]
    assert paced["alarm_tick"] - before < 10  # type: ignore[operator]
    # and at every tick after it (within UNPACED_AFTER_ALARM_SEC): the next looks
    # find its newest samples
    alarm_tick = paced["alarm_tick"]
    assert isinstance(alarm_tick, int) and isinstance(every_tick["writes"], list)
    assert [t for t in ticks if t > alarm_tick] == [
        t for t in every_tick["writes"] if t > alarm_tick
    ]


async def test_batches_read_within_a_tick_are_applied_together_at_the_tick() -> None:
    """Coalesced (decision 0080): an experiment's batches of several reads within a
    tick go into its window in one call at the tick, every sample counted once; the
    entries stay held (unacknowledged, listed in the partial) until the publish that
    carries their samples; the collector refuses a 17th variant whose predecessors
    wait unapplied, as it refuses one applied."""
    from controlplane.collector.service import MAX_VARIANTS_PER_EXPERIMENT
    from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields

    collector, streams, kv, clock = await memory_collector(coalesce=True, tick=0.1)
    window_calls: list[int] = []  # batches per call into the window
    ingest = collector._ingest

    def counted(experiment: str, batches: list[Any], now: float) -> None:
        window_calls.append(len(batches))
        ingest(experiment, batches, now)

    collector._ingest = counted  # type: ignore[method-assign]
    try:
        rng = np.random.default_rng(5)
        seq = 0
        sent = 0
        for _ in range(3):  # three ticks
            for _read in range(4):  # four reads within the tick, a batch each
                seq += 1
                rt = rng.lognormal(np.log(20_000), 0.3, 3).astype(np.uint32)
                sent += rt.shape[0]
                await streams.append(SERVICE, make_batches(rt, clock.now(), first_seq=seq),
                                     maxlen=10_000)  # fmt: skip
                entries = await streams.read_group([SERVICE], "collectors", "c1", count=10,
                                                   block_ms=0)  # fmt: skip
                collector.apply(entries, claimed_unacked=frozenset())
                clock.advance(0.02)
            pending = await streams.pending_many("collectors", [SERVICE], min_idle_ms=0)
            assert pending[SERVICE].pending == 4  # held: nothing acked before the tick
            clock.advance(0.1)
            await collector.publish_due()
        assert window_calls == [4, 4, 4]  # each tick: one call of its four batches
        pending = await streams.pending_many("collectors", [SERVICE], min_idle_ms=0)
        assert pending[SERVICE].pending == 0
        snaps = await read_merged_snapshots(streams, EXPERIMENT, clock.now(), window_sec=30)
        assert sum(s.count for s in snaps.values()) == sent

        # variants: as many as allowed in unapplied batches, then one more is refused
        dropped = collector.metrics.dropped.labels("too_many_variants")._value.get()
        for v in range(MAX_VARIANTS_PER_EXPERIMENT + 1):
            seq += 1
            builder = BatchBuilder()
            builder.add(clock.now(), f"v{v}", 20_000, 200)
            meta = BatchMeta(EXPERIMENT, "sc-1", seq, 1)
            await streams.append(SERVICE, [entry_fields(meta, builder.encode())], maxlen=10_000)
        entries = await streams.read_group([SERVICE], "collectors", "c1", count=100, block_ms=0)
        for entry in entries:  # one read each: the earlier ones wait unapplied
            collector.apply([entry], claimed_unacked=frozenset())
        refused = collector.metrics.dropped.labels("too_many_variants")._value.get() - dropped
        # the window's own two variants and fourteen more, then the rest refused
        assert refused == MAX_VARIANTS_PER_EXPERIMENT + 1 - (MAX_VARIANTS_PER_EXPERIMENT - 2)
    finally:
        await collector.stop_watching()
        await streams.close()
        await kv.close()
