"""A second field decoded in one pass gives what decoding each latency alone gave.

`reference_decode_second` is the decoder the one-pass decode replaced, kept here as
the plain recomputation: on generated second fields (empty and full latencies, a
first-byte entry sharing its total's packed texts or not, or leaving them out as
format 3 writes it, float sums integral or not) both give the same sums field for
field; on malformed fields both refuse, the one-pass decode with an error its readers
report (never an IndexError). Text outside strict JSON (NaN, Infinity, a lone
surrogate, an integer beyond 64 bits) is refused at the parse; the reference refuses
NaN and Infinity too.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.collector.ring import SECOND_RESERVOIR_SIZE
from controlplane.collector.second_partials import (
    EMPTY_HIST,
    EMPTY_UNITS,
    EXACT_LIMIT,
    MAX_VARIANTS,
    SHARED_WITH_TOTAL,
    SecondSums,
    _reservoir,
    _unit_rows,
    decode_second,
    decode_seconds,
    encode_sparse_unit_rows,
    head_of,
    reservoir_pair,
)
from controlplane.collector.sharding import (
    decode_hist_row_into,
    decode_unit_rows_into,
    encode_hist_row,
    encode_unit_rows,
)
from controlplane.collector.totals import UNIT_ROWS
from controlplane.kernel.units import DISTINCT_K

BINS = 64
REFUSALS = (KeyError, TypeError, ValueError, AttributeError, binascii.Error, zlib.error)


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**53:
        raise ValueError("count")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("sum")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError("sum")
    return number


def _array(text: object, dtype: str, limit: int) -> npt.NDArray[Any]:
    if not isinstance(text, str):
        raise ValueError("packed")
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    width = np.dtype(dtype).itemsize
    if len(raw) % width or len(raw) // width > limit:
        raise ValueError("packed")
    return np.frombuffer(raw, dtype=dtype)


def reference_decode(entry: object, bins: int) -> dict[str, Any]:
    """One latency decoded alone, as the reader did before the one-pass decode."""
    if not isinstance(entry, dict):
        raise ValueError("entry")
    hist = np.zeros(bins, dtype=np.int64)
    decode_hist_row_into(entry["hist"], hist)
    unit_counts = np.zeros((UNIT_ROWS, 3), dtype=np.int64)
    unit_sums = np.zeros((UNIT_ROWS, 2), dtype=np.float64)
    decode_unit_rows_into(entry["units"], unit_counts, unit_sums)
    keys = _array(entry["res_k"], "<f4", SECOND_RESERVOIR_SIZE)
    values = _array(entry["res_v"], "<u4", SECOND_RESERVOIR_SIZE)
    units = _array(entry["res_u"], "<u4", SECOND_RESERVOIR_SIZE)
    if not keys.shape[0] == values.shape[0] == units.shape[0]:
        raise ValueError("reservoir")
    sum_us = _number(entry["sum"])
    peak = max(sum_us, float(unit_sums.max()), 0.0)
    integral = (
        sum_us.is_integer()
        and peak <= EXACT_LIMIT
        and bool((unit_sums >= 0).all() and (np.floor(unit_sums) == unit_sums).all())
    )
    count, failures = _count(entry["count"]), _count(entry["fail"])
    above, stale = _count(entry["above"]), bool(entry["stale"])
    shed = _count(entry.get("shed", 0))
    return {
        "count": count,
        "failures": failures,
        "sum_us": sum_us,
        "above": above,
        "stale": stale,
        "shed": shed,
        "hist": hist,
        "unit_counts": unit_counts,
        "unit_sums": unit_sums,
        "res_keys": keys.astype(np.float32, copy=False),
        "res_us": values.astype(np.uint32, copy=False),
        "res_units": units.astype(np.uint32, copy=False),
        "distinct": _array(entry["distinct"], "<u4", DISTINCT_K).astype(np.uint32, copy=False),
        "float_peak": peak if math.isfinite(peak) else math.inf,
        "integral": integral,
        "tally": np.array([count, failures, 0 if stale else above, int(stale), shed], np.int64),
    }


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def reference_decode_second(raw: str, bins: int) -> tuple[int, dict[str, Any]]:
    # strict JSON, as the decode's parse is: NaN and Infinity are not JSON's and no
    # writer puts them, so a field that holds one is refused wherever it stands (the
    # old decode let an Infinity through in `stale`, read as true)
    data = json.loads(raw, parse_constant=_no_constant)
    if not isinstance(data, dict) or not isinstance(data.get("variants"), dict):
        raise ValueError("field")
    second = data["s"]
    if isinstance(second, bool) or not isinstance(second, int):
        raise ValueError("second")
    if len(data["variants"]) > MAX_VARIANTS:
        raise ValueError("variants")
    out: dict[str, Any] = {}
    for name, entry in data["variants"].items():
        if not isinstance(entry, dict):
            raise ValueError("entry")
        fb = entry["fb"]
        if isinstance(fb, dict) and not any(key in fb for key in SHARED_WITH_TOTAL):
            fb = {**fb, **{key: entry[key] for key in SHARED_WITH_TOTAL}}  # format 3
        out[str(name)] = (reference_decode(entry, bins), reference_decode(fb, bins))
    return second, out


def _same(new: SecondSums, old: dict[str, Any]) -> None:
    for name, want in old.items():
        got = getattr(new, name)
        if isinstance(want, np.ndarray):
            assert got.dtype == want.dtype, name
            assert got.shape == want.shape, name
            assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), name
        elif isinstance(want, float) and math.isnan(want):
            assert math.isnan(got), name
        else:
            assert type(got) is type(want) and got == want, name


def _b64(values: npt.NDArray[Any], dtype: str) -> str:
    return base64.b64encode(values.astype(dtype).tobytes()).decode("ascii")


@st.composite
def _entry(draw: st.DrawFn, *, empty: bool, twin: dict[str, Any] | None) -> dict[str, Any]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    hist = np.zeros(BINS, dtype=np.int64)
    counts = np.zeros((UNIT_ROWS, 3), dtype=np.int64)
    sums = np.zeros((UNIT_ROWS, 2), dtype=np.float64)
    fill = 0
    if not empty:
        where = rng.integers(0, BINS, draw(st.integers(0, 12)))
        hist[where] = rng.integers(1, 2**31, where.shape[0])
        counts[:] = rng.integers(0, 1000, counts.shape)
        sums[:] = rng.integers(0, 10**6, sums.shape)
        kind = draw(st.sampled_from(["integral", "fraction", "negative", "nan", "huge"]))
        cell = (int(rng.integers(0, UNIT_ROWS)), int(rng.integers(0, 2)))
        sums[cell] = {"integral": sums[cell], "fraction": 0.5, "negative": -3.0,
                      "nan": math.nan, "huge": 2.0**60}[kind]  # fmt: skip
        fill = draw(st.integers(0, SECOND_RESERVOIR_SIZE))
    entry: dict[str, Any] = {
        "count": int(hist.sum()) if not empty else 0,
        "fail": draw(st.integers(0, 5)),
        "sum": draw(st.sampled_from([0.0, 12345.0, 0.25, 2.0**60])),
        "above": draw(st.integers(0, 5)),
        "stale": draw(st.sampled_from([0, 1])),
        "hist": encode_hist_row(hist),
        "units": encode_unit_rows(counts, sums),
        "res_k": _b64(rng.random(fill), "<f4"),
        "res_v": _b64(rng.integers(0, 2**32, fill), "<u4"),
        "res_u": _b64(rng.integers(0, 2**32, fill), "<u4"),
        "distinct": _b64(np.sort(rng.integers(0, 2**32, min(fill, DISTINCT_K))), "<u4"),
    }
    if draw(st.booleans()):
        entry["shed"] = draw(st.integers(0, 9))
    if twin is not None and len(base64.b64decode(twin["res_k"])) == 4 * fill:
        for name in ("res_k", "res_u", "distinct"):
            entry[name] = twin[name]
    return entry


# what a damaged field may hold in place of one of an entry's values
_DAMAGE = st.sampled_from([
    None, 7, True, -1, 2**60, "", "!!", "AAAA", "not base64", [1], {"a": 1}, math.inf,
    base64.b64encode(zlib.compress(b"\x01\x02\x03", 1)).decode("ascii"),
    base64.b64encode(zlib.compress(b"\xff\xff\x01\x00\x00\x00", 1)).decode("ascii"),
    base64.b64encode(zlib.compress(bytes(8 * 5 * UNIT_ROWS), 1)[:-3]).decode("ascii"),
    base64.b64encode(b"\x00\x00\x00").decode("ascii"),
])  # fmt: skip
_KEYS = ["count", "fail", "sum", "above", "stale", "shed", "hist", "units",
         "res_k", "res_v", "res_u", "distinct", "fb"]  # fmt: skip


@st.composite
def _field(draw: st.DrawFn) -> tuple[str, bool]:
    variants: dict[str, Any] = {}
    for v in range(draw(st.integers(0, 3))):
        total = draw(_entry(empty=draw(st.booleans()), twin=None))
        paired = draw(st.booleans())
        total["fb"] = draw(_entry(empty=draw(st.booleans()), twin=total if paired else None))
        if paired and draw(st.booleans()):  # format 3: what it shares is left out
            for key in SHARED_WITH_TOTAL:
                del total["fb"][key]
        variants[f"v{v}"] = total
    damaged = bool(variants) and draw(st.booleans())
    if damaged:
        entry = variants[draw(st.sampled_from(sorted(variants)))]
        if draw(st.booleans()):
            entry = entry["fb"]
        key = draw(st.sampled_from(_KEYS))
        if draw(st.booleans()):
            entry.pop(key, None)
        else:
            entry[key] = draw(_DAMAGE)
    return json.dumps({"s": 17, "variants": variants}), damaged


@settings(max_examples=400, deadline=None)
@given(_field())
def test_one_pass_decode_is_the_per_latency_decode(case: tuple[str, bool]) -> None:
    raw, _ = case
    try:
        want = reference_decode_second(raw, BINS)
    except Exception:  # any refusal of the old decode, an IndexError too
        refused = True
    else:
        refused = False
    if refused:
        try:
            decode_second(raw, BINS)
        except REFUSALS:
            return
        raise AssertionError("the one-pass decode accepted a field the old one refused")
    second, got = decode_second(raw, BINS)
    assert second == want[0]
    assert list(got) == list(want[1])
    for name, (total, first) in got.items():
        _same(total, want[1][name][0])
        _same(first, want[1][name][1])


@settings(max_examples=150, deadline=None)
@given(st.lists(_field(), min_size=2, max_size=5))
def test_fields_decoded_together_are_each_field_decoded_alone(
    cases: list[tuple[str, bool]],
) -> None:
    """What a catch-up look decodes in one call (`decode_seconds`) is, field for field,
    what the per-latency reference decode gives each field alone; a field it refuses
    refuses them all."""
    raws = [raw for raw, _ in cases]
    alone: list[tuple[int, dict[str, Any]]] = []
    refused = False
    for raw in raws:
        try:
            alone.append(reference_decode_second(raw, BINS))
        except Exception:  # any refusal of the reference, an IndexError too
            refused = True
    if refused:
        with pytest.raises(REFUSALS):
            decode_seconds(raws, BINS)
        return
    together = decode_seconds(raws, BINS)
    assert len(together) == len(alone)
    for (second, got), (want_second, want) in zip(together, alone, strict=True):
        assert second == want_second
        assert list(got) == list(want)
        for name, (total, first) in got.items():
            _same(total, want[name][0])
            _same(first, want[name][1])


@settings(max_examples=150, deadline=None)
@given(st.lists(_field(), min_size=1, max_size=6))
def test_a_first_byte_reservoir_taken_from_its_total_is_the_one_cut_on_its_own(
    cases: list[tuple[str, bool]],
) -> None:
    """`reservoir_pair` gives each run the reservoir `_reservoir` cuts of its own
    seconds, whether the first byte shares its total's texts (its cut reused) or not."""
    decoded = []
    for raw, _ in cases:
        try:
            decoded.append(decode_second(raw, BINS)[1])
        except REFUSALS:
            continue
    for name in {n for second in decoded for n in second}:
        held = [second[name] for second in decoded if name in second]
        seconds = list(range(len(held)))
        totals, firsts = [t for t, _ in held], [f for _, f in held]
        total, first = reservoir_pair(seconds, totals, firsts)
        for got, want in ((total, _reservoir(seconds, totals)),
                          (first, _reservoir(seconds, firsts))):  # fmt: skip
            assert list(got) == list(want)
            for key in want:
                assert got[key].dtype == want[key].dtype
                assert got[key].tolist() == want[key].tolist()


def test_a_bin_beyond_the_histogram_is_a_refusal_not_an_index_error() -> None:
    raw_hist = np.array([BINS + 3], "<u2").tobytes() + np.array([1], "<u4").tobytes()
    entry = {"count": 1, "fail": 0, "sum": 0.0, "above": 0, "stale": 0,
             "hist": base64.b64encode(zlib.compress(raw_hist, 1)).decode("ascii"),
             "units": EMPTY_UNITS, "res_k": "", "res_v": "", "res_u": "",
             "distinct": ""}  # fmt: skip
    try:
        SecondSums.decode(entry, BINS)
    except ValueError:
        return
    raise AssertionError("a bin beyond the histogram was accepted")


def test_the_empty_texts_are_what_the_writer_makes_of_an_empty_second() -> None:
    zeros = np.zeros((UNIT_ROWS, 3), dtype=np.int64), np.zeros((UNIT_ROWS, 2))
    assert encode_hist_row(np.zeros(BINS, dtype=np.int64)) == EMPTY_HIST
    assert encode_unit_rows(*zeros) == EMPTY_UNITS


def _bomb(size: int) -> str:
    return base64.b64encode(zlib.compress(bytes(size), 9)).decode("ascii")


def _entry_with(**texts: str) -> dict[str, Any]:
    return {"count": 1, "fail": 0, "sum": 0.0, "above": 0, "stale": 0,
            "hist": EMPTY_HIST, "units": EMPTY_UNITS, "res_k": "", "res_v": "", "res_u": "",
            "distinct": "", **texts}  # fmt: skip


@pytest.mark.parametrize("key", ["hist", "units"])
def test_a_deflated_text_that_inflates_beyond_its_bound_is_refused_unread(key: str) -> None:
    # 64 MiB of zeros deflate to ~64 KB: read whole, one field would cost 64 MiB
    entry = _entry_with(**{key: _bomb(64 * 2**20)})
    with pytest.raises(ValueError, match="longer than it may be"):
        SecondSums.decode(entry, BINS)
    counts, sums = np.zeros((UNIT_ROWS, 3), np.int64), np.zeros((UNIT_ROWS, 2))
    with pytest.raises(ValueError, match="longer than it may be"):
        if key == "hist":
            decode_hist_row_into(entry["hist"], np.zeros(BINS, np.int64))
        else:
            decode_unit_rows_into(entry["units"], counts, sums)


def test_a_format_1_bin_beyond_the_histogram_is_a_refusal_not_an_index_error() -> None:
    raw_hist = np.array([BINS + 3], "<u2").tobytes() + np.array([1], "<u4").tobytes()
    with pytest.raises(ValueError, match="beyond its bins"):
        decode_hist_row_into(base64.b64encode(zlib.compress(raw_hist)).decode("ascii"),
                             np.zeros(BINS, np.int64))  # fmt: skip


def test_a_sparse_second_gives_the_dense_row_the_field_held() -> None:
    hist = np.zeros(BINS, dtype=np.int64)
    hist[[0, 5, BINS - 1]] = [3, 1, 2**31]
    sums = SecondSums.decode(_entry_with(hist=encode_hist_row(hist)), BINS)
    assert sums.hist_bins.shape[0] == 3
    assert sums.hist.dtype == np.int64 and np.array_equal(sums.hist, hist)
    assert sums.hist is not sums.hist  # a row made for its caller, who may change it


@pytest.mark.parametrize(
    "text",
    [
        # a lone surrogate names a variant: no JSON writer of ours makes one, and a
        # window named so could not be written out again (orjson refuses it)
        '{"s":7,"variants":{"\\ud800":' + json.dumps({**_entry_with(), "fb": _entry_with()})
        + "}}",
        # NaN is not JSON (a sum of NaN was refused further on before: still refused)
        '{"s":7,"variants":{"v":' + json.dumps({**_entry_with(), "sum": math.nan,
                                                 "fb": _entry_with()}) + "}}",
        # nor is Infinity: the old decode read one in `stale` as true
        '{"s":7,"variants":{"v":' + json.dumps({**_entry_with(), "stale": math.inf,
                                                 "fb": _entry_with()}) + "}}",
        # an integer beyond 64 bits parses as a float, which no second is (before, it
        # was read as a second, and refused only when a run's array could not hold it)
        '{"s":123456789012345678901234567890,"variants":{}}',
    ],
)
def test_a_second_field_outside_strict_json_is_refused_at_the_parse(text: str) -> None:
    with pytest.raises(ValueError):
        decode_seconds([text], BINS)


def test_a_head_naming_a_variant_with_a_lone_surrogate_is_refused() -> None:
    head = {"v": 3, "collector": "c", "ts": 1.0, "alpha": 0.01, "bins": BINS,
            "window_sec": 10, "threshold_ms": 250.0, "unacked": [], "cap": 4,
            "variants": {"\ud800": {"sec": []}}}  # fmt: skip
    text = json.dumps(head)  # json writes the surrogate as an escape; orjson refuses it
    assert "\\ud800" in text
    with pytest.raises(ValueError):
        head_of(text)


# --- format 4 (decision 0080): sparse unit rows, distinct units from the reservoir -----


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10_000), held=st.integers(0, UNIT_ROWS), top=st.sampled_from(
    [3, 2**20, 2**32 - 1, 2**32, 2.0**53]
))
def test_sparse_unit_rows_read_as_the_dense_rows_or_are_not_written(
    seed: int, held: int, top: float
) -> None:
    """Rows that hold anything, any integer values below 2^32: read back as the dense
    rows. A value that is not such an integer: not written sparse at all."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((UNIT_ROWS, 3), np.int64)
    sums = np.zeros((UNIT_ROWS, 2), np.float64)
    rows = rng.permutation(UNIT_ROWS)[:held]
    counts[rows] = rng.integers(0, 50, (held, 3))
    sums[rows] = rng.integers(0, 2**20, (held, 2))
    if held:
        sums[rows[0], 1] = top
    text = encode_sparse_unit_rows(counts, sums)
    if top >= 2**32 and held:
        assert text is None
        return
    assert text is not None
    read_counts, read_sums = _unit_rows([{"unit_rows": text}], compact=True)
    assert np.array_equal(read_counts[0], counts) and np.array_equal(read_sums[0], sums)
    if held:
        fraction = sums.copy()
        fraction[rows[0], 0] = 0.5
        assert encode_sparse_unit_rows(counts, fraction) is None


def _sparse(indices: list[int], width_cut: int = 0) -> str:
    raw = bytes(indices) + np.ones((5, len(indices)), "<u4").tobytes()
    return base64.b64encode(zlib.compress(raw[: len(raw) - width_cut], 1)).decode("ascii")


@pytest.mark.parametrize(
    "text",
    [
        _sparse([3, 3]),  # a row twice
        _sparse([5, 2]),  # out of order
        _sparse([UNIT_ROWS]),  # beyond the rows
        _sparse([1, 2], width_cut=1),  # not whole rows
        base64.b64encode(zlib.compress(bytes(21 * (UNIT_ROWS + 1)), 1)).decode("ascii"),
        "not base64!",
        7,
    ],
)
def test_damaged_sparse_unit_rows_are_refused(text: object) -> None:
    sound = encode_sparse_unit_rows(np.ones((UNIT_ROWS, 3), np.int64), np.ones((UNIT_ROWS, 2)))
    with pytest.raises(REFUSALS):  # alone, and after a sound entry
        _unit_rows([{"unit_rows": text}], compact=True)
    with pytest.raises(REFUSALS):
        _unit_rows([{"unit_rows": sound}, {"unit_rows": text}], compact=True)


def test_distinct_units_left_out_are_read_only_from_a_whole_reservoir_of_format_4() -> None:
    units = np.array([9, 0, 4, 9], "<u4")
    entry = {
        "count": 4, "fail": 0, "sum": 100.0, "above": 0, "stale": 0,
        "hist": encode_hist_row(np.array([0, 4] + [0] * (BINS - 2))),
        "unit_rows": encode_sparse_unit_rows(np.zeros((UNIT_ROWS, 3), np.int64),
                                             np.zeros((UNIT_ROWS, 2))),
        "res_k": _b64(np.arange(4) / 8, "<f4"), "res_v": _b64(np.arange(4), "<u4"),
        "res_u": _b64(units, "<u4"),
    }  # fmt: skip
    decoded = SecondSums.decode(entry, BINS, compact=True)
    assert decoded.distinct.tolist() == [4, 9]  # sorted, distinct, without 0
    with pytest.raises(REFUSALS):  # a format 3 field must write them
        SecondSums.decode(entry, BINS)
    with pytest.raises(ValueError, match="reservoir does not hold all"):
        SecondSums.decode({**entry, "count": 5}, BINS, compact=True)
    with pytest.raises(ValueError, match="dense and sparse unit rows, or neither"):
        SecondSums.decode({**entry, "units": EMPTY_UNITS}, BINS, compact=True)
