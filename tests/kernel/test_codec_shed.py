"""Shed tallies in the sample batch (docs/decisions/0025-overload-and-judgment.md):
version 3 only when a tally is held, refused in versions 1 and 2."""

from __future__ import annotations

import struct
import zlib

import pytest

from controlplane.kernel.codec import (
    BAD_OUTCOME,
    BAD_VERSION,
    SHED,
    VERSION,
    VERSION_SHED,
    BatchBuilder,
    BatchMeta,
    decode,
    decode_raw,
    entry_fields,
    is_failure_outcome,
    parse_entry,
    parse_entry_raw,
)
from controlplane.kernel.errors import CodecError

NOW = 1_800_000_000.0
U32_MAX = 0xFFFF_FFFF


def with_crc(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


def test_a_batch_without_a_tally_stays_version_2() -> None:
    builder = BatchBuilder()
    builder.add(NOW, "canary", 1_000, 200)
    assert builder.version == VERSION == 2
    meta, batch = parse_entry(entry_fields(BatchMeta("42", "sc-1", 1, 1), builder.encode()))
    assert meta.version == 2 and batch.outcome.tolist() == [200]


def test_a_tally_makes_the_batch_version_3_and_round_trips() -> None:
    builder = BatchBuilder()
    builder.add(NOW, "canary", 1_000, 200, unit=7, first_byte_us=400)
    builder.add_shed(NOW + 0.002, "baseline", 12)
    builder.add_shed(NOW + 0.003, "canary", 0)  # nothing shed: no record
    assert builder.version == VERSION_SHED == 3 and len(builder) == 2
    fields = entry_fields(
        BatchMeta("42", "sc-1", 1, len(builder), builder.version), builder.encode()
    )
    meta, batch = parse_entry(fields)
    assert meta.version == 3
    assert batch.variants == ("canary", "baseline")
    assert batch.outcome.tolist() == [200, SHED]
    assert batch.rt_us.tolist() == [1_000, 12]  # a tally's count is its rt_us
    assert batch.unit.tolist() == [7, 0]
    assert batch.fb_us is not None and batch.fb_us.tolist() == [400, 0]
    assert batch.ts[1] == pytest.approx(NOW + 0.002, abs=1e-6)


def test_tallies_added_column_by_column_make_it_version_3() -> None:
    builder = BatchBuilder()
    builder.add_columns([NOW, NOW], ["canary", "canary"], [900, 5], [200, SHED], [0, 0], [800, 0])
    assert builder.version == 3
    assert decode(builder.encode()).outcome.tolist() == [200, SHED]


def test_a_tally_saturates_at_the_u32_maximum() -> None:
    builder = BatchBuilder()
    builder.add_shed(NOW, "canary", U32_MAX + 10)
    assert decode(builder.encode()).rt_us.tolist() == [U32_MAX]


def test_a_batch_with_a_tally_cannot_be_written_as_an_older_version() -> None:
    builder = BatchBuilder()
    builder.add_shed(NOW, "canary", 3)
    for version in (1, 2):
        with pytest.raises(CodecError) as caught:
            builder.encode(version)
        assert caught.value.reason == BAD_VERSION


def _shed_in(version: int) -> bytes:
    """A payload of `version` whose one record has the outcome SHED, checksum right."""
    builder = BatchBuilder()
    builder.add(NOW, "canary", 5, 200)
    payload = bytearray(builder.encode(version)[:-4])
    # header 9 bytes, the name table (1 + 6), t0 8, dt 4, variant 1, rt 4: the outcome
    offset = 9 + 1 + len("canary") + 8 + 4 + 1 + 4
    assert struct.unpack_from("<H", payload, offset) == (200,)
    struct.pack_into("<H", payload, offset, SHED)
    return with_crc(bytes(payload))


@pytest.mark.parametrize("version", [1, 2])
def test_a_tally_in_a_version_1_or_2_batch_is_refused(version: int) -> None:
    with pytest.raises(CodecError) as caught:
        decode_raw(_shed_in(version))
    assert caught.value.reason == BAD_OUTCOME
    fields = entry_fields(BatchMeta("42", "sc-1", 1, 1, version), _shed_in(version))
    with pytest.raises(CodecError) as caught:
        parse_entry_raw(fields)
    assert caught.value.reason == BAD_OUTCOME


def test_an_entry_that_calls_a_version_3_payload_version_2_is_refused() -> None:
    builder = BatchBuilder()
    builder.add_shed(NOW, "canary", 3)
    fields = entry_fields(BatchMeta("42", "sc-1", 1, 1, 2), builder.encode())
    with pytest.raises(CodecError) as caught:
        parse_entry_raw(fields)
    assert caught.value.reason == BAD_VERSION


def test_a_shed_request_is_no_failure() -> None:
    assert not is_failure_outcome(SHED)
    assert not is_failure_outcome(SHED, failure_statuses=frozenset({500}))
