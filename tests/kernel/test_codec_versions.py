"""Batch format versions: version 2 carries the first byte, version 1 still reads.

During a rolling upgrade old sidecars keep sending version 1; a collector reads both,
refuses any other version, and refuses a version 2 batch whose first byte comes after
its total (or whose entry and payload disagree on the version), each with a reason.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.codec import (
    BAD_FIRST_BYTE,
    BAD_VERSION,
    REASONS,
    VERSION,
    BatchBuilder,
    BatchMeta,
    decode,
    decode_raw,
    entry_fields,
    parse_entry,
    parse_entry_raw,
)
from controlplane.kernel.errors import CodecError

NOW = 1_800_000_000.0
U32_MAX = 2**32 - 1

rows = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=30, allow_nan=False),
        st.sampled_from(["baseline", "canary"]),
        st.integers(min_value=0, max_value=U32_MAX),
        st.floats(min_value=0, max_value=1),
        st.sampled_from([0, 1, 2, 200, 503]),
        st.integers(min_value=0, max_value=U32_MAX),
    ),
    min_size=1,
    max_size=200,
)


def _built(samples: list[tuple[float, str, int, float, int, int]]) -> BatchBuilder:
    builder = BatchBuilder()
    for offset, variant, rt, share, outcome, unit in samples:
        builder.add(NOW + offset, variant, rt, outcome, unit, int(rt * share))
    return builder


@settings(max_examples=60, deadline=None)
@given(rows)
def test_version_2_round_trips_the_first_byte(
    samples: list[tuple[float, str, int, float, int, int]],
) -> None:
    batch = decode(_built(samples).encode())
    assert batch.fb_us is not None
    assert batch.fb_us.tolist() == [int(rt * share) for _, _, rt, share, _, _ in samples]
    assert batch.rt_us.tolist() == [rt for _, _, rt, _, _, _ in samples]
    assert bool((batch.fb_us <= batch.rt_us).all())


@settings(max_examples=60, deadline=None)
@given(rows)
def test_version_1_round_trips_everything_but_the_first_byte(
    samples: list[tuple[float, str, int, float, int, int]],
) -> None:
    builder = _built(samples)
    old, new = decode(builder.encode(version=1)), decode(builder.encode())
    assert old.fb_us is None
    for column in ("ts", "variant", "rt_us", "outcome", "unit"):
        np.testing.assert_array_equal(getattr(old, column), getattr(new, column))
    assert old.variants == new.variants


def test_an_old_sidecars_entry_is_accepted() -> None:
    builder = BatchBuilder()
    builder.add(NOW, "canary", 5_000, 200)
    meta = BatchMeta("42", "sc-old", 3, 1, version=1)
    fields = entry_fields(meta, builder.encode(version=1))
    assert fields["v"] == b"1"
    got, batch = parse_entry(fields)
    assert got == meta and batch.fb_us is None and batch.rt_us.tolist() == [5_000]


def test_the_current_entry_says_version_2() -> None:
    builder = BatchBuilder()
    builder.add(NOW, "canary", 5_000, 200, 0, 1_200)
    fields = entry_fields(BatchMeta("42", "sc-1", 1, 1), builder.encode())
    assert VERSION == 2 and fields["v"] == b"2"
    meta, batch = parse_entry_raw(fields)
    assert meta.version == 2 and batch.fb_us is not None and batch.fb_us.tolist() == [1_200]


def test_without_a_first_byte_a_sample_counts_its_whole_time() -> None:
    builder = BatchBuilder()
    builder.add(NOW, "canary", 7_000, 504)  # e.g. a timeout: no response head came
    builder.add_columns([NOW], ["canary"], [8_000], [0], [0])
    batch = decode(builder.encode())
    assert batch.fb_us is not None and batch.fb_us.tolist() == [7_000, 8_000]


@pytest.mark.parametrize(("first_byte", "kept"), [(-5, 0), (9_000, 3_000), (3_000, 3_000)])
def test_the_builder_keeps_the_first_byte_within_the_total(first_byte: int, kept: int) -> None:
    one, columns = BatchBuilder(), BatchBuilder()
    one.add(NOW, "canary", 3_000, 200, 0, first_byte)
    columns.add_columns([NOW], ["canary"], [3_000], [200], [0], [first_byte])
    for builder in (one, columns):
        batch = decode(builder.encode())
        assert batch.fb_us is not None and batch.fb_us.tolist() == [kept]


def test_columns_of_different_lengths_leave_the_builder_unchanged() -> None:
    builder = BatchBuilder()
    with pytest.raises(CodecError):
        builder.add_columns([NOW, NOW], ["canary", "canary"], [1, 2], [200, 200], [0, 0], [1])
    assert len(builder) == 0


def _rechecksummed(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


def _payload(version: int, rt_us: int, fb_us: int | None) -> bytes:
    body = struct.pack("<3sBIB", b"CSB", version, 1, 1) + b"\x06canary" + struct.pack("<d", NOW)
    body += struct.pack("<IBIHI", 0, 0, rt_us, 200, 0)
    if fb_us is not None:
        body += struct.pack("<I", fb_us)
    return _rechecksummed(body)


def _refusal(fields: dict[str, bytes]) -> str:
    with pytest.raises(CodecError) as caught:
        parse_entry_raw(fields)
    assert caught.value.reason in REASONS
    return caught.value.reason


def _entry(version: int, payload: bytes) -> dict[str, bytes]:
    return entry_fields(BatchMeta("42", "sc-1", 1, 1, version=version), payload)


@pytest.mark.parametrize(("rt_us", "fb_us"), [(1_000, 1_001), (0, 1), (5, U32_MAX)])
def test_a_first_byte_after_the_total_is_refused(rt_us: int, fb_us: int) -> None:
    assert _refusal(_entry(2, _payload(2, rt_us, fb_us))) == BAD_FIRST_BYTE


@pytest.mark.parametrize(("rt_us", "fb_us"), [(1_000, 1_000), (1_000, 0), (U32_MAX, U32_MAX)])
def test_first_bytes_within_the_total_pass(rt_us: int, fb_us: int) -> None:
    _, batch = parse_entry_raw(_entry(2, _payload(2, rt_us, fb_us)))
    assert batch.fb_us is not None and batch.fb_us.tolist() == [fb_us]


@pytest.mark.parametrize("version", [0, 4, 255])
def test_unknown_payload_versions_are_refused(version: int) -> None:
    with pytest.raises(CodecError) as caught:
        decode_raw(_payload(version, 1_000, 500))
    assert caught.value.reason == BAD_VERSION


@pytest.mark.parametrize("v", [b"0", b"4", b"10"])
def test_unknown_entry_versions_are_refused(v: bytes) -> None:
    assert _refusal({**_entry(2, _payload(2, 1_000, 500)), "v": v}) == BAD_VERSION


@pytest.mark.parametrize(("entry", "payload"), [(1, 2), (2, 1)])
def test_an_entry_and_payload_that_disagree_on_the_version_are_refused(
    entry: int, payload: int
) -> None:
    data = _payload(payload, 1_000, 500 if payload == 2 else None)
    assert _refusal(_entry(entry, data)) == BAD_VERSION


def test_a_version_1_payload_with_a_first_byte_column_is_refused() -> None:
    body = struct.pack("<3sBIB", b"CSB", 1, 1, 1) + b"\x06canary" + struct.pack("<d", NOW)
    body += struct.pack("<IBIHII", 0, 0, 1_000, 200, 0, 500)  # 4 bytes too many for v1
    with pytest.raises(CodecError) as caught:
        decode_raw(_rechecksummed(body))
    assert caught.value.reason in REASONS


def test_the_builder_writes_no_unknown_version() -> None:
    builder = BatchBuilder()
    builder.add(NOW, "canary", 1, 200)
    with pytest.raises(CodecError):
        builder.encode(version=4)
