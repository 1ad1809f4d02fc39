"""Shed tallies in the collector's windows: a per-second `shed` count per variant,
never a sample; carried by partials and merged across collectors (decision 0025)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from controlplane.collector.service import decision_entry
from controlplane.collector.sharding import (
    Partial,
    export_partial,
    merge_snapshots,
    parse_partials,
    part_field,
)
from controlplane.collector.windows import ExperimentWindow, WindowConfig
from controlplane.kernel.codec import SHED, BatchBuilder, decode, decode_raw
from controlplane.kernel.snapshots import WindowSnapshot

START = 1_800_000_000.0
RT_US = np.array([10_000, 20_000, 30_000, 40_000, 900_000], dtype=np.uint32)


def window(window_sec: int = 10) -> ExperimentWindow:
    config = WindowConfig(window_sec=window_sec, threshold_ms=100.0)
    return ExperimentWindow("exp-1", config, clock_now=START, seed=7)


def payload(ts: float, *, shed: dict[str, int], samples: bool = True) -> bytes:
    builder = BatchBuilder()
    if samples:
        for i, rt in enumerate(RT_US.tolist()):
            variant = "baseline" if i % 2 else "canary"
            builder.add(ts, variant, rt, 500 if rt > 500_000 else 200, unit=i + 1,
                        first_byte_us=rt // 2)  # fmt: skip
    for variant, count in shed.items():
        builder.add_shed(ts, variant, count)
    return builder.encode()


def test_tallies_count_as_shed_and_never_as_samples() -> None:
    with_shed, without = window(), window()
    now = START + 1
    with_shed.record(decode_raw(payload(START + 0.5, shed={"baseline": 7, "canary": 2})), now)
    with_shed.record(decode(payload(START + 0.7, shed={"baseline": 3}, samples=False)), now)
    without.record(decode_raw(payload(START + 0.5, shed={})), now)
    shed, plain = with_shed.snapshot(now), without.snapshot(now)
    assert (shed["baseline"].shed, shed["canary"].shed) == (10, 2)
    assert (plain["baseline"].shed, plain["canary"].shed) == (0, 0)
    assert shed["baseline"].shed_share == pytest.approx(10 / (10 + 2))
    for name in ("baseline", "canary"):
        a, b = shed[name], plain[name]
        # everything but the shed count is what the samples alone give
        assert dataclasses.replace(a, shed=0, first_byte=None) == dataclasses.replace(
            b, first_byte=None
        )
        assert a.first_byte is not None and b.first_byte is not None
        assert dataclasses.replace(a.first_byte, shed=0) == b.first_byte
        assert a.first_byte.shed == a.shed  # the nested window names the same shed
    assert with_shed.counters.shed == 12
    assert with_shed.counters.ingested == without.counters.ingested == len(RT_US)


def test_a_variant_seen_only_in_tallies_has_an_empty_window_with_its_shed() -> None:
    w = window()
    w.record(decode_raw(payload(START + 0.2, shed={"baseline": 4}, samples=False)), START + 1)
    snap = w.snapshot(START + 1)["baseline"]
    assert (snap.count, snap.shed, snap.shed_share, snap.p95_ms) == (0, 4, 1.0, None)


def test_shed_leaves_the_window_with_its_second_and_late_tallies_are_dropped() -> None:
    w = window(window_sec=5)
    w.record(decode_raw(payload(START + 0.5, shed={"baseline": 5}, samples=False)), START + 1)
    w.record(decode_raw(payload(START + 3.5, shed={"baseline": 1}, samples=False)), START + 4)
    assert w.snapshot(START + 4.9)["baseline"].shed == 6
    assert w.snapshot(START + 5.0)["baseline"].shed == 1  # second 0 left the 5 s window
    w.record(decode_raw(payload(START + 0.1, shed={"baseline": 9}, samples=False)), START + 6)
    assert w.snapshot(START + 6)["baseline"].shed == 1  # older than the window: dropped
    assert w.snapshot(START + 9)["baseline"].shed == 0


def _partial(w: ExperimentWindow, now: float, collector: str) -> dict[str, str]:
    partial = export_partial(w, now, collector=collector, unacked=())
    return {part_field(collector): json.dumps(partial)}


def test_partials_carry_shed_and_merge_second_by_second() -> None:
    a, b = window(), window()
    now = START + 3
    a.record(decode_raw(payload(START + 0.5, shed={"baseline": 5})), now)
    a.record(decode_raw(payload(START + 2.5, shed={"canary": 1}, samples=False)), now)
    b.record(decode_raw(payload(START + 1.5, shed={"baseline": 2})), now)
    fields = _partial(a, now, "a") | _partial(b, now, "b")
    merged = merge_snapshots("exp-1", parse_partials(fields), now)
    assert (merged["baseline"].shed, merged["canary"].shed) == (7, 1)
    assert merged["baseline"].count == 2 * 2  # the samples, without the tallies
    # a reader with a shorter window takes only the seconds inside it
    short = merge_snapshots("exp-1", parse_partials(fields), now, window_sec=3)
    assert (short["baseline"].shed, short["canary"].shed) == (2, 1)
    # a local window merged with the other's partial gives the same
    local = merge_snapshots(
        "exp-1", parse_partials(fields), now, local=a, local_collector="a"
    )
    assert local["baseline"].shed == 7


def test_a_partial_without_shed_counts_none_and_a_malformed_one_is_refused() -> None:
    w = window()
    now = START + 1
    w.record(decode_raw(payload(START + 0.5, shed={"baseline": 5})), now)
    data = export_partial(w, now, collector="old", unacked=())
    for entry in data["variants"].values():
        del entry["shed"]  # what a collector before shed tallies published
    old = Partial("old", data)
    assert merge_snapshots("exp-1", [old], now)["baseline"].shed == 0
    for bad in (["x"], [-1], [True], [1, 2, 3]):
        broken = json.loads(json.dumps(export_partial(w, now, collector="c", unacked=())))
        broken["variants"]["baseline"]["shed"] = bad
        with pytest.raises(ValueError):
            merge_snapshots("exp-1", [Partial("c", broken)], now)


def test_snapshots_and_decision_entries_carry_shed_and_its_share() -> None:
    w = window()
    w.record(decode_raw(payload(START + 0.5, shed={"baseline": 3})), START + 1)
    snaps = w.snapshot(START + 1)
    data = snaps["baseline"].to_dict()
    assert (data["shed"], data["shed_share"]) == (3, pytest.approx(3 / 5))
    assert WindowSnapshot.from_json(snaps["baseline"].to_json()) == snaps["baseline"]
    for bad in (-1, 1.5, True, 2**60):
        with pytest.raises(ValueError, match="shed"):
            WindowSnapshot.from_dict({**data, "shed": bad})
    old = {k: v for k, v in data.items() if k != "shed"}
    assert WindowSnapshot.from_dict(old).shed == 0  # from a collector before shed tallies
    variants = json.loads(decision_entry("exp-1", snaps, START + 1)["variants"])
    assert variants["baseline"]["shed"] == 3
    assert variants["baseline"]["shed_share"] == pytest.approx(3 / 5)
    assert variants["canary"]["shed"] == 0


def test_a_tally_in_a_decoded_batch_is_recognised_by_its_outcome() -> None:
    w = window()
    batch = decode(payload(START + 0.5, shed={"canary": 2}))
    assert SHED in batch.outcome.tolist()
    w.record(batch, START + 1)
    assert w.snapshot(START + 1)["canary"].shed == 2
