"""Partial windows written second by second (partial format 2, decision 0058).

A format 1 partial (sharding.py) is one hash field holding the collector's whole
window of an experiment; every publish rewrote it, and every reader decoded all of it
every time it looked, though only the current second had changed. Format 2 splits it:

- the *head*, `@part:<collector>`: `{"v": 2, …}` (3 in format 3, below) with what
  format 1 carries besides the seconds (ts, alpha, bins, window_sec, threshold_ms,
  unacked), the ring's capacity `cap`, and per variant the seconds in the
  collector's window (`sec`) and the newest sample's time of each latency (`newest`,
  `fb_newest`);
- one *second field* per ring slot, `@part:<collector>#<second mod cap>`:
  `{"s": second, "variants": {name: entry}}`, an entry holding that second's sums as
  a format 1 entry holds them per second (count, fail, sum, above, stale, shed, the
  sparse histogram, the unit rows) plus the second's own reservoir and distinct-unit
  sketch, and the same for the first byte under `fb`.

A publish writes the head and the seconds that changed since the last one, in one
HSET (atomic: a reader sees a head and the seconds it lists, written together). A
second that left the window is simply no longer listed; its field is overwritten when
its slot is reused. A reader keeps what it decoded, keyed by the field's exact text
(`PartialCache`), so it decodes a second once, not at every look.

The sums a reader gets are the format 1 reader's, exactly: the same seconds, the
reservoir the bottom k of the listed seconds' reservoirs (as format 1 cut it), the
distinct sketch over the listed seconds (format 1's "whole window"). Sums of counts
are integers; the float sums (microseconds, bin indices) are sums of integers below
2^53, exact in any order, so the suffix sums here equal format 1's running sums.

Format 3 (decision 0072) is format 2 with a head saying `"v": 3` and a paired first
byte (VariantRing.paired: the second's first-byte samples are its total's, so their
reservoir keys, units and distinct units are the same) written without those three
texts: a reader takes them from the total's entry. They were ~20 % of the bytes a
publish wrote.

Format 4 (decision 0080) is format 3 with a head saying `"v": 4` and two texts written
smaller: a second's unit rows as the rows that hold samples in 32-bit integers
(`unit_rows`), where every sum fits (else `units` as before), and its distinct units
left out where its reservoir holds every sample of the second (a reader takes them
from the reservoir's units, `_distincts`). They were ~40 % of the bytes a publish
wrote at 50 samples a second.

Readers of every format come first in a rolling upgrade, collectors among them (they
read each other's partials: the unacked lists, the merged view, the expiry):
`CANARY_PARTIAL_FORMAT=3`, `=2` or `=1` keeps upgraded collectors writing that format until
every collector, controller and API process is upgraded. A reader that knows only
older formats skips the partials it cannot read: with none left it falls back to the
merged plain view, at most 5 s old.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import orjson

from controlplane.collector.log_mapping import F64, I64, U32
from controlplane.collector.ring import SECOND_RESERVOIR_SIZE, VariantRing
from controlplane.collector.totals import RESERVOIR_SIZE, UNIT_ROWS, WindowTotals
from controlplane.collector.windows import ExperimentWindow
from controlplane.kernel.units import DISTINCT_K, bottom_distinct

SECOND_PARTIAL_VERSION = 2
# format 2 but for a paired first-byte entry, which leaves out what it shares with its
# total (the reservoir keys and units, the distinct units): a format 2 reader would
# find those keys missing, so the head says 3 and such a reader skips the partial
SHARED_FB_VERSION = 3
# format 3 but for two texts written smaller (decision 0080): a second's unit rows as
# the rows that hold samples, in 32-bit integers, where every sum fits (`unit_rows`,
# else `units` as before), and its distinct units left out where its reservoir holds
# every sample of the second (the reader takes them from the reservoir's units)
COMPACT_VERSION = 4
SECOND_PARTIAL_VERSIONS = (SECOND_PARTIAL_VERSION, SHARED_FB_VERSION, COMPACT_VERSION)
SLOT_SEPARATOR = "#"
# the cheapest test of what a field is, without parsing it: json.dumps writes the
# keys in the order they are given, and every writer here gives "v" / "s" first
HEAD_OPENINGS = tuple(f'{{"v":{v},' for v in SECOND_PARTIAL_VERSIONS)
# what a paired first-byte entry shares with its total's (VariantRing.paired)
SHARED_WITH_TOTAL = ("res_k", "res_u", "distinct")
SECOND_OPENING = '{"s":'
MAX_CAPACITY = 4096  # slots a head may name (a window of MAX_WINDOW_SEC plus skew)
MAX_VARIANTS = 16
# float64 holds every integer up to 2^53 exactly: sums of such integers that stay
# within it are the same whatever the order they were added and subtracted in
EXACT_LIMIT = float(2**53)
# a run with more changed or added seconds than this is built again rather than
# slid: each change adds a row to every suffix row after it, each added second one
# row. Measured on a 10 s window of 50 samples a second: a slide adding 4 seconds
# costs 0.55 of a build, 6 seconds 0.75, 8 about one (a look that catches up a few
# seconds, as every look of a leader whose round takes seconds does)
MAX_SLID_CHANGES = 6
# a second's integer sums, one column each of a run's `tallies` (above: if not stale)
TALLIES = ("count", "failures", "above", "stale_rows", "shed")
STALE_ROWS = TALLIES.index("stale_rows")


def slot_field(head: str, slot: int) -> str:
    """The field of a head's slot: `@part:<collector>#<slot>`."""
    return f"{head}{SLOT_SEPARATOR}{slot}"


# --- writing --------------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _b64_le(values: npt.NDArray[Any], dtype: str) -> str:
    """`values` as little-endian `dtype`, base64: without a copy when they are already."""
    if values.dtype != np.dtype(dtype):
        values = values.astype(dtype)
    return _b64(values.tobytes())


def _second_entry(
    ring: VariantRing,
    slot: int,
    *,
    shed: bool,
    twin: dict[str, Any] | None = None,
    shared_left_out: bool = False,
    compact: bool = False,
) -> dict[str, Any]:
    """One ring's second. `twin`: the entry of the total ring's same second when this
    first-byte second is paired with it (the same reservoir keys, units and distinct
    units, see VariantRing.paired): those texts are taken from it, not encoded again,
    or with `shared_left_out` (format 3) not written at all. `compact` (format 4): the
    unit rows and distinct units as `COMPACT_VERSION` writes them."""
    from controlplane.collector.sharding import encode_hist_row, encode_unit_rows

    fill = int(ring.res_fill[slot])
    count = int(ring.count[slot])
    entry: dict[str, Any] = {
        "count": count,
        "fail": int(ring.failures[slot]),
        "sum": float(ring.sum_us[slot]),
        "above": int(ring.above[slot]),
        "stale": int(bool(ring.stale[slot])),
        "hist": encode_hist_row(ring.hist[slot]),
        "res_v": _b64_le(ring.res_us[slot, :fill], "<u4"),
    }
    sparse = None
    if compact:
        sparse = encode_sparse_unit_rows(ring.unit_counts[slot], ring.unit_sums[slot])
    if sparse is not None:
        entry["unit_rows"] = sparse
    else:
        entry["units"] = encode_unit_rows(ring.unit_counts[slot], ring.unit_sums[slot])
    if shed:
        entry["shed"] = int(ring.shed[slot])
    if twin is not None and shared_left_out:
        return entry
    if twin is not None:  # format 2: the total's texts again
        entry.update({key: twin[key] for key in SHARED_WITH_TOTAL})
        return entry
    units = ring.res_unit[slot, :fill]
    entry["res_k"] = _b64_le(ring.res_keys[slot, :fill], "<f4")
    entry["res_u"] = _b64_le(units, "<u4")
    distinct = ring.distinct[slot]
    if not (compact and fill == count and np.array_equal(bottom_distinct([units]), distinct)):
        entry["distinct"] = _b64_le(distinct, "<u4")
    return entry


# a sparse unit row: its index (u8), then its five columns as u32, column by column
_SPARSE_UNIT_WIDTH = 1 + 5 * 4
_U32_LIMIT = 2**32


def encode_sparse_unit_rows(
    counts: npt.NDArray[np.integer], sums: npt.NDArray[np.floating]
) -> str | None:
    """A second's unit rows that hold anything, deflated: their indices, then each of
    the five columns (count, failures, above, Σ bin index, Σ bin index²) as u32. None
    when a value is not an integer below 2^32 (a second of thousands of samples in one
    unit block): the dense rows are written then."""
    rows = np.empty((counts.shape[0], 5), dtype=np.float64)
    rows[:, :3] = counts
    rows[:, 3:] = sums
    held = np.flatnonzero(rows.any(axis=1))
    values = rows[held]
    if values.size and not 0 <= float(values.min()) <= float(values.max()) < _U32_LIMIT:
        return None  # NaN fails the comparison too
    as_u32 = values.astype("<u4")
    if not np.array_equal(as_u32, values):  # a fraction
        return None
    raw = held.astype("<u1").tobytes() + as_u32.T.tobytes()
    return _b64(zlib.compress(raw, 1))


@dataclass
class SlotLedger:
    """What a collector has yet to publish of one experiment's seconds: the slots
    changed since their last successful write (`due`), and those in the write under
    way (`sending`), due again if it fails."""

    due: set[int] = field(default_factory=set)
    sending: set[int] = field(default_factory=set)
    config: object = None  # the window's config at the last export
    capacity: int = 0

    def sent(self) -> None:
        self.sending = set()

    def failed(self) -> None:
        self.due |= self.sending
        self.sending = set()


def export_head_and_seconds(
    window: ExperimentWindow,
    now: float,
    *,
    head: str,
    collector: str,
    unacked: Iterable[str],
    ledger: SlotLedger,
    version: int = COMPACT_VERSION,
) -> dict[str, str]:
    """The fields of this collector's partial that changed: its head, and each second
    in its window written since it was last published (all of them after a rule
    change, which may restate every second's `stale`). `version` 3 leaves out of a
    paired first-byte entry what it shares with its total; 2 writes it again; 4 is 3
    with the unit rows and distinct units written smaller (`COMPACT_VERSION`)."""
    if version not in SECOND_PARTIAL_VERSIONS:
        raise ValueError(f"a second-by-second partial is format 2, 3 or 4, not {version!r}")
    window.advance(now)
    start = window.window_start
    rings = [(name, window.ring(name), window.ring(name, first_byte=True))
             for name in window.variants]  # fmt: skip
    capacity = rings[0][1].capacity if rings else 0
    if ledger.config != window.config or ledger.capacity != capacity:
        ledger.config, ledger.capacity = window.config, capacity
        for _, ring, fb in rings:
            ring.touched[:] = True
            fb.touched[:] = True
    variants: dict[str, Any] = {}
    listed: set[int] = set()
    for name, ring, fb in rings:
        slots = np.flatnonzero(ring.second >= start)
        seconds = ring.second[slots]
        order = np.argsort(seconds)
        listed.update(slots.tolist())
        variants[name] = {"sec": seconds[order].tolist(), "newest": ring.newest_ts,
                          "fb_newest": fb.newest_ts}  # fmt: skip
        for r in (ring, fb):
            changed = np.flatnonzero(r.touched)
            ledger.due.update(changed.tolist())
            r.touched[changed] = False
    fields: dict[str, str] = {}
    for slot in sorted(ledger.due & listed):
        second = None
        entries: dict[str, Any] = {}
        for name, ring, fb in rings:
            held = int(ring.second[slot])
            if held < start:
                continue
            second = held
            compact = version == COMPACT_VERSION
            entry = _second_entry(ring, slot, shed=True, compact=compact)
            twin = entry if fb.paired[slot] and fb.distinct[slot] is ring.distinct[slot] else None
            entry["fb"] = _second_entry(fb, slot, shed=False, twin=twin, compact=compact,
                                        shared_left_out=version != SECOND_PARTIAL_VERSION)
            entries[name] = entry
        if second is None:
            continue
        fields[slot_field(head, slot)] = json.dumps(
            {"s": second, "variants": entries}, separators=(",", ":")
        )
    ledger.sending = ledger.due & listed
    ledger.due = set()  # a slot out of the window is due again once it is claimed
    fields[head] = json.dumps({
        "v": version,
        "collector": collector,
        "ts": now,
        "alpha": window.mapping.alpha,
        "bins": window.mapping.bins,
        "window_sec": window.config.window_sec,
        "threshold_ms": window.config.threshold_ms,
        "unacked": sorted(unacked),
        "cap": capacity,
        "variants": variants,
    }, separators=(",", ":"))  # fmt: skip
    return fields


# --- reading --------------------------------------------------------------------------


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**53:
        raise ValueError("a partial's count is not a non-negative integer")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("a partial's sum is not a number")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError("a partial's sum is not a finite non-negative number")
    return number


@dataclass(frozen=True)
class SecondSums:
    """One latency of one variant in one second, decoded."""

    count: int
    failures: int
    sum_us: float
    above: int
    stale: bool
    shed: int
    # the histogram as the field holds it, its bins and their counts: a dense row of
    # every bin (`hist`) is made when a run is built or slid, not kept (a controller
    # keeps every second of every experiment it judges, ~1,100 bins a row)
    hist_bins: npt.NDArray[np.uint16]
    hist_counts: U32
    bins: int
    unit_counts: I64
    unit_sums: F64
    res_keys: npt.NDArray[np.float32]
    res_us: U32
    res_units: U32
    distinct: U32
    # the largest float sum, and whether every float sum is an integer in [0, 2^53]:
    # such rows add and subtract exactly, in any order (LatencyRun.slid)
    float_peak: float = 0.0
    integral: bool = False
    # what the second adds to a run's TALLIES, in their order
    tally: I64 = field(default_factory=lambda: np.zeros(len(TALLIES), dtype=np.int64))

    @property
    def hist(self) -> I64:
        """The dense row (a bin named twice keeps its last count, as the scatter of a
        whole field did)."""
        row = np.zeros(self.bins, dtype=np.int64)
        row[self.hist_bins] = self.hist_counts
        return row

    @classmethod
    def decode(cls, entry: object, bins: int, *, compact: bool = False) -> SecondSums:
        """One latency's entry alone (`decode_entries` decodes a field's together)."""
        return decode_entries([entry], bins, compact=compact)[0]


# what the writer's encoders make of a second without samples: such a field is
# recognised by its text and not inflated (any other text is, so a writer whose zlib
# deflates differently is read all the same)
EMPTY_HIST = base64.b64encode(zlib.compress(b"", 1)).decode("ascii")
UNIT_BYTES = UNIT_ROWS * 5 * 8
ZERO_UNITS = bytes(UNIT_BYTES)
EMPTY_UNITS = base64.b64encode(zlib.compress(ZERO_UNITS, 1)).decode("ascii")


def _hist_rows(
    entries: list[dict[str, Any]], bins: int
) -> list[tuple[npt.NDArray[np.uint16], U32]]:
    """The entries' sparse histograms, (bins, counts) each: views of one buffer of the
    field's pairs, every bin checked against `bins` at once."""
    where: list[bytes] = []
    counts: list[bytes] = []
    sizes: list[int] = []
    for entry in entries:
        text = entry["hist"]
        if text == EMPTY_HIST:
            sizes.append(0)
            continue
        if not isinstance(text, str):
            raise ValueError("a partial's histogram is not a string")
        # at most a pair per bin: a text that inflates beyond is refused unread
        raw = inflate_at_most(binascii.a2b_base64(text.encode("ascii")), 6 * bins)
        n = len(raw) // 6
        where.append(raw[: 2 * n])
        counts.append(raw[2 * n : 6 * n])
        sizes.append(n)
    bin_of = np.frombuffer(b"".join(where), dtype="<u2")
    count_of = np.frombuffer(b"".join(counts), dtype="<u4")
    if bin_of.shape[0] and int(bin_of.max()) >= bins:
        raise ValueError("a partial's histogram names a bin beyond its bins")
    out: list[tuple[npt.NDArray[np.uint16], U32]] = []
    at = 0
    for n in sizes:
        out.append((bin_of[at : at + n], count_of[at : at + n]))
        at += n
    return out


def inflate_at_most(raw: bytes, limit: int) -> bytes:
    """`raw` inflated, refused when it holds more than `limit` bytes (untrusted)."""
    if limit < 1:  # zlib reads a max_length of 0 as no limit at all
        raise ValueError("a partial's deflated text has no room to inflate into")
    inflater = zlib.decompressobj()
    out = inflater.decompress(raw, limit)
    if inflater.unconsumed_tail or not inflater.eof:
        raise ValueError("a partial's deflated text is longer than it may be, or cut")
    return out


def _sparse_unit_rows(text: object) -> bytes:
    """A format 4 entry's sparse unit rows (`encode_sparse_unit_rows`), inflated: n
    row indices (u8), then five columns of n u32."""
    if not isinstance(text, str):
        raise ValueError("a partial's unit rows are not a string")
    raw = inflate_at_most(binascii.a2b_base64(text.encode("ascii"), strict_mode=True),
                          UNIT_ROWS * _SPARSE_UNIT_WIDTH)  # fmt: skip
    if len(raw) % _SPARSE_UNIT_WIDTH:
        raise ValueError("a second's sparse unit rows have the wrong size")
    return raw


def _scatter_sparse(
    counts: I64, sums: F64, sparse: list[tuple[int, bytes]]
) -> None:
    """Each (entry, inflated sparse rows) into its entry's dense rows, all at once:
    each index once per entry, in order, within UNIT_ROWS."""
    held: list[npt.NDArray[np.uint8]] = []
    columns: list[npt.NDArray[np.uint32]] = []
    owners: list[int] = []
    sizes: list[int] = []
    for entry, raw in sparse:
        n = len(raw) // _SPARSE_UNIT_WIDTH
        held.append(np.frombuffer(raw, dtype="<u1", count=n))
        columns.append(np.frombuffer(raw, dtype="<u4", offset=n).reshape(5, n))
        owners.append(entry)
        sizes.append(n)
    rows = np.concatenate(held).astype(np.int64)
    if not rows.shape[0]:
        return
    # (entry, row) strictly increasing over every entry's rows: no row twice or out
    # of order within an entry (the owners increase)
    owner = np.repeat(np.array(owners, dtype=np.int64), sizes)
    key = owner * 256 + rows
    if int(rows.max()) >= UNIT_ROWS or bool((np.diff(key) <= 0).any()):
        raise ValueError("a second's sparse unit rows name a row twice, out of order or beyond")
    values = np.concatenate(columns, axis=1)
    counts[owner, rows] = values[:3].T
    sums[owner, rows] = values[3:].T


def _unit_rows(entries: list[dict[str, Any]], *, compact: bool) -> tuple[I64, F64]:
    """The entries' unit rows, (entries, UNIT_ROWS, 3) counts and (…, 2) sums, read
    from one buffer of all of them. `compact`: a format 4 field, whose entries may hold
    sparse rows instead (`unit_rows`), scattered into that buffer together."""
    raws: list[bytes] = []
    sparse: list[tuple[int, bytes]] = []
    for i, entry in enumerate(entries):
        if compact and ("units" in entry) == ("unit_rows" in entry):
            raise ValueError("a partial's second holds dense and sparse unit rows, or neither")
        if compact and "unit_rows" in entry:
            sparse.append((i, _sparse_unit_rows(entry["unit_rows"])))
            raws.append(ZERO_UNITS)
            continue
        text = entry["units"]
        if text == EMPTY_UNITS:
            raws.append(ZERO_UNITS)
            continue
        if not isinstance(text, str):
            raise ValueError("a partial's unit rows are not a string")
        raw = inflate_at_most(binascii.a2b_base64(text.encode("ascii")), UNIT_BYTES)
        if len(raw) != UNIT_BYTES:
            raise ValueError("a second's unit rows have the wrong size")
        raws.append(raw)
    joined: bytes | bytearray = b"".join(raws)
    m = len(entries)
    if sparse:  # written into: a buffer of its own, not a view of the bytes
        joined = bytearray(joined)
    counts = np.frombuffer(joined, dtype="<i8").reshape(m, UNIT_ROWS * 5)[:, : UNIT_ROWS * 3]
    sums = np.frombuffer(joined, dtype="<f8").reshape(m, UNIT_ROWS * 5)[:, UNIT_ROWS * 3 :]
    counts, sums = counts.reshape(m, UNIT_ROWS, 3), sums.reshape(m, UNIT_ROWS, 2)
    if sparse:
        _scatter_sparse(counts, sums, sparse)
    return counts, sums


def _packed(texts: list[object], dtype: str, limit: int) -> list[npt.NDArray[Any]]:
    """The entries' packed arrays of one column (strict base64 of little-endian `dtype`,
    at most `limit` items each), views of one array: a text several entries hold is
    decoded once."""
    width = np.dtype(dtype).itemsize
    spans: dict[str, tuple[int, int]] = {}
    raws: list[bytes] = []
    order: list[tuple[int, int]] = []
    at = 0
    for text in texts:
        if not isinstance(text, str):
            raise ValueError("a partial's packed array is not a string")
        span = spans.get(text)
        if span is None:
            raw = binascii.a2b_base64(text.encode("ascii"), strict_mode=True)
            if len(raw) % width or len(raw) // width > limit:
                raise ValueError("a partial's packed array has the wrong size")
            span = spans[text] = (at, at + len(raw) // width)
            at = span[1]
            raws.append(raw)
        order.append(span)
    column = np.frombuffer(b"".join(raws), dtype=dtype)
    # one view per text: entries that share a text share the array, which tells a
    # reader they hold the same (reservoir_pair)
    views = {span: column[span[0] : span[1]] for span in spans.values()}
    return [views[span] for span in order]


def _distincts(
    entries: list[dict[str, Any]], res_units: list[U32], *, compact: bool
) -> list[U32]:
    """Each entry's distinct units: as written, or (`compact`, format 4) left out where
    its reservoir holds every sample of its second, the reservoir's units. An entry
    that leaves them out with fewer reservoir samples than its count is malformed.
    Entries that share their units' text share the array (reservoir_pair tells a pair
    by it)."""
    written = [i for i, e in enumerate(entries) if "distinct" in e or not compact]
    out: list[U32 | None] = [None] * len(entries)
    for i, array in zip(written, _packed([entries[i]["distinct"] for i in written], "<u4",
                                         DISTINCT_K), strict=True):  # fmt: skip
        out[i] = array
    derived: dict[int, U32] = {}  # by the id of the units' (shared) array
    for i, entry in enumerate(entries):
        if out[i] is not None:
            continue
        units = res_units[i]
        if units.shape[0] != _count(entry["count"]):
            raise ValueError("a partial's second leaves out its distinct units, which its "
                             "reservoir does not hold all of")  # fmt: skip
        held = derived.get(id(units))
        if held is None:
            held = derived[id(units)] = bottom_distinct([units])
        out[i] = held
    return cast(list[U32], out)  # every entry's, written or derived


def decode_entries(entries: list[object], bins: int, *, compact: bool = False) -> list[SecondSums]:
    """Latency entries (of one second field), decoded together: the histograms,
    unit rows and integrality checks of all of them in a few array operations, and
    a packed array named by several entries (a first-byte second shares its total's
    reservoir keys, units and distinct units) decoded once."""
    checked: list[dict[str, Any]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise ValueError("a partial's second entry is not an object")
        checked.append(entry)
    if not checked:
        return []
    hist = _hist_rows(checked, bins)
    unit_counts, unit_sums = _unit_rows(checked, compact=compact)
    flat = unit_sums.reshape(len(checked), -1)
    peaks = flat.max(axis=1).tolist()
    whole = ((flat >= 0) & (np.floor(flat) == flat)).all(axis=1).tolist()
    res_keys = _packed([e["res_k"] for e in checked], "<f4", SECOND_RESERVOIR_SIZE)
    res_us = _packed([e["res_v"] for e in checked], "<u4", SECOND_RESERVOIR_SIZE)
    res_units = _packed([e["res_u"] for e in checked], "<u4", SECOND_RESERVOIR_SIZE)
    distincts = _distincts(checked, res_units, compact=compact)
    parts: list[tuple[Any, ...]] = []
    for i, entry in enumerate(checked):
        keys, values, units = res_keys[i], res_us[i], res_units[i]
        if not keys.shape[0] == values.shape[0] == units.shape[0]:
            raise ValueError("a partial's reservoir columns differ in length")
        sum_us = _number(entry["sum"])
        count, failures = _count(entry["count"]), _count(entry["fail"])
        above, stale = _count(entry["above"]), bool(entry["stale"])
        shed = _count(entry.get("shed", 0))
        parts.append(
            (count, failures, sum_us, above, stale, shed, keys, values, units, distincts[i])
        )
    tally = np.array([(p[0], p[1], 0 if p[4] else p[3], int(p[4]), p[5]) for p in parts],
                     dtype=np.int64)  # fmt: skip
    out: list[SecondSums] = []
    for i, part in enumerate(parts):
        count, failures, sum_us, above, stale, shed, keys, values, units, distinct = part
        peak = max(sum_us, peaks[i], 0.0)
        out.append(SecondSums(
            count=count,
            failures=failures,
            sum_us=sum_us,
            above=above,
            stale=stale,
            shed=shed,
            hist_bins=hist[i][0],
            hist_counts=hist[i][1],
            bins=bins,
            unit_counts=unit_counts[i],
            unit_sums=unit_sums[i],
            res_keys=keys,
            res_us=values,
            res_units=units,
            distinct=distinct,
            float_peak=peak if math.isfinite(peak) else math.inf,
            integral=sum_us.is_integer() and peak <= EXACT_LIMIT and whole[i],
            tally=tally[i],
        ))  # fmt: skip
    return out


Second = dict[str, tuple[SecondSums, SecondSums]]  # variant → (total, first byte)


def decode_second(raw: str, bins: int, *, compact: bool = False) -> tuple[int, Second]:
    """A second field: its second, and per variant its two latencies' sums. `compact`:
    a field of a format 4 head (COMPACT_VERSION)."""
    return decode_seconds([raw], bins, compact=compact)[0]


def decode_seconds(
    raws: list[str], bins: int, *, compact: bool = False
) -> list[tuple[int, Second]]:
    """Second fields decoded together (`decode_second` of each): their entries go
    through one `decode_entries`, whose array work is per call, not per field (a look
    that catches up on several seconds decodes them all at once). One malformed field
    is a ValueError for all of them, as it is for the partial that lists it."""
    entries: list[object] = []
    heads: list[tuple[int, list[str]]] = []
    for raw in raws:
        # orjson: a third of json's time on these fields, and stricter: no NaN, no
        # lone surrogate, and an integer beyond 64 bits read as a float, which no
        # second, count or capacity check accepts
        data = orjson.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("variants"), dict):
            raise ValueError("a partial's second field is not an object with variants")
        second = data["s"]
        if isinstance(second, bool) or not isinstance(second, int):
            raise ValueError("a partial's second is not an integer")
        if len(data["variants"]) > MAX_VARIANTS:
            raise ValueError("a partial's second has too many variants")
        for entry in data["variants"].values():
            if not isinstance(entry, dict):
                raise ValueError("a partial's second entry is not an object")
            entries += (entry, first_byte_entry(entry))
        heads.append((second, [str(name) for name in data["variants"]]))
    sums = decode_entries(entries, bins, compact=compact)
    out: list[tuple[int, Second]] = []
    at = 0
    for second, names in heads:
        out.append((second, {name: (sums[at + 2 * i], sums[at + 2 * i + 1])
                             for i, name in enumerate(names)}))  # fmt: skip
        at += 2 * len(names)
    return out


def first_byte_entry(entry: dict[str, Any]) -> object:
    """A second entry's first byte: with a reservoir of its own (a format 4 entry may
    leave out its distinct units, read from that reservoir), or, paired (formats 3
    and 4), without any of SHARED_WITH_TOTAL, which are then its total's (a format 4
    total may itself leave out the distinct units). Anything between is malformed."""
    fb = entry["fb"]
    if not isinstance(fb, dict):
        raise ValueError("a partial's first-byte entry is not an object")
    missing = [key for key in SHARED_WITH_TOTAL if key not in fb]
    if not missing or missing == ["distinct"]:
        return fb
    if len(missing) != len(SHARED_WITH_TOTAL):
        raise ValueError("a partial's first-byte entry leaves out part of what it shares")
    return {**fb, **{key: entry[key] for key in SHARED_WITH_TOTAL if key in entry}}


def _row_of(s: SecondSums, column: str) -> Any:
    """One second's contribution to a run's suffix column."""
    if column == "stale_hist":
        return s.hist if s.stale else 0
    return getattr(s, column)


_SLID_COLUMNS = (("tallies", "tally"), ("sum_us", "sum_us"), ("hist", "hist"),
                 ("unit_counts", "unit_counts"), ("unit_sums", "unit_sums"))  # fmt: skip


# rows a run's buffers hold beyond its last, for a slide that adds seconds to write
# into instead of copying every row into new arrays. None: measured on the window
# look rig, 8 rows took 8.8 % off a look's instructions and 2 rows 4.7 %, and they
# grew a controller's decoded partials by 55 % and 17 %; a look that only changes
# seconds (a publish within the second) or drops them is slid in place all the same
ROOM_ROWS = 0


@dataclass
class RowBuffers:
    """The arrays a run's running sums are views of, with room after the last row.

    `slid` moves the run's start past the seconds that left the front, writes added
    seconds into the room and adds changed seconds to the rows in place, so the run it
    slid from is `spent`: its arrays now hold its successor's rows. A look keeps only
    the newest run of each partial (PartialCache), so nothing reads a spent run; one
    that does is refused rather than read wrong."""

    columns: dict[str, npt.NDArray[Any]]
    start: int  # the buffer row of the run's first (origin) row
    spent: bool = False

    @classmethod
    def holding(cls, columns: dict[str, npt.NDArray[Any]], rows: int) -> RowBuffers:
        """Buffers of `rows` rows and room after them, holding `columns`' rows from
        row 0 (arrays already of that size are taken as they are)."""
        out: dict[str, npt.NDArray[Any]] = {}
        for name, held in columns.items():
            if held.shape[0] == rows + ROOM_ROWS:
                out[name] = held
                continue
            buffer = np.empty((rows + ROOM_ROWS, *held.shape[1:]), dtype=held.dtype)
            buffer[: held.shape[0]] = held
            out[name] = buffer
        return cls(out, 0)

    def views(self, rows: int) -> dict[str, npt.NDArray[Any]]:
        return {name: buffer[self.start : self.start + rows]
                for name, buffer in self.columns.items()}  # fmt: skip


def _dropped_front(old: list[int], new: list[int]) -> int:
    """How many of `old`'s first seconds `new` no longer holds: those before its
    first (the window moved on). The rows after them are compared position by
    position, so any answer is correct; this one leaves the fewest changed."""
    return bisect.bisect_left(old, new[0]) if new else len(old)


@dataclass(frozen=True)
class LatencyRun:
    """One latency of one variant over the listed seconds, as running sums: row i
    holds the sums over the seconds before position i (from an origin that stays put
    as seconds leave), so a window starting anywhere is the last row minus one.

    A publish changes the newest seconds, which only the rows after them sum; a
    second leaving the front takes its row with it; a new second is one more row.
    That is what `slid` does instead of building every row again."""

    seconds: I64
    tallies: I64  # (n + 1, len(TALLIES))
    sum_us: F64
    hist: I64  # (n + 1, bins)
    stale_hist: I64 | None  # (n + 1, bins), None: no row is stale
    unit_counts: I64
    unit_sums: F64
    newest_ts: float | None
    res_keys: npt.NDArray[np.float32]
    res_us: U32
    res_seconds: I64
    res_units: U32
    distinct: U32
    # the seconds' sums the run was made of, and whether its float sums are integers
    # within EXACT_LIMIT (then `slid` may subtract and add rows)
    rows: tuple[SecondSums, ...] = ()
    exact: bool = False
    # what the running sums are views of (None: arrays of their own)
    buffers: RowBuffers | None = field(default=None, compare=False, repr=False)

    @classmethod
    def build(
        cls, seconds: list[int], sums: list[SecondSums], bins: int, newest: float | None,
        reservoir: dict[str, Any] | None = None,
    ) -> LatencyRun:  # fmt: skip
        """`reservoir`: `_reservoir(seconds, sums)` when the caller has it already."""
        n = len(sums)

        def running(values: list[Any], shape: tuple[int, ...], dtype: Any) -> npt.NDArray[Any]:
            out = np.zeros((n + 1, *shape), dtype=dtype)
            if n:
                np.cumsum(np.stack(values) if shape else np.array(values, dtype=dtype),
                          axis=0, out=out[1:])  # fmt: skip
            return out

        def running_hist(only_stale: bool) -> I64:
            # each second's pairs scattered into its row, then summed down in place:
            # no dense row per second, nor a stack of them, is made
            out = np.zeros((n + 1, bins), dtype=np.int64)
            for j, s in enumerate(sums):
                if s.stale or not only_stale:
                    out[j + 1, s.hist_bins] = s.hist_counts
            if n:
                np.cumsum(out[1:], axis=0, out=out[1:])
            return out

        stale = [s.stale for s in sums]
        sum_us = running([s.sum_us for s in sums], (), np.float64)
        unit_sums = running([s.unit_sums for s in sums], (UNIT_ROWS, 2), np.float64)
        exact = (
            all(s.integral for s in sums)
            and max(float(sum_us[-1]), float(unit_sums[-1].max())) <= EXACT_LIMIT
        )
        columns = {
            "tallies": running([s.tally for s in sums], (len(TALLIES),), np.int64),
            "sum_us": sum_us,
            "hist": running_hist(False),
            "unit_counts": running([s.unit_counts for s in sums], (UNIT_ROWS, 3), np.int64),
            "unit_sums": unit_sums,
        }
        # only a run that may be slid gets room to be slid in
        buffers = RowBuffers.holding(columns, n + 1) if exact else None
        return cls(
            seconds=np.array(seconds, dtype=np.int64),
            **(buffers.views(n + 1) if buffers is not None else columns),
            stale_hist=running_hist(True) if any(stale) else None,
            newest_ts=newest,
            **(reservoir if reservoir is not None else _reservoir(seconds, sums)),
            rows=tuple(sums),
            exact=exact,
            buffers=buffers,
        )  # fmt: skip

    def slid(
        self, seconds: list[int], sums: list[SecondSums], bins: int, newest: float | None,
        reservoir: dict[str, Any] | None = None,
    ) -> LatencyRun:  # fmt: skip
        """The run over `seconds` from this one: the rows of the seconds that left the
        front dropped, a row for each second added, and each position whose second
        changed adding its difference to the rows after it. Exact: counts are
        integers, and the float sums are integers within EXACT_LIMIT before and after
        (checked; built again where they are not, or where more than a few seconds
        changed, the usual publish changing one or two)."""
        dropped = _dropped_front(self.seconds.tolist(), seconds)
        kept = len(self.rows) - dropped
        held = self.buffers
        if not self.exact or kept > len(sums) or held is None or held.spent:
            # seconds gone from the end (a restart), or rows not held to slide in place
            # (a slide from this run broke off midway: a malformed field)
            return LatencyRun.build(seconds, sums, bins, newest, reservoir)
        changes = [(j, self.rows[dropped + j], sums[j]) for j in range(kept)
                   if sums[j] is not self.rows[dropped + j]]  # fmt: skip
        added = sums[kept:]
        # every intermediate float sum lies within ± (the last row + what is added or
        # removed)
        reach = max(float(self.sum_us[-1]), float(self.unit_sums[-1].max()))
        reach += sum(s.float_peak for s in added)
        reach += sum(before.float_peak + after.float_peak for _, before, after in changes)
        if (
            len(changes) + len(added) > MAX_SLID_CHANGES
            or reach > EXACT_LIMIT
            or not all(after.integral for _, _, after in changes)
            or not all(s.integral for s in added)
        ):
            return LatencyRun.build(seconds, sums, bins, newest, reservoir)
        n = len(sums)

        def slide(old: npt.NDArray[Any], column: str) -> npt.NDArray[Any]:
            out = np.empty((n + 1, *old.shape[1:]), dtype=old.dtype)
            out[: kept + 1] = old[dropped:]
            for j in range(kept, n):
                out[j + 1] = out[j] + _row_of(sums[j], column)
            for j, before, after in changes:
                out[j + 1 :] += _row_of(after, column)
                out[j + 1 :] -= _row_of(before, column)
            return out

        # this run's rows become the new run's: it is spent from here on, whatever
        # happens below
        held.spent = True
        start = held.start + dropped
        buffers = RowBuffers(held.columns, start)
        if start + n + 1 > held.columns["hist"].shape[0]:
            # no room left after the last row: the kept rows move to new buffers
            buffers = RowBuffers.holding(
                {name: rows[start : start + kept + 1] for name, rows in held.columns.items()},
                n + 1,
            )  # fmt: skip
        columns = buffers.views(n + 1)
        for mine, row in _SLID_COLUMNS:
            out = columns[mine]
            if mine == "hist":  # the seconds' sparse pairs, added where they fall
                for j in range(kept, n):
                    out[j + 1] = out[j]
                    out[j + 1, sums[j].hist_bins] += sums[j].hist_counts
                for j, before, after in changes:
                    out[j + 1 :, after.hist_bins] += after.hist_counts
                    out[j + 1 :, before.hist_bins] -= before.hist_counts
                continue
            for j in range(kept, n):
                out[j + 1] = out[j] + getattr(sums[j], row)
            for j, before, after in changes:
                out[j + 1 :] += getattr(after, row)
                out[j + 1 :] -= getattr(before, row)
        stale_hist = None
        if columns["tallies"][-1, STALE_ROWS] > columns["tallies"][0, STALE_ROWS]:
            # its own arrays, not the buffers': only the row count of `hist` is read
            stale_held = self.stale_hist
            if stale_held is None:
                stale_held = np.zeros_like(self.hist)
            stale_hist = slide(stale_held, "stale_hist")
        return LatencyRun(
            seconds=np.array(seconds, dtype=np.int64),
            **columns,
            stale_hist=stale_hist,
            newest_ts=newest,
            **(reservoir if reservoir is not None else _reservoir(seconds, sums)),
            rows=tuple(sums),
            exact=True,
            buffers=buffers,
        )

    def totals(self, start: int, *, same_threshold: bool, bins: int) -> WindowTotals:
        """The sums over the seconds from `start` on, as format 1's reader makes them."""
        if self.buffers is not None and self.buffers.spent:
            raise RuntimeError("a run slid in place no longer holds its own rows")
        i = int(np.searchsorted(self.seconds, start, side="left"))
        count, failures, above, stale_rows, shed = (self.tallies[-1] - self.tallies[i]).tolist()
        hist = self.hist[-1] - self.hist[i]
        rows = self.seconds.shape[0] - i
        stale_hist: I64 | None = None
        if same_threshold:
            if self.stale_hist is not None and stale_rows > 0:
                stale_hist = self.stale_hist[-1] - self.stale_hist[i]
        elif rows:
            stale_hist = hist.copy()
        inside = self.res_seconds >= start
        # every field given: no default array is made only to be replaced
        return WindowTotals(
            bins=bins,
            count=count,
            failures=failures,
            sum_us=float(self.sum_us[-1] - self.sum_us[i]),
            above_exact=above if same_threshold else 0,
            shed=shed,
            stale_hist=stale_hist,
            hist=hist,
            newest_ts=self.newest_ts,
            res_keys=self.res_keys[inside],
            res_us=self.res_us[inside],
            res_units=self.res_units[inside],
            unit_counts=self.unit_counts[-1] - self.unit_counts[i],
            unit_sums=self.unit_sums[-1] - self.unit_sums[i],
            distinct=self.distinct,
        )


def _reservoir(seconds: list[int], sums: list[SecondSums]) -> dict[str, Any]:
    """A run's reservoir as format 1 cut it (the bottom k over all its seconds, with
    each sample's second) and its distinct units over all its seconds: neither is a
    sum, so both are taken again from the seconds whenever the run changes."""
    return _reservoir_and_order(seconds, sums)[0]


def _reservoir_and_order(
    seconds: list[int], sums: list[SecondSums]
) -> tuple[dict[str, Any], npt.NDArray[Any]]:
    """`_reservoir`, and the positions it kept of the seconds' samples in turn."""
    if not sums:
        return {
            "res_keys": np.zeros(0, np.float32), "res_us": np.zeros(0, np.uint32),
            "res_seconds": np.zeros(0, np.int64), "res_units": np.zeros(0, np.uint32),
            "distinct": np.zeros(0, np.uint32),
        }, np.zeros(0, np.int64)  # fmt: skip
    keys = np.concatenate([s.res_keys for s in sums])
    order = np.arange(keys.shape[0])
    if keys.shape[0] > RESERVOIR_SIZE:
        order = np.argpartition(keys, RESERVOIR_SIZE - 1)[:RESERVOIR_SIZE]
    res_seconds = np.repeat(np.array(seconds, dtype=np.int64),
                            [s.res_keys.shape[0] for s in sums])  # fmt: skip
    return {
        "res_keys": keys[order],
        "res_us": np.concatenate([s.res_us for s in sums])[order],
        "res_seconds": res_seconds[order],
        "res_units": np.concatenate([s.res_units for s in sums])[order],
        "distinct": bottom_distinct([s.distinct for s in sums]),
    }, order


def reservoir_pair(
    seconds: list[int], totals: list[SecondSums], firsts: list[SecondSums]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reservoirs of a variant's total and first-byte runs over the same seconds.
    Where every first-byte second shares its total's keys, units and distinct units
    (a paired second, decoded from one text), the first byte's is the total's but for
    its values: the same keys give the same bottom k, which is not cut again."""
    total, order = _reservoir_and_order(seconds, totals)
    if len(firsts) != len(totals) or not all(
        f.res_keys is t.res_keys and f.res_units is t.res_units and f.distinct is t.distinct
        for t, f in zip(totals, firsts, strict=True)
    ):
        return total, _reservoir(seconds, firsts)
    first = dict(total)
    if firsts:
        first["res_us"] = np.concatenate([s.res_us for s in firsts])[order]
    return total, first


@dataclass(frozen=True)
class AssembledPartial:
    """A format 2 or 3 partial put together from its head and the seconds it lists."""

    head: dict[str, Any]
    runs: dict[str, tuple[LatencyRun, LatencyRun]]  # variant → (total, first byte)


def head_of(raw: str) -> dict[str, Any]:
    data = orjson.loads(raw)
    if not isinstance(data, dict) or data.get("v") not in SECOND_PARTIAL_VERSIONS:
        raise ValueError("not a format 2 or 3 partial head")
    cap = data.get("cap")
    if isinstance(cap, bool) or not isinstance(cap, int) or not 0 <= cap <= MAX_CAPACITY:
        raise ValueError("a partial head's capacity is out of bounds")
    variants = data.get("variants")
    if not isinstance(variants, dict) or len(variants) > MAX_VARIANTS:
        raise ValueError("a partial head's variants are not an object")
    for part in variants.values():
        seconds = part.get("sec") if isinstance(part, dict) else None
        if not isinstance(seconds, list) or len(seconds) > cap:
            raise ValueError("a partial head's seconds are not a list within its capacity")
        if any(isinstance(s, bool) or not isinstance(s, int) for s in seconds):
            raise ValueError("a partial head's seconds are not integers")
    return data


def assemble(
    head_field: str, head: dict[str, Any], fields: Mapping[str, str],
    decoded: PartialCache | None = None, experiment: str = "",
    previous: AssembledPartial | None = None,
) -> AssembledPartial:  # fmt: skip
    """Put a head's seconds together (decoding each through `decoded` when given;
    from `previous`, the same collector's partial assembled before, by the seconds
    that changed when its bins are the same)."""
    bins = int(head["bins"])
    cap = int(head["cap"])
    compact = head["v"] == COMPACT_VERSION  # its fields may be written smaller
    if previous is not None and int(previous.head["bins"]) != bins:
        previous = None
    runs: dict[str, tuple[LatencyRun, LatencyRun]] = {}
    if decoded is not None and cap:
        # the seconds not decoded yet, decoded together
        listed = {s for part in head["variants"].values() for s in part["sec"]}
        decoded.decode_missing(experiment, [slot_field(head_field, s % cap) for s in listed],
                               fields, bins, compact=compact)  # fmt: skip
    for name, part in head["variants"].items():
        totals: list[SecondSums] = []
        firsts: list[SecondSums] = []
        for second in part["sec"]:
            name_of_slot = slot_field(head_field, second % cap) if cap else ""
            raw = fields.get(name_of_slot)
            if raw is None:
                raise ValueError(f"a partial head lists second {second} without its field")
            if decoded is not None:
                held, per_variant = decoded.second(experiment, name_of_slot, raw, bins,
                                                   compact=compact)  # fmt: skip
            else:
                held, per_variant = decode_second(raw, bins, compact=compact)
            if held != second or name not in per_variant:
                raise ValueError(f"a partial head lists second {second}, its field holds another")
            total, first = per_variant[name]
            totals.append(total)
            firsts.append(first)
        newest, fb_newest = part.get("newest"), part.get("fb_newest")
        before = previous.runs.get(str(name)) if previous is not None else None
        res_total, res_first = reservoir_pair(part["sec"], totals, firsts)
        if before is None:
            runs[str(name)] = (
                LatencyRun.build(part["sec"], totals, bins, _ts(newest), res_total),
                LatencyRun.build(part["sec"], firsts, bins, _ts(fb_newest), res_first),
            )
        else:
            runs[str(name)] = (
                before[0].slid(part["sec"], totals, bins, _ts(newest), res_total),
                before[1].slid(part["sec"], firsts, bins, _ts(fb_newest), res_first),
            )
    return AssembledPartial(head, runs)


def _ts(value: object) -> float | None:
    if value is None:
        return None
    return _number(value)


@dataclass
class PartialCache:
    """What a reader decoded of the stats hashes it reads again and again: each second
    field by its exact text, and each assembled partial by its fields' texts. A round
    forgets the experiments it no longer reads (`keep`)."""

    seconds: dict[str, dict[str, tuple[str, tuple[int, Second]]]] = field(default_factory=dict)
    heads: dict[str, dict[str, tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    partials: dict[str, dict[str, tuple[tuple[str, ...], AssembledPartial]]] = field(
        default_factory=dict
    )
    # a window merged per (experiment, window_sec, threshold): the key it was merged
    # under (start second, partial fields), the snapshots, each variant's newest times
    merged: dict[tuple[str, int | None, Any], tuple[Any, Any, Any]] = field(default_factory=dict)
    hits: int = 0
    decodes: int = 0
    merged_hits: int = 0

    def decode_missing(
        self, experiment: str, names: Iterable[str], fields: Mapping[str, str], bins: int,
        *, compact: bool = False,
    ) -> None:  # fmt: skip
        """Decode together the fields of `names` not held at their text (absent ones
        are left for `second` to report)."""
        held = self.seconds.setdefault(experiment, {})
        missing: dict[str, str] = {}
        for name in names:
            raw = fields.get(name)
            kept = held.get(name)
            if raw is not None and (kept is None or kept[0] != raw):
                missing[name] = raw
        if len(missing) < 2:
            return  # one field: decoded by `second` as it is met
        self.decodes += len(missing)
        for (name, raw), value in zip(
            missing.items(), decode_seconds(list(missing.values()), bins, compact=compact),
            strict=True,
        ):
            held[name] = (raw, value)

    def second(
        self, experiment: str, name: str, raw: str, bins: int, *, compact: bool = False
    ) -> tuple[int, Second]:
        held = self.seconds.setdefault(experiment, {}).get(name)
        if held is not None and held[0] == raw:
            self.hits += 1
            return held[1]
        self.decodes += 1
        value = decode_second(raw, bins, compact=compact)
        self.seconds[experiment][name] = (raw, value)
        return value

    def head(self, experiment: str, head_field: str, raw_head: str) -> dict[str, Any]:
        """A head parsed (`head_of`), again only when its text changed."""
        held = self.heads.setdefault(experiment, {}).get(head_field)
        if held is not None and held[0] == raw_head:
            return held[1]
        head = head_of(raw_head)
        self.heads[experiment][head_field] = (raw_head, head)
        return head

    def assembled(
        self, experiment: str, head_field: str, raw_head: str, fields: Mapping[str, str]
    ) -> AssembledPartial:
        head = self.head(experiment, head_field, raw_head)
        cap = int(head["cap"])
        listed = sorted({s for part in head["variants"].values() for s in part["sec"]})
        key = (raw_head, *(fields.get(slot_field(head_field, s % cap), "") for s in listed))
        held = self.partials.setdefault(experiment, {}).get(head_field)
        if held is not None and held[0] == key:
            return held[1]
        previous = held[1] if held is not None else None
        assembled = assemble(head_field, head, fields, self, experiment, previous)
        self.partials[experiment][head_field] = (key, assembled)
        seconds = self.seconds.get(experiment, {})
        wanted = {slot_field(head_field, s % cap) for s in listed}
        for name in [n for n in seconds if n.startswith(head_field + SLOT_SEPARATOR)]:
            if name not in wanted:
                del seconds[name]
        return assembled

    def keep(self, experiments: set[str]) -> None:
        for table in (self.seconds, self.partials, self.heads):
            for experiment in [e for e in table if e not in experiments]:
                del table[experiment]
        for key in [k for k in self.merged if k[0] not in experiments]:
            del self.merged[key]


def own_fields(fields: Mapping[str, str], head: str) -> dict[str, str]:
    """A partial's fields in a stats hash: its head and its second fields (a field of
    another collector whose name happens to extend this one's is not a second field:
    it does not hold one)."""
    out = {head: fields[head]} if head in fields else {}
    prefix = head + SLOT_SEPARATOR
    for name, raw in fields.items():
        if (
            name.startswith(prefix)
            and name[len(prefix) :].isdigit()
            and raw.startswith(SECOND_OPENING)
        ):
            out[name] = raw
    return out
