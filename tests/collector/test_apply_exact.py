"""What the collector applies and publishes of each second is the plain recomputation.

Reads of every shape (one second or several, one variant or three, samples with a
first byte, without, or some of each) go through `ExperimentWindow.ingest` and a
publish follows each. Then every second of every ring, and the running sums over the
window, must equal what a plain recomputation from the samples gives; and every
published second field must hold exactly its ring's arrays, the first-byte second
too when it takes the total second's texts (a paired second).
"""

from __future__ import annotations

import base64
import json
import math
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.collector.second_partials import (
    SHARED_WITH_TOTAL,
    SecondSums,
    SlotLedger,
    export_head_and_seconds,
    first_byte_entry,
)
from controlplane.collector.sharding import decode_hist_row_into, decode_unit_rows_into
from controlplane.collector.totals import UNIT_ROWS
from controlplane.collector.windows import ExperimentWindow, WindowConfig
from controlplane.kernel.units import block_of

START = 1_800_000_000.0
WINDOW = 6
THRESHOLD_MS = 40.0
VARIANTS = ("baseline", "canary", "dark")
HEAD = "@part:c1"


@st.composite
def reads(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Reads as a collector applies them: the clock moves, each read spans a few seconds."""
    out = []
    now = START
    for _ in range(draw(st.integers(1, 7))):
        now += draw(st.sampled_from([0.0, 0.3, 1.0, 1.7, 3.0]))
        n = draw(st.integers(1, 60))
        seed = draw(st.integers(0, 2**32 - 1))
        out.append({
            "now": now, "n": n, "seed": seed,
            "span": draw(st.integers(1, 3)),
            "variants": draw(st.integers(1, 3)),
            "first_byte": draw(st.sampled_from(["all", "none", "some"])),
            "units": draw(st.booleans()),
        })  # fmt: skip
    return out


def columns(read: dict[str, Any]) -> dict[str, Any]:
    rng = np.random.default_rng(read["seed"])
    n = read["n"]
    # within the window, never ahead of the clock: every sample is admitted
    ts = read["now"] - rng.integers(0, read["span"], n) - rng.uniform(0.0, 0.99, n)
    rt = rng.lognormal(math.log(30_000), 1.0, n).clip(0, 2**32 - 1).astype(np.uint32)
    fb = (rt // rng.integers(1, 5, n)).astype(np.uint32)
    known = {"all": np.ones(n, bool), "none": np.zeros(n, bool),
             "some": rng.random(n) < 0.5}[read["first_byte"]]  # fmt: skip
    unit = rng.integers(0, 2**32, n).astype(np.uint32) if read["units"] else np.zeros(n, np.uint32)
    unit[rng.random(n) < 0.2] = 0
    return {
        "variant": rng.integers(0, read["variants"], n).astype(np.int64),
        "ts": ts, "rt": rt, "fb": fb, "known": known, "unit": unit,
        "outcome": rng.choice(np.array([200, 200, 503, 404], dtype=np.uint16), n),
    }  # fmt: skip


def ingest(window: ExperimentWindow, cols: dict[str, Any], now: float) -> None:
    known = cols["known"]
    fb: np.ndarray | None = cols["fb"]
    mask: np.ndarray | None = known
    if known.all():
        mask = None
    elif not known.any():
        fb, mask = None, None
    window.ingest(
        cols["variant"], cols["ts"], cols["rt"], cols["outcome"], now, cols["unit"],
        fb_us=fb, known=mask,
    )  # fmt: skip


class Plain:
    """Each (first byte?, variant, second)'s sums, from the samples one by one."""

    def __init__(self, window: ExperimentWindow) -> None:
        self.mapping = window.mapping
        self.bins = window.mapping.bins
        self.threshold_us = THRESHOLD_MS * 1000.0
        self.cells: dict[tuple[bool, int, int], dict[str, Any]] = defaultdict(self._cell)

    def _cell(self) -> dict[str, Any]:
        return {"count": 0, "failures": 0, "sum_us": 0, "above": 0,
                "hist": np.zeros(self.bins, np.int64),
                "unit_counts": np.zeros((UNIT_ROWS, 3), np.int64),
                "unit_sums": np.zeros((UNIT_ROWS, 2), np.float64)}  # fmt: skip

    def add(self, cols: dict[str, Any]) -> None:
        rows = block_of(cols["unit"]).tolist()
        for first_byte in (False, True):
            values = cols["fb"] if first_byte else cols["rt"]
            bins = self.mapping.index(values).tolist()
            for i, value in enumerate(values.tolist()):
                if first_byte and not cols["known"][i]:
                    continue
                second = math.floor(float(cols["ts"][i]))
                cell = self.cells[(first_byte, int(cols["variant"][i]), second)]
                outcome = int(cols["outcome"][i])
                failed = outcome >= 500
                above = value > math.floor(self.threshold_us)
                cell["count"] += 1
                cell["failures"] += failed
                cell["sum_us"] += value
                cell["above"] += above
                cell["hist"][bins[i]] += 1
                row = rows[i]
                cell["unit_counts"][row] += (1, int(failed), int(above))
                cell["unit_sums"][row] += (bins[i], bins[i] * bins[i])


def decode_array(text: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


def check_field(entry: dict[str, Any], ring: Any, slot: int, *, bins: int) -> None:
    fill = int(ring.res_fill[slot])
    assert entry["count"] == int(ring.count[slot])
    assert entry["fail"] == int(ring.failures[slot])
    assert entry["sum"] == float(ring.sum_us[slot])
    assert entry["above"] == int(ring.above[slot])
    hist = np.zeros(bins, np.int64)
    decode_hist_row_into(entry["hist"], hist)
    assert np.array_equal(hist, ring.hist[slot])
    if "units" in entry:
        counts, sums = np.zeros((UNIT_ROWS, 3), np.int64), np.zeros((UNIT_ROWS, 2))
        decode_unit_rows_into(entry["units"], counts, sums)
    else:  # format 4's sparse rows, as the reader reads them
        decoded = SecondSums.decode(entry, bins, compact=True)
        counts, sums = decoded.unit_counts, decoded.unit_sums
    assert np.array_equal(counts, ring.unit_counts[slot])
    assert np.array_equal(sums, ring.unit_sums[slot])
    assert np.array_equal(decode_array(entry["res_k"], "<f4"), ring.res_keys[slot, :fill])
    assert np.array_equal(decode_array(entry["res_v"], "<u4"), ring.res_us[slot, :fill])
    assert np.array_equal(decode_array(entry["res_u"], "<u4"), ring.res_unit[slot, :fill])
    # format 4 leaves them out where the reservoir holds every sample: the reader's
    distinct = SecondSums.decode(entry, bins, compact=True).distinct
    assert np.array_equal(distinct, ring.distinct[slot])
    if "distinct" not in entry:
        assert fill == int(ring.count[slot])


@pytest.mark.parametrize("version", [2, 3, 4])
@settings(max_examples=150, deadline=None)
@given(script=reads())
def test_applied_and_published_seconds_are_the_plain_sums(
    version: int, script: list[dict[str, Any]]
) -> None:
    window = ExperimentWindow(
        "e", WindowConfig(window_sec=WINDOW, threshold_ms=THRESHOLD_MS), clock_now=START, seed=3
    )
    for name in VARIANTS:
        window._variant_index(name)
    plain = Plain(window)
    ledger = SlotLedger()
    published: dict[int, str] = {}
    now = START
    for read in script:
        now = read["now"]
        cols = columns(read)
        ingest(window, cols, now)
        plain.add(cols)
        fields = export_head_and_seconds(
            window, now, head=HEAD, collector="c1", unacked=[], ledger=ledger, version=version
        )
        ledger.sent()
        for name, text in fields.items():
            if name != HEAD:
                published[int(name.rpartition("#")[2])] = text
    tail = window.window_start
    for first_byte in (False, True):
        for v, name in enumerate(VARIANTS):
            ring = window.ring(name, first_byte=first_byte)
            window_sums = plain._cell()
            for slot in np.flatnonzero(ring.second >= tail).tolist():
                second = int(ring.second[slot])
                want = plain.cells.get((first_byte, v, second), plain._cell())
                assert int(ring.count[slot]) == want["count"]
                assert int(ring.failures[slot]) == want["failures"]
                assert float(ring.sum_us[slot]) == float(want["sum_us"])
                assert int(ring.above[slot]) == want["above"]
                assert np.array_equal(ring.hist[slot], want["hist"])
                assert np.array_equal(ring.unit_counts[slot], want["unit_counts"])
                assert np.array_equal(ring.unit_sums[slot], want["unit_sums"])
                for key in window_sums:
                    window_sums[key] = window_sums[key] + want[key]
            assert ring.win_count == window_sums["count"]
            assert ring.win_failures == window_sums["failures"]
            assert ring.win_sum_us == float(window_sums["sum_us"])
            assert ring.win_above == window_sums["above"]
            assert np.array_equal(ring.win_hist, window_sums["hist"])
            assert np.array_equal(ring.win_unit_counts, window_sums["unit_counts"])
            assert np.array_equal(ring.win_unit_sums, window_sums["unit_sums"])
    # the last publish of each second in the window holds its rings' arrays exactly
    for slot, text in published.items():
        second = json.loads(text)
        for name, entry in second["variants"].items():
            v = VARIANTS.index(name)
            for first_byte, sums in ((False, entry), (True, entry["fb"])):
                want = plain.cells.get((first_byte, v, second["s"]), plain._cell())
                assert sums["count"] == want["count"], (first_byte, name, second["s"])
            ring = window.ring(name)
            if int(ring.second[slot]) != second["s"] or second["s"] < tail:
                continue
            check_field(entry, ring, slot, bins=window.mapping.bins)
            # as a reader takes it: format 3 leaves out of a paired first byte what
            # it shares with its total, and the total's texts must then be its own
            fb = entry["fb"]
            if version == 2:
                assert all(key in fb for key in SHARED_WITH_TOTAL)
            check_field(first_byte_entry(entry), window.ring(name, first_byte=True), slot,
                        bins=window.mapping.bins)  # fmt: skip
