"""BatchBuilder.add_columns: what `add` does for each sample, column by column."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.codec import BatchBuilder, decode, decode_raw
from controlplane.kernel.errors import CodecError

BASE = 1_800_000_000.0
U32 = 0xFFFF_FFFF
NAMES = ["baseline", "canary", "canary-2", "β"]  # routes name variants: never empty

Row = tuple[float, str, int, int, int]  # ts, variant, rt_us, outcome, unit

rows = st.tuples(
    # before the first sample (clamps to dt 0) and beyond u32 microseconds (~71 min)
    st.one_of(
        st.floats(min_value=-10, max_value=60, allow_nan=False),
        st.floats(min_value=4290, max_value=5000),
    ).map(lambda offset: BASE + offset),
    st.sampled_from(NAMES),
    st.one_of(
        st.integers(-3, 3),
        st.integers(U32 - 3, U32 + 3),
        st.integers(-(2**63), 2**63),
    ),
    # what a collector accepts: the codes below 100 and three-digit HTTP statuses
    st.one_of(st.integers(0, 2), st.integers(100, 999)),
    st.one_of(st.integers(0, U32), st.integers(-(2**64), 2**64)),
)


@st.composite
def calls(draw: st.DrawFn, *, one_new_name_per_call: bool) -> list[tuple[str, list[Row]]]:
    """("add", [row]) or ("columns", rows) calls; with `one_new_name_per_call` each
    add_columns call brings at most one variant name the builder has not seen yet."""
    out: list[tuple[str, list[Row]]] = []
    seen: set[str] = set()
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            row = draw(rows)
            seen.add(row[1])
            out.append(("add", [row]))
            continue
        batch = draw(st.lists(rows, max_size=40))
        if one_new_name_per_call:
            new = [name for name in dict.fromkeys(r[1] for r in batch) if name not in seen]
            allowed = seen | set(new[:1])
            if new:
                batch = [r if r[1] in allowed else (r[0], new[0], *r[2:]) for r in batch]
        seen.update(r[1] for r in batch)
        out.append(("columns", batch))
    return out


def one_by_one(plan: list[tuple[str, list[Row]]]) -> BatchBuilder:
    builder = BatchBuilder()
    for _, batch in plan:
        for row in batch:
            builder.add(*row)
    return builder


def as_planned(plan: list[tuple[str, list[Row]]]) -> BatchBuilder:
    builder = BatchBuilder()
    for kind, batch in plan:
        if kind == "add":
            builder.add(*batch[0])
        elif batch:
            ts, variants, rt_us, outcomes, units = map(list, zip(*batch, strict=True))
            builder.add_columns(ts, variants, rt_us, outcomes, units)
        else:
            builder.add_columns([], [], [], [], [])
    return builder


@settings(max_examples=150, deadline=None)
@given(calls(one_new_name_per_call=False))
def test_add_columns_stores_what_add_stores(plan: list[tuple[str, list[Row]]]) -> None:
    expected = one_by_one(plan)
    got = as_planned(plan)
    assert len(got) == len(expected) == sum(len(batch) for _, batch in plan)
    assert got.first_ts == expected.first_ts
    a, b = decode_raw(expected.encode()), decode_raw(got.encode())
    assert b.t0 == a.t0
    assert sorted(b.variants) == sorted(a.variants)
    assert [b.variants[i] for i in b.variant] == [a.variants[i] for i in a.variant]
    for column in ("dt_us", "rt_us", "outcome", "unit"):
        assert getattr(b, column).tolist() == getattr(a, column).tolist(), column


@settings(max_examples=150, deadline=None)
@given(calls(one_new_name_per_call=True))
def test_add_columns_encodes_the_same_payload_as_add(plan: list[tuple[str, list[Row]]]) -> None:
    assert as_planned(plan).encode() == one_by_one(plan).encode()


def test_out_of_range_values_clamp_as_documented() -> None:
    """Independent of `add`: the clamping rules themselves."""
    builder = BatchBuilder()
    builder.add_columns(
        [BASE + 1.0, BASE + 0.5, BASE + 1.25, BASE + 5000.0],
        ["canary", "baseline", "canary", "canary"],
        [-5, U32 + 1, 7, 2**70],
        [200, 503, 0, 999],
        [-1, 2**32 + 5, 123, U32],
    )
    batch = decode_raw(builder.encode())
    assert batch.t0 == BASE + 1.0
    assert batch.dt_us.tolist() == [0, 0, 250_000, U32]
    assert [batch.variants[i] for i in batch.variant] == ["canary", "baseline", "canary", "canary"]
    assert batch.rt_us.tolist() == [0, U32, 7, U32]
    assert batch.outcome.tolist() == [200, 503, 0, 999]
    assert batch.unit.tolist() == [U32, 5, 123, U32]


def test_the_first_call_sets_t0_and_later_ones_keep_it() -> None:
    builder = BatchBuilder()
    builder.add_columns([], [], [], [], [])  # nothing: no t0 yet
    assert builder.first_ts is None and len(builder) == 0
    builder.add_columns([BASE + 2.0], ["a"], [1], [200], [0])
    builder.add(BASE + 3.0, "b", 2, 200)
    builder.add_columns([BASE + 1.0, BASE + 2.25], ["b", "a"], [3, 4], [404, 200], [9, 9])
    batch = decode(builder.encode())
    assert builder.first_ts == BASE + 2.0
    assert [batch.variants[i] for i in batch.variant] == ["a", "b", "b", "a"]
    assert batch.ts.tolist() == pytest.approx([BASE + 2.0, BASE + 3.0, BASE + 2.0, BASE + 2.25])


def test_add_columns_numbers_new_names_in_order_of_appearance() -> None:
    names = [f"v{i}" for i in range(12)]
    ts = [BASE + i for i in range(12)]
    builder = BatchBuilder()
    builder.add_columns(ts, names, [1] * 12, [200] * 12, [0] * 12)
    reference = BatchBuilder()
    for t, name in zip(ts, names, strict=True):
        reference.add(t, name, 1, 200)
    assert decode(builder.encode()).variants == tuple(names)
    assert builder.encode() == reference.encode()


def columns(names: list[str]) -> tuple[list[float], list[str], list[int], list[int], list[int]]:
    n = len(names)
    return [BASE] * n, names, [1] * n, [200] * n, [0] * n


def test_255_variant_names_fit() -> None:
    builder = BatchBuilder()
    names = [f"v{i}" for i in range(255)]
    builder.add_columns(*columns(names[:100]))
    builder.add(BASE, names[100], 1, 200)
    builder.add_columns(*columns(names[100:] + names[:3]))
    batch = decode(builder.encode())
    assert sorted(batch.variants) == sorted(names)
    assert len(batch) == 259


@pytest.mark.parametrize("registered", [0, 1, 200, 255])
def test_a_256th_variant_name_raises(registered: int) -> None:
    builder = BatchBuilder()
    for i in range(registered):
        builder.add(BASE, f"r{i}", 1, 200)
    new = [f"n{i}" for i in range(256 - registered)]
    with pytest.raises(CodecError, match="255 variant names"):
        builder.add_columns(*columns(new + [f"r{i}" for i in range(registered)]))
    if registered == 255:
        # only names the builder knows: still fine
        builder.add_columns(*columns(["r0", "r254"]))
        assert len(builder) == 257


def test_a_rejected_call_leaves_the_builder_as_it_was() -> None:
    builder = BatchBuilder()
    builder.add(BASE, "baseline", 1, 200)
    before = builder.encode()
    with pytest.raises(CodecError):
        builder.add_columns(*columns([f"v{i}" for i in range(300)]))
    assert builder.encode() == before
    builder.add(BASE, "canary", 2, 200)  # a second name is well within the limit
    assert decode(builder.encode()).variants == ("baseline", "canary")


# --- the first byte column, and times that are not numbers ---------------------------

first_bytes = st.one_of(
    st.integers(-3, 3), st.integers(0, 120_000), st.integers(U32 - 3, U32 + 3),
    st.integers(-(2**63), 2**70),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.tuples(rows, first_bytes), max_size=300), max_size=4),
    st.sampled_from([["canary"], ["baseline", "canary"], NAMES]),
)
def test_add_columns_with_first_bytes_encodes_what_add_encodes(
    calls: list[list[tuple[Row, int]]], names: list[str]
) -> None:
    """Runs of one, two or four variants (the proxy's are of one or two), first bytes
    below 0, beyond the total and beyond u32: the payload `add` makes, byte for byte."""
    columns, one_by_one = BatchBuilder(), BatchBuilder()
    for call in calls:
        # names from `names` only, numbered by first appearance (one call may bring several)
        call = [((ts, names[i % len(names)], *rest), fb) for i, ((ts, _, *rest), fb) in
                enumerate(call)]  # fmt: skip
        for (ts, variant, rt_us, outcome, unit), fb in call:
            one_by_one.add(ts, variant, rt_us, outcome, unit, fb)
        if call:
            plain = [row for row, _ in call]
            ts, variants, rt_us, outcomes, units = map(list, zip(*plain, strict=True))
            columns.add_columns(ts, variants, rt_us, outcomes, units, [fb for _, fb in call])
    assert columns.encode() == one_by_one.encode()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_time_that_is_not_a_number_after_the_first_changes_nothing(bad: float) -> None:
    builder = BatchBuilder()
    builder.add(BASE, "baseline", 1, 200)
    before = builder.encode()
    with pytest.raises(ValueError):
        builder.add_columns([BASE, bad], ["baseline", "canary"], [1, 2], [200, 200], [0, 0])
    assert builder.encode() == before
