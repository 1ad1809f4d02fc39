"""Partial windows written second by second (formats 2 and 3): the same windows as
format 1.

The property: feed collectors the same samples over several publishes, each writing
format 1 or format 2 (only the seconds that changed), and every reader's merge —
any window length, any threshold, with or without the reader's cache — gives the
snapshots format 1 gives, field for field (the reservoir as the same samples).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.collector.second_partials import (
    SHARED_WITH_TOTAL,
    LatencyRun,
    PartialCache,
    SecondSums,
    SlotLedger,
    export_head_and_seconds,
)
from controlplane.collector.sharding import (
    expired_partials,
    export_partial,
    merge_snapshots,
    parse_partials,
    part_field,
    snapshots_of_fields,
)
from controlplane.collector.totals import UNIT_ROWS
from controlplane.collector.windows import ExperimentWindow, WindowConfig
from controlplane.kernel.errors import CodecError
from controlplane.kernel.snapshots import WindowSnapshot

START = 1_800_000_000.0


def _feed(window: ExperimentWindow, rng: np.random.Generator, now: float, n: int) -> None:
    variant = (rng.random(n) < 0.2).astype(np.int64)
    ts = now - rng.uniform(0, 1.5, n)
    rt = rng.lognormal(np.log(40_000), 1.0, n).astype(np.uint32)
    outcome = rng.choice(np.array([200, 200, 503], dtype=np.uint16), n)
    unit = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    fb = (rt // 3).astype(np.uint32)
    window.ingest(variant, ts, rt, outcome, now, unit, fb_us=fb)


def _window(window_sec: int) -> ExperimentWindow:
    window = ExperimentWindow("e", WindowConfig(window_sec, 60.0), clock_now=START, seed=3)
    window._variant_index("baseline")
    window._variant_index("canary")
    return window


def _plain(snapshot: WindowSnapshot) -> dict[str, object]:
    """A snapshot's fields, its reservoir as a multiset (the order of a bottom k is
    the order its selection left it in, which no reader relies on)."""
    data = snapshot.to_dict()
    pairs = sorted(zip(data.pop("reservoir_ms"), data.pop("reservoir_units"), strict=True))
    data["reservoir"] = pairs
    inner = data.get("first_byte")
    if isinstance(inner, dict):
        fb_pairs = sorted(zip(inner.pop("reservoir_ms"), inner.pop("reservoir_units"),
                              strict=True))  # fmt: skip
        inner["reservoir"] = fb_pairs
    return data


@pytest.mark.parametrize("version", [2, 3, 4])
@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    window_sec=st.sampled_from([5, 10, 20]),
    collectors=st.integers(1, 3),
    publishes=st.integers(1, 8),
    rate=st.sampled_from([1, 50, 400]),
    reader_window=st.sampled_from([None, 2, 10]),
    threshold=st.sampled_from(["latest", 60.0, 30.0]),
    change_threshold=st.booleans(),
)
def test_formats_2_3_and_4_merge_to_format_1_windows(
    version: int,
    seed: int,
    window_sec: int,
    collectors: int,
    publishes: int,
    rate: int,
    reader_window: int | None,
    threshold: float | str,
    change_threshold: bool,
) -> None:
    rng = np.random.default_rng(seed)
    windows = [_window(window_sec) for _ in range(collectors)]
    ledgers = [SlotLedger() for _ in range(collectors)]
    v1: dict[str, str] = {}
    v2: dict[str, str] = {}
    cache = PartialCache()
    now = START
    for publish in range(publishes):
        now += float(rng.uniform(0.2, 2.5))
        for i, window in enumerate(windows):
            if change_threshold and publish == publishes // 2:
                window.reconfigure(WindowConfig(window_sec, 45.0), now)
            if rng.random() < 0.8:
                _feed(window, rng, now, int(rng.integers(1, rate + 1)))
            name = f"c{i}"
            v1[part_field(name)] = json.dumps(
                export_partial(window, now, collector=name, unacked=[f"s/{publish}-{i}"])
            )
            v2.update(export_head_and_seconds(
                window, now, head=part_field(name), collector=name,
                unacked=[f"s/{publish}-{i}"], ledger=ledgers[i], version=version,
            ))  # fmt: skip
            ledgers[i].sent()
        reader_now = now + float(rng.uniform(0.0, 1.5))
        kwargs = {"window_sec": reader_window, "threshold_ms": threshold}
        want = merge_snapshots("e", parse_partials(v1), reader_now, **kwargs)  # type: ignore[arg-type]
        got = merge_snapshots("e", parse_partials(v2), reader_now, **kwargs)  # type: ignore[arg-type]
        cached = snapshots_of_fields(
            "e", v2, parse_partials(v2, cache=cache, experiment="e"), reader_now, **kwargs  # type: ignore[arg-type]
        )
        assert {k: _plain(s) for k, s in got.items()} == {k: _plain(s) for k, s in want.items()}
        assert {k: _plain(s) for k, s in cached.items()} == {k: _plain(s) for k, s in want.items()}
    # the readers of the others' partials see the same heads
    assert sorted(p.unacked for p in parse_partials(v2)) == sorted(
        p.unacked for p in parse_partials(v1)
    )
    far = math.floor(now) + 10_000
    assert {p.collector for p in expired_partials(parse_partials(v2), far, own="x",
                                                  retained_sec=window_sec)} == {
        p.collector for p in expired_partials(parse_partials(v1), far, own="x",
                                              retained_sec=window_sec)
    }  # fmt: skip


def _both_formats(seed: int) -> tuple[dict[str, str], dict[str, str], float]:
    """The same samples published as format 2 and as format 3."""
    fields: dict[int, dict[str, str]] = {2: {}, 3: {}}
    now = START
    for version in (2, 3):
        rng = np.random.default_rng(seed)
        window = _window(10)
        ledger = SlotLedger()
        now = START
        for _ in range(6):
            now += 1.0
            _feed(window, rng, now, 200)
            fields[version].update(export_head_and_seconds(
                window, now, head=part_field("c1"), collector="c1", unacked=[],
                ledger=ledger, version=version,
            ))  # fmt: skip
            ledger.sent()
    return fields[2], fields[3], now


def test_format_3_leaves_out_of_a_paired_first_byte_what_it_shares_and_reads_the_same() -> None:
    v2, v3, now = _both_formats(seed=5)
    assert json.loads(v2[part_field("c1")])["v"] == 2
    assert json.loads(v3[part_field("c1")])["v"] == 3
    seconds = [name for name in v3 if "#" in name]
    assert seconds and sorted(seconds) == sorted(n for n in v2 if "#" in n)
    left_out = 0
    for name in seconds:
        for variant, entry in json.loads(v3[name])["variants"].items():
            full = json.loads(v2[name])["variants"][variant]
            for key in SHARED_WITH_TOTAL:
                # every sample here has a first byte: each second is paired
                assert key not in entry["fb"]
                assert full["fb"][key] == full[key] == entry[key]
                left_out += 1
    assert left_out > 0
    assert sum(map(len, v3.values())) < 0.9 * sum(map(len, v2.values()))
    for window_sec in (None, 3):
        want = snapshots_of_fields("e", v2, parse_partials(v2), now + 0.5, window_sec=window_sec)
        got = snapshots_of_fields("e", v3, parse_partials(v3), now + 0.5, window_sec=window_sec)
        assert {k: _plain(s) for k, s in got.items()} == {k: _plain(s) for k, s in want.items()}


@pytest.mark.parametrize("kept", [("res_k",), ("res_u", "distinct")])
def test_a_first_byte_that_leaves_out_part_of_what_it_shares_is_malformed(
    kept: tuple[str, ...],
) -> None:
    _, v3, now = _both_formats(seed=6)
    name = next(n for n in v3 if "#" in n)
    second = json.loads(v3[name])
    entry = second["variants"]["baseline"]
    for key in kept:
        entry["fb"][key] = entry[key]
    v3[name] = json.dumps(second)
    with pytest.raises(CodecError, match="malformed"):
        snapshots_of_fields("e", v3, parse_partials(v3), now + 0.5)


def test_a_second_by_second_partial_is_written_as_format_2_3_or_4_only() -> None:
    with pytest.raises(ValueError, match="format 2, 3 or 4"):
        export_head_and_seconds(
            _window(10), START, head=part_field("c1"), collector="c1", unacked=[],
            ledger=SlotLedger(), version=5,
        )  # fmt: skip


def test_a_publish_writes_only_the_seconds_that_changed() -> None:
    window = _window(10)
    ledger = SlotLedger()
    rng = np.random.default_rng(1)
    now = START
    _feed(window, rng, now, 50)
    first = export_head_and_seconds(window, now, head="@part:c", collector="c", unacked=[],
                                    ledger=ledger)  # fmt: skip
    ledger.sent()
    assert len(first) > 2  # the head and every second held
    now += 1.0
    window.ingest(np.zeros(5, np.int64), np.full(5, now), np.full(5, 40_000, np.uint32),
                  np.full(5, 200, np.uint16), now, np.ones(5, np.uint32))  # fmt: skip
    second = export_head_and_seconds(window, now, head="@part:c", collector="c", unacked=[],
                                     ledger=ledger)  # fmt: skip
    assert set(second) == {"@part:c", f"@part:c#{math.floor(now) % 14}"}
    # nothing new: the head alone (its ts and unacked list)
    ledger.sent()
    assert set(export_head_and_seconds(window, now + 0.5, head="@part:c", collector="c",
                                       unacked=[], ledger=ledger)) == {"@part:c"}  # fmt: skip


def test_a_failed_write_publishes_its_seconds_again() -> None:
    window = _window(10)
    ledger = SlotLedger()
    rng = np.random.default_rng(2)
    _feed(window, rng, START, 50)
    sent = export_head_and_seconds(window, START, head="@part:c", collector="c", unacked=[],
                                   ledger=ledger)  # fmt: skip
    ledger.failed()
    again = export_head_and_seconds(window, START + 0.1, head="@part:c", collector="c",
                                    unacked=[], ledger=ledger)  # fmt: skip
    assert set(again) == set(sent)


def test_a_head_listing_a_second_its_fields_lack_is_a_malformed_partial() -> None:
    window = _window(10)
    ledger = SlotLedger()
    _feed(window, np.random.default_rng(3), START, 50)
    fields = export_head_and_seconds(window, START, head="@part:c", collector="c", unacked=[],
                                     ledger=ledger)  # fmt: skip
    missing = {k: v for k, v in fields.items() if k == "@part:c"}
    with pytest.raises(CodecError, match="malformed"):
        snapshots_of_fields("e", missing, parse_partials(missing), START)
    # a second field rewritten by hand for another second: refused, not summed
    slot = next(k for k in fields if "#" in k)
    lying = dict(fields) | {slot: fields[slot].replace('{"s":', '{"s":1,"x":', 1)}
    with pytest.raises(CodecError, match="malformed"):
        snapshots_of_fields("e", lying, parse_partials(lying), START)


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize(
    "damage",
    [
        {"cap": -1},  # a capacity out of bounds
        {"variants": []},  # variants that are not an object
        {"variants": {"canary": {"sec": ["a"]}}},  # seconds that are not integers
    ],
)
def test_a_damaged_head_beside_a_sound_one_is_a_malformed_window_not_skipped(
    damage: dict[str, object], cached: bool
) -> None:
    """Judging the sound collector's partial alone would judge part of the samples as
    if they were all of them: the window is refused, as a damaged second field is."""
    window = _window(10)
    _feed(window, np.random.default_rng(5), START, 50)
    fields = export_head_and_seconds(window, START, head="@part:c1", collector="c1",
                                     unacked=[], ledger=SlotLedger())  # fmt: skip
    damaged = json.loads(fields["@part:c1"]) | {"collector": "c2"} | damage
    fields = fields | {"@part:c2": json.dumps(damaged, separators=(",", ":"))}
    cache = PartialCache() if cached else None
    partials = parse_partials(fields, cache=cache, experiment="e")
    with pytest.raises(CodecError, match=r"malformed .*@part:c2"):
        snapshots_of_fields("e", fields, partials, START, cache=cache)


def test_a_head_of_a_format_this_reader_does_not_know_is_skipped() -> None:
    """A newer collector's partial during a rolling upgrade: the reader judges the
    others, as it did before it knew of that format."""
    window = _window(10)
    _feed(window, np.random.default_rng(5), START, 50)
    fields = export_head_and_seconds(window, START, head="@part:c1", collector="c1",
                                     unacked=[], ledger=SlotLedger())  # fmt: skip
    alone = snapshots_of_fields("e", fields, parse_partials(fields), START)
    newer = fields | {"@part:c2": json.dumps({"v": 9, "collector": "c2", "ts": START})}
    assert snapshots_of_fields("e", newer, parse_partials(newer), START) == alone


def test_a_reader_decodes_an_unchanged_second_once() -> None:
    window = _window(10)
    ledger = SlotLedger()
    rng = np.random.default_rng(4)
    fields: dict[str, str] = {}
    for k in range(5):
        _feed(window, rng, START + k, 50)
        fields.update(export_head_and_seconds(
            window, START + k, head="@part:c", collector="c", unacked=[], ledger=ledger
        ))  # fmt: skip
        ledger.sent()
    cache = PartialCache()
    snapshots_of_fields("e", fields, parse_partials(fields, cache=cache, experiment="e"),
                        START + 5)  # fmt: skip
    decoded = cache.decodes
    _feed(window, rng, START + 5, 50)
    fields.update(export_head_and_seconds(window, START + 5, head="@part:c", collector="c",
                                          unacked=[], ledger=ledger))  # fmt: skip
    snapshots_of_fields("e", fields, parse_partials(fields, cache=cache, experiment="e"),
                        START + 5.5)  # fmt: skip
    assert cache.decodes - decoded <= 2  # the seconds the new batch touched
    cache.keep(set())
    assert not cache.seconds and not cache.partials


# --- a reader's cache across publishes: the same snapshots as a fresh reader ------------

_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(0, 1), st.sampled_from([1, 50, 400])),
        st.tuples(st.just("wait"), st.sampled_from([0.1, 0.3, 1.0, 2.0, 7.0, 25.0])),
        st.tuples(st.just("threshold"), st.sampled_from([45.0, 60.0])),
        st.tuples(st.just("restart"), st.integers(0, 1)),
        st.tuples(st.just("gone"), st.integers(0, 1)),
    ),
    min_size=1,
    max_size=24,
)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    window_sec=st.sampled_from([5, 10]),
    steps=_STEPS,
    threshold=st.sampled_from(["latest", 60.0]),
)
def test_a_cached_reader_sees_what_a_fresh_reader_sees_at_every_look(
    seed: int, window_sec: int, steps: list[tuple[object, ...]], threshold: float | str
) -> None:
    """Publishes of one or two collectors (new seconds, the same second again, seconds
    leaving the window, a whole window gone by, a threshold change, a collector
    restarting on the same slots, a collector's fields removed), each followed by two
    looks (the rule's window and a fast one) through one cache kept throughout: every
    snapshot is the one a reader without a cache merges from the same hash."""
    rng = np.random.default_rng(seed)
    now = START
    windows = [_window(window_sec), _window(window_sec)]
    ledgers = [SlotLedger(), SlotLedger()]
    config = WindowConfig(window_sec, 60.0)
    fields: dict[str, str] = {}
    cache = PartialCache()
    for step in steps:
        kind = step[0]
        if kind == "publish":
            i, rate = int(step[1]), int(step[2])  # type: ignore[call-overload]
            _feed(windows[i], rng, now, int(rng.integers(1, rate + 1)))
            fields.update(export_head_and_seconds(
                windows[i], now, head=part_field(f"c{i}"), collector=f"c{i}", unacked=[],
                ledger=ledgers[i],
            ))  # fmt: skip
            ledgers[i].sent()
        elif kind == "wait":
            now += float(step[1])  # type: ignore[arg-type]
        elif kind == "threshold":
            config = WindowConfig(window_sec, float(step[1]))  # type: ignore[arg-type]
            for window in windows:
                window.reconfigure(config, now)
        else:
            # a restart keeps the fields of the collector's previous life, whose slots
            # the new one reuses; a collector gone has its fields removed (a live one
            # expires them), and comes back, if at all, as a new process
            i = int(step[1])  # type: ignore[call-overload]
            windows[i] = ExperimentWindow("e", config, clock_now=now, seed=seed + 1)
            windows[i]._variant_index("baseline")
            windows[i]._variant_index("canary")
            ledgers[i] = SlotLedger()
            if kind == "gone":
                head = part_field(f"c{i}")
                for name in [n for n in fields if n == head or n.startswith(head + "#")]:
                    del fields[name]
        for look in (now, now + 0.2):
            for reader_window in (window_sec, 2):
                kwargs = {"window_sec": reader_window, "threshold_ms": threshold}
                fresh = merge_snapshots("e", parse_partials(fields), look, **kwargs)  # type: ignore[arg-type]
                cached = snapshots_of_fields(
                    "e", fields, parse_partials(fields, cache=cache, experiment="e"), look,
                    **kwargs,  # type: ignore[arg-type]
                )  # fmt: skip
                assert {k: _plain(s) for k, s in cached.items()} == {
                    k: _plain(s) for k, s in fresh.items()
                }


def _second_sums(rng: np.random.Generator, bins: int, *, integral: bool) -> SecondSums:
    count = int(rng.integers(0, 50))
    hist = np.zeros(bins, dtype=np.int64)
    np.add.at(hist, rng.integers(0, bins, count), 1)
    unit_counts = rng.integers(0, 5, (UNIT_ROWS, 3)).astype(np.int64)
    unit_sums = rng.integers(0, 2**20, (UNIT_ROWS, 2)).astype(np.float64)
    sum_us = float(rng.integers(0, 2**40))
    if not integral:
        sum_us += 0.1
        unit_sums[0, 1] += 1e-3
    keys = rng.random(count).astype(np.float32)
    failures, above = int(rng.integers(0, count + 1)), int(rng.integers(0, count + 1))
    stale, shed = bool(rng.random() < 0.3), int(rng.integers(0, 3))
    return SecondSums(
        count=count, failures=failures, sum_us=sum_us, above=above, stale=stale, shed=shed,
        tally=np.array([count, failures, 0 if stale else above, int(stale), shed], np.int64),
        hist_bins=np.flatnonzero(hist).astype(np.uint16),
        hist_counts=hist[np.flatnonzero(hist)].astype(np.uint32), bins=bins,
        unit_counts=unit_counts,
        unit_sums=unit_sums, res_keys=keys, res_us=rng.integers(0, 2**20, count).astype(np.uint32),
        res_units=rng.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32),
        distinct=np.unique(rng.integers(1, 2**32, count, dtype=np.uint64).astype(np.uint32)),
        float_peak=max(sum_us, float(unit_sums.max())), integral=integral,
    )  # fmt: skip


def _run_windows(run: LatencyRun, bins: int) -> list[dict[str, object]]:
    """What a run gives every window a reader may ask of it, array by array."""
    out: list[dict[str, object]] = []
    seconds = run.seconds.tolist()
    for start in range(min(seconds, default=0) - 1, max(seconds, default=0) + 2):
        for same in (True, False):
            totals = run.totals(start, same_threshold=same, bins=bins)
            fields: dict[str, object] = {}
            for name, value in vars(totals).items():
                if isinstance(value, np.ndarray):
                    fields[name] = (value.dtype.str, value.shape, value.tobytes())
                else:
                    fields[name] = value
            out.append(fields)
    return out


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    before=st.integers(0, 12),
    dropped=st.integers(0, 12),
    added=st.integers(0, 6),
    changed=st.integers(0, 6),
    integral=st.booleans(),
    late=st.booleans(),
    cut=st.integers(0, 3),
)
def test_a_slid_run_is_the_run_built_from_its_seconds(
    seed: int,
    before: int,
    dropped: int,
    added: int,
    changed: int,
    integral: bool,
    late: bool,
    cut: int,
) -> None:
    """Seconds dropped from the front, some changed, some added at the end, a late
    second filling a gap, or the newest seconds gone (a restart): the run slid from
    the previous one is, array for array, the one built from scratch (and one with
    float sums that are not integers is built, not slid)."""
    rng = np.random.default_rng(seed)
    bins = 16
    seconds = list(range(100, 100 + 2 * before, 2))  # gaps a late second may fill
    rows = [_second_sums(rng, bins, integral=True) for _ in seconds]
    old = LatencyRun.build(seconds, rows, bins, 5.0)
    dropped = min(dropped, before)
    tail = list(range(100 + 2 * before, 100 + 2 * before + added))
    new_seconds = seconds[dropped:] + tail
    new_rows = rows[dropped:] + [_second_sums(rng, bins, integral=integral) for _ in tail]
    if late and len(new_seconds) > 1 and new_seconds[1] - new_seconds[0] > 1:
        new_seconds.insert(1, new_seconds[0] + 1)
        new_rows.insert(1, _second_sums(rng, bins, integral=True))
    if cut:
        new_seconds, new_rows = new_seconds[:-cut], new_rows[:-cut]
    for j in rng.permutation(len(new_rows))[:changed].tolist():
        new_rows[j] = _second_sums(rng, bins, integral=integral)
    slid = old.slid(new_seconds, new_rows, bins, 6.0)
    built = LatencyRun.build(new_seconds, new_rows, bins, 6.0)
    assert slid.seconds.tolist() == built.seconds.tolist()
    assert _run_windows(slid, bins) == _run_windows(built, bins)
    assert slid.exact == built.exact


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    steps=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 2)), min_size=1,
        max_size=25,
    ),
)
def test_a_run_slid_again_and_again_in_its_buffers_is_the_run_built(
    seed: int, steps: list[tuple[int, int, int]]
) -> None:
    """A run slid look after look, as a reader keeping its tick slides it: seconds
    leaving the front, a few added, the newest changed, so that the rows move through
    the buffers' room and out of it into new buffers. After every slide the run is,
    array for array, the one built from its seconds, and the run it was slid from is
    spent: it refuses to be read and, slid again, is built."""
    rng = np.random.default_rng(seed)
    bins = 16
    seconds = list(range(100, 110))
    rows = [_second_sums(rng, bins, integral=True) for _ in seconds]
    run = LatencyRun.build(seconds, rows, bins, 5.0)
    for dropped, added, changed in steps:
        dropped = min(dropped, len(seconds))
        first_new = seconds[-1] + 1 if seconds else 200
        seconds = seconds[dropped:] + list(range(first_new, first_new + added))
        rows = rows[dropped:] + [_second_sums(rng, bins, integral=True) for _ in range(added)]
        for j in range(max(0, len(rows) - changed), len(rows)):
            rows[j] = _second_sums(rng, bins, integral=True)
        slid = run.slid(seconds, rows, bins, 6.0)
        built = LatencyRun.build(seconds, rows, bins, 6.0)
        assert _run_windows(slid, bins) == _run_windows(built, bins)
        if slid.buffers is not None and run.buffers is not None and run is not slid:
            assert run.buffers.spent
            with pytest.raises(RuntimeError, match="no longer holds its own rows"):
                run.totals(seconds[0] if seconds else 0, same_threshold=True, bins=bins)
            again = run.slid(seconds, rows, bins, 6.0)  # built, not read from spent rows
            assert _run_windows(again, bins) == _run_windows(built, bins)
        run = slid
