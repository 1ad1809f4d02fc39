"""Several collectors, one exact window: partial windows and their merge.

Each collector reads only its share of a samples stream (the consumer group hands
every entry to one consumer), so no single collector holds an experiment's whole
window. Each publishes its own *partial window* to the experiment's stats hash,
under the field `@part:<collector>`: per second in the window, the count, failures,
RT sum, exact above-threshold count and the sparse histogram, plus a reservoir. A
reader sums the partials second by second, drops the seconds that have left its
window, and gets the window over everything every collector applied. The plain
`<variant>` fields (architecture §5) are the merge as the publishing collector saw it.

Each variant's entry also carries `shed`, per second, the requests the sidecars shed
(tallies, never samples; docs/decisions/0025-overload-and-judgment.md); a partial
from a collector older than it has none, which counts 0. Each variant's entry
carries the same sums for the first byte under `fb` (the samples
that have one, ring for ring as in windows.py). A partial from a collector older than
the first byte has no `fb`: its samples count in the total only, as samples without a
first byte, so the merged first-byte window is exact over the samples that have one.

Exactness under a crash (docs/decisions/0004-collector-sharding.md):

- a collector acks entries only after a partial containing them is in Redis, so an
  acked entry is always counted in some published partial;
- the partial lists the entries it contains that are not acked yet (`unacked`);
  the partial and its list are one HSET field, written atomically;
- a collector that claims a dead consumer's pending entries skips (and acks) those
  listed in another collector's partial: they are counted already.

So an entry is counted exactly once whether its collector dies before publishing
(still pending, claimed and counted by a live one), between publish and ack (listed
in `unacked`, skipped by the claimer) or after the ack.

A dead collector's partial ages out of every window but would stay in the hash, read
and parsed by every reader, one more with each collector restart. A live collector
removes, when it publishes, the partials of others that no window can reach any more
(`expired_partials`, which also says why that is safe for the `unacked` lists).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.collector.screening import excerpt
from controlplane.collector.second_partials import (
    HEAD_OPENINGS,
    SECOND_OPENING,
    SECOND_PARTIAL_VERSIONS,
    AssembledPartial,
    PartialCache,
    assemble,
    head_of,
    inflate_at_most,
)
from controlplane.collector.windows import (
    DEFAULT_ALPHA,
    MAX_WINDOW_SEC,
    RESERVOIR_SIZE,
    SECOND_RESERVOIR_SIZE,
    UNIT_ROWS,
    ExperimentWindow,
    LogMapping,
    VariantRing,
    WindowTotals,
    bottom_k_index,
    with_first_byte,
)
from controlplane.kernel.errors import CodecError
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.streams import SnapshotBoard
from controlplane.kernel.units import DISTINCT_K

PART_PREFIX = "@part:"
PARTIAL_VERSION = 1
# On top of the longest window: a partial is removed only this much later than the
# moment it left every window, to absorb a late tick and the clocks of the collectors
# and readers (the controller, on another host) disagreeing by a few seconds.
EXPIRY_MARGIN_SEC = 5


# what reading a damaged partial (untrusted JSON and base64 from Redis) can raise
MALFORMED = (
    KeyError, TypeError, ValueError, AttributeError, OverflowError, binascii.Error,
    zlib.error,
)  # fmt: skip
# the finest relative accuracy a reader builds bins for (11,450 of them): a partial
# naming a finer one is refused, as its bins would be built as asked (1e-9: ~10^11)
MIN_READ_ALPHA = 0.001

_MAPPINGS: dict[float, LogMapping] = {}


def mapping_for(alpha: float) -> LogMapping:
    """The bins of `alpha`, built once: a reader merges windows of one alpha (or a
    few, during a change of it) again and again."""
    mapping = _MAPPINGS.get(alpha)
    if mapping is None:
        if len(_MAPPINGS) >= 8:
            _MAPPINGS.clear()
        mapping = _MAPPINGS[alpha] = LogMapping(alpha)
    return mapping


def part_field(collector: str) -> str:
    return f"{PART_PREFIX}{collector}"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def encode_hist_row(row: npt.NDArray[np.integer]) -> str:
    """A per-second histogram as sparse (u16 bin, u32 count) pairs, deflated."""
    where = np.flatnonzero(row)
    raw = where.astype("<u2").tobytes() + row[where].astype("<u4").tobytes()
    return _b64(zlib.compress(raw, 1))


def decode_hist_row_into(text: str, dense: npt.NDArray[np.int64]) -> None:
    # at most a (bin, count) pair per bin: a text that inflates beyond is refused
    raw = inflate_at_most(_unb64(text), 6 * dense.shape[0])
    n = len(raw) // 6
    where = np.frombuffer(raw, dtype="<u2", count=n)
    counts = np.frombuffer(raw, dtype="<u4", count=n, offset=2 * n)
    if n and int(where.max()) >= dense.shape[0]:
        raise ValueError("a partial's histogram names a bin beyond its bins")
    dense[where] += counts


def encode_unit_rows(counts: npt.NDArray[np.integer], sums: npt.NDArray[np.floating]) -> str:
    """A second's unit rows: counts as i8, then the two index sums as f8, deflated."""
    raw = counts.astype("<i8").tobytes() + sums.astype("<f8").tobytes()
    return _b64(zlib.compress(raw, 1))


def decode_unit_rows_into(
    text: str, counts: npt.NDArray[np.int64], sums: npt.NDArray[np.float64]
) -> None:
    raw = inflate_at_most(_unb64(text), UNIT_ROWS * 5 * 8)
    if len(raw) != UNIT_ROWS * 5 * 8:
        raise ValueError("a second's unit rows have the wrong size")
    counts += np.frombuffer(raw, dtype="<i8", count=UNIT_ROWS * 3).reshape(UNIT_ROWS, 3)
    sums += np.frombuffer(raw, dtype="<f8", offset=UNIT_ROWS * 3 * 8).reshape(UNIT_ROWS, 2)


def export_partial(
    window: ExperimentWindow, now: float, *, collector: str, unacked: Iterable[str]
) -> dict[str, Any]:
    """This collector's partial window of one experiment, as published."""
    window.advance(now)
    start = window.window_start
    variants: dict[str, Any] = {}
    for name in window.variants:
        variants[name] = _export_ring(window.ring(name), start, shed=True)
        variants[name]["fb"] = _export_ring(window.ring(name, first_byte=True), start)
    return {
        "v": PARTIAL_VERSION,
        "collector": collector,
        "ts": now,
        "alpha": window.mapping.alpha,
        "bins": window.mapping.bins,
        "window_sec": window.config.window_sec,
        "threshold_ms": window.config.threshold_ms,
        "unacked": sorted(unacked),
        "variants": variants,
    }


def _export_ring(ring: VariantRing, start: int, *, shed: bool = False) -> dict[str, Any]:
    """One ring's seconds from `start` on, as a partial's variant entry holds them
    (`shed`: with the shed counts, which only a total ring holds)."""
    slots = np.flatnonzero(ring.second >= start)
    slots = slots[np.argsort(ring.second[slots])]
    hist: list[str] = []
    units: list[str] = []
    for slot in slots:
        s = int(slot)
        if ring.dirty[s] or s not in ring.encoded:
            ring.encoded[s] = encode_hist_row(ring.hist[s])
            ring.encoded_units[s] = encode_unit_rows(ring.unit_counts[s], ring.unit_sums[s])
            ring.dirty[s] = False
        hist.append(ring.encoded[s])
        units.append(ring.encoded_units[s])
    fills = ring.res_fill[slots]
    mask = np.arange(SECOND_RESERVOIR_SIZE)[None, :] < fills[:, None]
    res_s = np.repeat(ring.second[slots], fills)
    keys, order = ring.res_keys[slots][mask], np.arange(int(fills.sum()))
    if keys.shape[0] > RESERVOIR_SIZE:
        order = np.argpartition(keys, RESERVOIR_SIZE - 1)[:RESERVOIR_SIZE]
    entry = {
        "sec": ring.second[slots].tolist(),
        "count": ring.count[slots].tolist(),
        "fail": ring.failures[slots].tolist(),
        "sum": ring.sum_us[slots].tolist(),
        "above": ring.above[slots].tolist(),
        "stale": ring.stale[slots].astype(int).tolist(),
        "hist": hist,
        "newest": ring.newest_ts,
        "res_k": _b64(keys[order].astype("<f4").tobytes()),
        "res_v": _b64(ring.res_us[slots][mask][order].astype("<u4").tobytes()),
        "res_s": _b64(res_s[order].astype("<i8").tobytes()),
        "res_u": _b64(ring.res_unit[slots][mask][order].astype("<u4").tobytes()),
        "units": units,
        # distinct units over this collector's whole window (a sketch of a union
        # cannot drop a second): a reader with another window length reads this one
        "distinct": _b64(ring.window_distinct(slots).astype("<u4").tobytes()),
    }
    if shed:
        entry["shed"] = ring.shed[slots].tolist()
    return entry


@dataclass(frozen=True)
class Partial:
    collector: str
    data: dict[str, Any]

    @property
    def ts(self) -> float:
        return float(self.data.get("ts", 0.0))

    @property
    def unacked(self) -> frozenset[str]:
        """The entry ids listed as not acked yet: the texts of a list, nothing else (a
        damaged field's list cannot be trusted, and must not stop a claimer)."""
        listed = self.data.get("unacked", ())
        if not isinstance(listed, list):
            return frozenset()
        return frozenset(entry for entry in listed if isinstance(entry, str))

    def totals(
        self,
        variant: str,
        *,
        start: int,
        threshold_ms: float | None,
        bins: int,
        first_byte: bool = False,
    ) -> WindowTotals | None:
        """This partial's sums over seconds ≥ start, or None if it lacks the variant:
        of the total time, or (`first_byte`) of the first byte (none from a collector
        older than the first byte: its samples have none)."""
        part = self.data["variants"].get(variant)
        if part is None:
            return None
        if first_byte:
            part = part.get("fb")
            if part is None:
                return WindowTotals(bins=bins)
            if not isinstance(part, dict):
                raise ValueError("a partial's first-byte entry is not an object")
        totals = WindowTotals(bins=bins, newest_ts=part.get("newest"))
        unit_rows = part.get("units")  # absent in a partial from an older collector
        if unit_rows is not None and len(unit_rows) != len(part["sec"]):
            raise ValueError("a partial's unit rows do not match its seconds")
        shed = part.get("shed")  # absent in a partial from an older collector: 0
        if shed is not None and (not isinstance(shed, list) or len(shed) != len(part["sec"])):
            raise ValueError("a partial's shed counts do not match its seconds")
        same_threshold = self.data.get("threshold_ms") == threshold_ms
        stale = np.zeros(bins, dtype=np.int64)
        any_stale = False
        for i, second in enumerate(part["sec"]):
            if second < start:
                continue
            totals.count += int(part["count"][i])
            totals.failures += int(part["fail"][i])
            totals.sum_us += float(part["sum"][i])
            if shed is not None:
                totals.shed += _count(shed[i])
            if unit_rows is not None:
                decode_unit_rows_into(unit_rows[i], totals.unit_counts, totals.unit_sums)
            if same_threshold and not part["stale"][i]:
                totals.above_exact += int(part["above"][i])
                decode_hist_row_into(part["hist"][i], totals.hist)
            else:
                row = np.zeros(bins, dtype=np.int64)
                decode_hist_row_into(part["hist"][i], row)
                totals.hist += row
                stale += row
                any_stale = True
        if any_stale:
            totals.stale_hist = stale
        keys = np.frombuffer(_unb64(part["res_k"]), dtype="<f4")
        values = np.frombuffer(_unb64(part["res_v"]), dtype="<u4")
        seconds = np.frombuffer(_unb64(part["res_s"]), dtype="<i8")
        inside = seconds >= start
        totals.res_keys = keys[inside].astype(np.float32)
        totals.res_us = values[inside].astype(np.uint32)
        if "res_u" in part:
            units = np.frombuffer(_unb64(part["res_u"]), dtype="<u4")
            if units.shape[0] != keys.shape[0]:
                raise ValueError("a partial's reservoir units do not match its reservoir")
            totals.res_units = units[inside].astype(np.uint32)
        else:
            totals.res_units = np.zeros(totals.res_us.shape[0], dtype=np.uint32)
        if "distinct" in part:
            distinct = np.frombuffer(_unb64(part["distinct"]), dtype="<u4")
            if distinct.shape[0] > DISTINCT_K:
                raise ValueError("a partial's distinct-unit sketch is too long")
            totals.distinct = np.sort(distinct.astype(np.uint32))
        return totals


def _count(value: object) -> int:
    """A count from a partial (untrusted JSON): a non-negative integer within 2^53."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**53:
        raise ValueError("a partial's count is not a non-negative integer")
    return value


@dataclass(frozen=True)
class SecondPartial(Partial):
    """A format 2 or 3 partial (second_partials.py): its head as `data`, its seconds put
    together when first summed, through the reader's cache when it has one."""

    head_field: str = ""
    fields: Mapping[str, str] = field(default_factory=dict)
    cache: PartialCache | None = None
    experiment: str = ""
    _assembled: list[AssembledPartial] = field(default_factory=list)

    def assembled(self) -> AssembledPartial:
        if not self._assembled:
            raw = self.fields[self.head_field]
            if self.cache is not None:
                done = self.cache.assembled(self.experiment, self.head_field, raw, self.fields)
            else:
                done = assemble(self.head_field, self.data, self.fields)
            self._assembled.append(done)
        return self._assembled[0]

    def totals(
        self,
        variant: str,
        *,
        start: int,
        threshold_ms: float | None,
        bins: int,
        first_byte: bool = False,
    ) -> WindowTotals | None:
        runs = self.assembled().runs.get(variant)
        if runs is None:
            return None
        same = self.data.get("threshold_ms") == threshold_ms
        return runs[1 if first_byte else 0].totals(start, same_threshold=same, bins=bins)


@dataclass(frozen=True)
class DamagedPartial(Partial):
    """A head of a format this reader knows (2 or 3) that does not read as one: a
    reader that merges it refuses the window as malformed, as it refuses a damaged
    format 1 partial or second field, rather than judging the other collectors' alone.
    It has no newest second (never judged dead) and lists no unacked entries."""

    reason: str = ""


def parse_partials(
    fields: Mapping[str, str], *, cache: PartialCache | None = None, experiment: str = ""
) -> list[Partial]:
    """The partial windows in a stats hash, of any format. A field of a format this
    reader does not know is skipped (a newer collector's, during a rolling upgrade);
    a format 2 or 3 head that does not read is a `DamagedPartial`. `cache` keeps what
    was decoded of format 2 seconds between reads."""
    partials: list[Partial] = []
    for name, raw in fields.items():
        if not name.startswith(PART_PREFIX) or raw.startswith(SECOND_OPENING):
            continue
        if cache is not None and raw.startswith(HEAD_OPENINGS):
            try:
                head = cache.head(experiment, name, raw)
            except (ValueError, TypeError, KeyError) as exc:
                partials.append(_damaged(name, exc))
                continue
            partials.append(SecondPartial(
                name[len(PART_PREFIX) :], head, head_field=name, fields=fields, cache=cache,
                experiment=experiment,
            ))  # fmt: skip
            continue
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        if data.get("v") == PARTIAL_VERSION:
            partials.append(Partial(name[len(PART_PREFIX) :], data))
        elif data.get("v") in SECOND_PARTIAL_VERSIONS:
            try:
                head = head_of(raw)
            except (ValueError, TypeError, KeyError) as exc:
                partials.append(_damaged(name, exc))
                continue
            partials.append(SecondPartial(
                name[len(PART_PREFIX) :], head, head_field=name, fields=fields, cache=cache,
                experiment=experiment,
            ))  # fmt: skip
    return partials


def _damaged(name: str, exc: Exception) -> DamagedPartial:
    return DamagedPartial(
        name[len(PART_PREFIX) :], {},
        reason=f"the head {excerpt(name)} does not read ({type(exc).__name__}: "
        f"{excerpt(str(exc))})",
    )  # fmt: skip


def last_second(partial: Partial) -> int | None:
    """The newest second a partial can add to a window; None when it cannot be read.

    Its newest bucket, or the second it was published in if that is later: a partial
    with no bucket left is judged by its age, and a live collector, which republishes
    every experiment it holds at least every HEARTBEAT_SEC, always looks recent.
    """
    try:
        newest = math.floor(float(partial.data["ts"]))
        for part in partial.data["variants"].values():
            if part["sec"]:
                newest = max(newest, int(max(part["sec"])))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return None
    return newest


def expired_partials(
    partials: Iterable[Partial],
    now: float,
    *,
    own: str,
    retained_sec: int,
    margin_sec: int = EXPIRY_MARGIN_SEC,
) -> list[Partial]:
    """Other collectors' partials that no window a reader may ask for reaches at `now`.

    What a reader can ask: the controller reads with its rule's `window_sec` (or the
    shorter fast window), other readers with the newest partial's; a rule change
    reaches collectors and controller through the same etcd key. So the longest window
    is the longest of `retained_sec` (what this collector's ring holds for the
    experiment: every window it has applied to it, plus the skew) and the `window_sec`
    each partial was written under (another collector may have seen a longer rule
    first; capped at MAX_WINDOW_SEC, beyond which no rule goes). A reader's window at
    `now` starts at floor(now) - window + 1, so a partial whose newest second is below
    floor(now) - longest - margin_sec adds nothing to any window, now or later.

    Why removing it is then safe for the `unacked` lists (module docstring): every
    sample of an entry the partial lists lies in a second no later than its newest one
    (applied into one of its buckets, or dropped as late or evicted, hence older), so
    all of them are out of every window too. A claimer that no longer finds the entry
    listed applies it again; its samples are older than the claimer's window and
    dropped as late, and the partial that counted them counts in no window any more:
    within any window the entry is counted at most once. (A sample from beyond the
    clock skew was clamped to the second it arrived in; counted again it lands in the
    present window, once there too.) Claims come after `claim_idle_ms` (30 s by
    default), so in practice the claimer has long skipped and acked those entries.
    An owner alive after all keeps its field: see Collector._remove_expired.

    Unreadable fields (another version, malformed) are never judged dead: they are not
    in `partials`, or `last_second` cannot read them. This collector's own is kept.
    """
    every = list(partials)
    longest = retained_sec
    for partial in every:
        window = partial.data.get("window_sec")
        if isinstance(window, int) and not isinstance(window, bool):
            longest = max(longest, min(window, MAX_WINDOW_SEC))
    horizon = math.floor(now) - longest - margin_sec
    expired = []
    for partial in every:
        newest = last_second(partial)
        if partial.collector != own and newest is not None and newest < horizon:
            expired.append(partial)
    return expired


def unacked_elsewhere(fields: Mapping[str, str], *, own: str) -> frozenset[str]:
    """Entries other collectors counted but may not have acked (see module docstring)."""
    listed: set[str] = set()
    for partial in parse_partials(fields):
        if partial.collector != own:
            listed |= partial.unacked
    return frozenset(listed)


def merge_snapshots(
    experiment: str,
    partials: Iterable[Partial],
    now: float,
    *,
    window_sec: int | None = None,
    threshold_ms: float | str | None = "latest",
    local: ExperimentWindow | None = None,
    local_collector: str | None = None,
    newest_out: dict[str, tuple[float | None, float | None]] | None = None,
) -> dict[str, WindowSnapshot]:
    """Sum partial windows (and optionally a live local window) into one per variant.

    window_sec / threshold_ms default to the newest partial's (the rule in force).
    `newest_out` receives each variant's newest sample time (total, first byte).
    """
    chosen = sorted(partials, key=lambda p: p.ts)
    if local_collector is not None:
        chosen = [p for p in chosen if p.collector != local_collector]
    for partial in chosen:
        if isinstance(partial, DamagedPartial):
            raise ValueError(partial.reason)
    newest = chosen[-1].data if chosen else None
    if window_sec is None:
        if local is not None:
            window_sec = local.config.window_sec
        elif newest is not None:
            window_sec = int(newest["window_sec"])
        else:
            return {}
    if threshold_ms == "latest":
        if local is not None:
            threshold_ms = local.config.threshold_ms
        elif newest is not None:
            threshold_ms = newest.get("threshold_ms")
        else:
            threshold_ms = None
    assert not isinstance(threshold_ms, str)
    alpha = float(newest["alpha"]) if newest else DEFAULT_ALPHA
    if not MIN_READ_ALPHA <= alpha < 0.5:
        raise ValueError(f"a partial's relative accuracy {alpha!r} is out of bounds")
    mapping = local.mapping if local is not None else mapping_for(alpha)
    start = math.floor(now) - window_sec + 1
    names: list[str] = list(local.variants) if local is not None else []
    for partial in chosen:
        names += [n for n in partial.data["variants"] if n not in names]
    result: dict[str, WindowSnapshot] = {}
    alone = local is None and len(chosen) == 1
    for name in names:
        merged: list[WindowTotals] = []
        for first_byte in (False, True):
            if local is not None and not chosen and name in local.variants:
                # the local window alone (a collector's merged view without peers):
                # its sums as they are, its reservoir already the bottom k and its
                # distinct units already sorted, which adding them to nothing keeps
                merged.append(local.totals(name, now, first_byte=first_byte))
                continue
            if alone and int(chosen[0].data.get("bins", mapping.bins)) == mapping.bins:
                # one partial: its sums are the window's (adding them to zero changes
                # nothing, and its reservoir is already the bottom k), the usual case
                # of one collector, without the copies (nor the empty sums to add to)
                own = chosen[0].totals(
                    name, start=start, threshold_ms=threshold_ms, bins=mapping.bins,
                    first_byte=first_byte,
                )  # fmt: skip
                if own is not None:
                    merged.append(own)
                    continue
            sums = WindowTotals(bins=mapping.bins)
            merged.append(sums)
            if local is not None and name in local.variants:
                sums.add(local.totals(name, now, first_byte=first_byte))
            for partial in chosen:
                if int(partial.data.get("bins", mapping.bins)) != mapping.bins:
                    continue  # a collector running another alpha: its bins do not line up
                totals = partial.totals(
                    name,
                    start=start,
                    threshold_ms=threshold_ms,
                    bins=mapping.bins,
                    first_byte=first_byte,
                )
                if totals is not None:
                    sums.add(totals)
            keep = bottom_k_index(sums.res_keys, RESERVOIR_SIZE)
            sums.res_keys, sums.res_us = sums.res_keys[keep], sums.res_us[keep]
            sums.res_units = sums.res_units[keep]
        if newest_out is not None:
            newest_out[name] = (merged[0].newest_ts, merged[1].newest_ts)
        result[name] = with_first_byte(
            mapping,
            merged[0],
            merged[1],
            experiment=experiment,
            variant=name,
            window_sec=window_sec,
            now=now,
            window_start=float(start),
            threshold_ms=threshold_ms,
        )
    return result


async def read_merged_snapshots(
    board: SnapshotBoard,
    experiment: str,
    now: float,
    *,
    window_sec: int | None = None,
    threshold_ms: float | str | None = "latest",
) -> dict[str, WindowSnapshot]:
    """The controller's read: every collector's partial window merged, variant → snapshot.

    Exact across collectors (counts, failures, above-threshold), evicted to the
    window ending at `now`. Falls back to the plain variant fields when no partial
    is present (a board written by something other than a collector).
    """
    fields = await board.read(experiment)
    return snapshots_of_fields(
        experiment, fields, parse_partials(fields), now,
        window_sec=window_sec, threshold_ms=threshold_ms,
    )  # fmt: skip


def snapshots_of_fields(
    experiment: str,
    fields: Mapping[str, str],
    partials: list[Partial],
    now: float,
    *,
    window_sec: int | None = None,
    threshold_ms: float | str | None = "latest",
    cache: PartialCache | None = None,
) -> dict[str, WindowSnapshot]:
    """`read_merged_snapshots` on a stats hash already read, its partials parsed
    (`parse_partials(fields)`): a reader of several windows parses them once.

    With `cache`, a window merged from the same partial fields with the same start
    second is not merged again: only its instant (ts, end, sample lag) moves."""
    if partials:
        key: tuple[Any, ...] | None = None
        if cache is not None:
            key = (math.floor(now), tuple(sorted(
                (name, raw) for name, raw in fields.items() if name.startswith(PART_PREFIX)
            )))  # fmt: skip
            held = cache.merged.get((experiment, window_sec, threshold_ms))
            if held is not None and held[0] == key:
                cache.merged_hits += 1
                return {name: restamped(snap, now, *held[2][name])
                        for name, snap in held[1].items()}  # fmt: skip
        try:
            newest: dict[str, tuple[float | None, float | None]] = {}
            merged = merge_snapshots(
                experiment, partials, now, window_sec=window_sec, threshold_ms=threshold_ms,
                newest_out=newest,
            )  # fmt: skip
            if cache is not None and key is not None:
                cache.merged[(experiment, window_sec, threshold_ms)] = (key, merged, newest)
            return merged
        except MALFORMED as exc:
            # a damaged stats hash is this experiment's problem, reported as such
            raise CodecError(
                f"experiment {experiment}: a partial window in the stats hash is "
                f"malformed ({type(exc).__name__}: {exc})"
            ) from exc
    snapshots: dict[str, WindowSnapshot] = {}
    for name, raw in fields.items():
        if name.startswith(PART_PREFIX):
            continue
        try:
            snapshots[name] = WindowSnapshot.from_json(raw)
        except (ValueError, TypeError) as exc:
            raise CodecError(
                f"experiment {experiment}: a snapshot in the stats hash is malformed ({exc})"
            ) from exc
    return snapshots


def restamped(
    snapshot: WindowSnapshot, now: float, newest: float | None, fb_newest: float | None
) -> WindowSnapshot:
    """The same window judged at `now`: its instant and sample lag move, nothing
    else (the sums are those of the same seconds; `newest`, `fb_newest`: the newest
    sample's time of each latency, as WindowTotals.snapshot takes the lag). Built
    without `replace`, whose __init__ is most of the cost of a look at nothing new."""
    fields = dict(snapshot.__dict__)
    fields["ts"] = fields["window_end"] = now
    fields["sample_lag_ms"] = None if newest is None else max(0.0, (now - newest) * 1000.0)
    inner = fields["first_byte"]
    if inner is not None:
        fields["first_byte"] = restamped(inner, now, fb_newest, None)
    copy = object.__new__(WindowSnapshot)
    copy.__dict__.update(fields)
    return copy
