from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.codec import (
    CONNECT_ERROR,
    TIMEOUT,
    BatchBuilder,
    BatchMeta,
    decode,
    entry_fields,
    is_failure_outcome,
    parse_entry,
)
from controlplane.kernel.errors import CodecError

samples = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=30, allow_nan=False),
        st.sampled_from(["baseline", "canary"]),
        st.integers(min_value=0, max_value=2**32 - 1),
        st.sampled_from([CONNECT_ERROR, TIMEOUT, 200, 204, 404, 500, 503]),
        st.integers(min_value=0, max_value=2**32 - 1),
    ),
    max_size=300,
)


@settings(max_examples=60, deadline=None)
@given(samples)
def test_round_trip_keeps_every_sample(rows: list[tuple[float, str, int, int, int]]) -> None:
    builder = BatchBuilder()
    base = 1_800_000_000.0
    for offset, variant, rt, outcome, unit in rows:
        builder.add(base + offset, variant, rt, outcome, unit)
    batch = decode(builder.encode())
    assert len(batch) == len(rows)
    names = [batch.variants[i] for i in batch.variant]
    assert names == [r[1] for r in rows]
    assert batch.rt_us.tolist() == [r[2] for r in rows]
    assert batch.outcome.tolist() == [r[3] for r in rows]
    assert batch.unit.tolist() == [r[4] for r in rows]
    if rows:
        first = rows[0][0]
        expected = [base + max(r[0] - first, 0) + first for r in rows]
        np.testing.assert_allclose(batch.ts, expected, atol=2e-6)


def test_payload_is_compact() -> None:
    builder = BatchBuilder()
    for i in range(512):
        builder.add(1e9 + i / 1000, "canary" if i % 2 else "baseline", 1234, 200)
    assert len(builder.encode()) < 512 * 20 + 64  # 19 bytes a sample


def _payload() -> bytes:
    builder = BatchBuilder()
    builder.add(1e9, "baseline", 1000, 200)
    builder.add(1e9 + 0.01, "canary", 2000, 503)
    return builder.encode()


@pytest.mark.parametrize("cut", [0, 5, 12, 20, -1])
def test_truncated_payload_is_a_clear_error(cut: int) -> None:
    with pytest.raises(CodecError, match=r"truncated|checksum"):
        decode(_payload()[:cut])


def test_flipped_byte_is_detected() -> None:
    raw = bytearray(_payload())
    raw[20] ^= 0xFF
    with pytest.raises(CodecError, match="checksum"):
        decode(bytes(raw))


def test_entry_round_trip_and_count_check() -> None:
    payload = _payload()
    meta = BatchMeta(experiment="7", source="sc-1", seq=42, n=2)
    got_meta, batch = parse_entry(entry_fields(meta, payload))
    assert got_meta == meta and len(batch) == 2
    fields = entry_fields(BatchMeta("7", "sc-1", 42, 3), payload)
    with pytest.raises(CodecError, match="n=3"):
        parse_entry(fields)
    del fields["seq"]
    with pytest.raises(CodecError, match="seq"):
        parse_entry(fields)


@pytest.mark.parametrize(
    ("outcome", "failed"),
    [(CONNECT_ERROR, True), (TIMEOUT, True), (200, False), (404, False), (500, True)],
)
def test_failure_outcomes(outcome: int, failed: bool) -> None:
    assert is_failure_outcome(outcome) is failed
