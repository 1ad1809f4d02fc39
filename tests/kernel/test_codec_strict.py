"""The decoder refuses every malformed batch with a CodecError and a reason, nothing else.

Random bytes and mutations of valid entries (bit flips, cuts, spliced fields, payloads
with their checksum recomputed so the checks behind it are reached) never raise
anything but CodecError, and its reason is one of the codec's fixed labels.
"""

from __future__ import annotations

import math
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.kernel.codec import (
    BAD_COUNT,
    BAD_OUTCOME,
    BAD_TIMESTAMP,
    BAD_VARIANT,
    GRPC_STATUS,
    MAX_AHEAD_SEC,
    MAX_PAST_SEC,
    REASONS,
    BatchBuilder,
    BatchMeta,
    check_times,
    decode_raw,
    entry_fields,
    grpc_outcome,
    is_failure_outcome,
    parse_entry_raw,
)
from controlplane.kernel.errors import CodecError

NOW = 1_800_000_000.0


def valid_entry(n: int = 5, t0: float = NOW) -> dict[str, bytes]:
    builder = BatchBuilder()
    for i in range(n):
        builder.add(t0 + i / 1000, "canary" if i % 2 else "baseline", 1000 + i, 200)
    return entry_fields(BatchMeta("42", "sc-1", 1, n), builder.encode())


def rechecksummed(body: bytes) -> bytes:
    """A payload body with a valid CRC: what a forger (not a bit flip) sends."""
    return body + struct.pack("<I", zlib.crc32(body))


def refused(fields: dict[str, bytes]) -> str:
    with pytest.raises(CodecError) as caught:
        parse_entry_raw(fields)
    assert caught.value.reason in REASONS
    return caught.value.reason


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2_000))
def test_random_bytes_only_raise_codec_error(data: bytes) -> None:
    try:
        decode_raw(data)
    except CodecError as exc:
        assert exc.reason in REASONS


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 7)), max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 700)),
    fix_crc=st.booleans(),
)
def test_mutated_valid_payloads_only_raise_codec_error(
    n: int, flips: list[tuple[int, int]], cut: int | None, fix_crc: bool
) -> None:
    payload = bytearray(valid_entry(n)["data"])
    for position, bit in flips:
        payload[position % len(payload)] ^= 1 << bit
    body = bytes(payload[:-4] if cut is None else payload[: cut % len(payload)])
    data = rechecksummed(body) if fix_crc else body + bytes(payload[-4:])
    fields = {**valid_entry(n), "data": data}
    try:
        meta, batch = parse_entry_raw(fields)
    except CodecError as exc:
        assert exc.reason in REASONS
        return
    # what passes is well-formed: finite t0, outcomes in range, indices within the table
    assert math.isfinite(batch.t0) and len(batch) == meta.n
    assert all(v < len(batch.variants) for v in batch.variant.tolist())


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(["v", "exp", "src", "seq", "n", "data"]),
    value=st.one_of(st.binary(max_size=300), st.just(b"9" * 5000), st.just(b"1_0")),
)
def test_spliced_entry_fields_only_raise_codec_error(name: str, value: bytes) -> None:
    fields = {**valid_entry(), name: value}
    try:
        parse_entry_raw(fields)
    except CodecError as exc:
        assert exc.reason in REASONS


def test_a_refusal_never_echoes_the_input() -> None:
    huge = b"A" * 10_000
    for name in ("exp", "src", "seq", "v", "n"):
        with pytest.raises(CodecError) as caught:
            parse_entry_raw({**valid_entry(), name: huge})
        assert len(str(caught.value)) < 200 and "AAAA" not in str(caught.value)


@pytest.mark.parametrize("t0", [math.nan, math.inf, -math.inf])
def test_non_finite_base_time_is_refused_behind_a_valid_checksum(t0: float) -> None:
    payload = valid_entry()["data"]
    header = 3 + 1 + 4 + 1 + (1 + len("baseline")) + (1 + len("canary"))
    body = payload[:header] + struct.pack("<d", t0) + payload[header + 8 : -4]
    assert refused({**valid_entry(), "data": rechecksummed(body)}) == BAD_TIMESTAMP


def test_builder_refuses_a_non_finite_first_time() -> None:
    with pytest.raises(CodecError):
        BatchBuilder().add(math.nan, "canary", 1, 200)
    with pytest.raises(CodecError):
        BatchBuilder().add_columns([math.inf], ["canary"], [1], [200], [0])


@pytest.mark.parametrize("outcome", [4, 99, 1017, 65535])
def test_outcomes_out_of_range_are_refused(outcome: int) -> None:
    builder = BatchBuilder()
    builder.add(NOW, "canary", 1, 200)
    builder.add(NOW, "canary", 1, outcome)
    fields = entry_fields(BatchMeta("42", "sc-1", 1, 2), builder.encode())
    assert refused(fields) == BAD_OUTCOME


@pytest.mark.parametrize("outcome", [0, 1, 2, 100, 599, 999])
def test_outcomes_in_range_pass(outcome: int) -> None:
    builder = BatchBuilder()
    builder.add(NOW, "canary", 1, outcome)
    _, batch = parse_entry_raw(entry_fields(BatchMeta("42", "sc-1", 1, 1), builder.encode()))
    assert batch.outcome.tolist() == [outcome]


def payload_with_names(names: list[bytes]) -> bytes:
    """One sample of variant 0, under a variant table written byte for byte."""
    table = b"".join(bytes([len(name)]) + name for name in names)
    body = struct.pack("<3sBIB", b"CSB", 2, 1, len(names)) + table + struct.pack("<d", NOW)
    body += struct.pack("<IBIHII", 0, 0, 1000, 200, 0, 900)
    return rechecksummed(body)


def test_the_raw_payload_helper_builds_a_valid_payload() -> None:
    _, batch = parse_entry_raw({**valid_entry(1), "data": payload_with_names([b"canary"])})
    assert batch.variants == ("canary",) and len(batch) == 1


@pytest.mark.parametrize(
    "names",
    [[b"canary", b"canary"], [b"can\x00ry"], [b"can\nry"], [b""], [b"\xff\xfe"]],
)
def test_duplicate_empty_or_unprintable_variant_names_are_refused(names: list[bytes]) -> None:
    assert refused({**valid_entry(1), "data": payload_with_names(names)}) == BAD_VARIANT


@pytest.mark.parametrize("n", [b"0", b"1000000000000", b"6"])
def test_entry_counts_outside_the_payload_are_refused(n: bytes) -> None:
    assert refused({**valid_entry(5), "n": n}) == BAD_COUNT


@pytest.mark.parametrize(
    ("offset", "ok"),
    [(-MAX_PAST_SEC - 1, False), (-MAX_PAST_SEC + 1, True), (0, True),
     (MAX_AHEAD_SEC - 1, True), (MAX_AHEAD_SEC + 1, False), (-NOW, False)],
)  # fmt: skip
def test_times_are_bounded_against_the_readers_clock(offset: float, ok: bool) -> None:
    _, batch = parse_entry_raw(valid_entry(1, t0=NOW + offset))
    if ok:
        check_times(batch, NOW)
    else:
        with pytest.raises(CodecError) as caught:
            check_times(batch, NOW)
        assert caught.value.reason == BAD_TIMESTAMP


@pytest.mark.parametrize("code", [0, 2, 14, 16])
def test_grpc_statuses_are_outcomes(code: int) -> None:
    builder = BatchBuilder()
    builder.add(NOW, "canary", 1000, grpc_outcome(code))
    _, batch = parse_entry_raw(entry_fields(BatchMeta("42", "sc-1", 1, 1), builder.encode()))
    assert int(batch.outcome[0]) == GRPC_STATUS + code


def test_a_grpc_status_outside_the_defined_codes_is_no_outcome() -> None:
    with pytest.raises(ValueError):
        grpc_outcome(17)


@pytest.mark.parametrize(
    ("outcome", "codes", "failed"),
    [
        (GRPC_STATUS, None, False),
        (GRPC_STATUS + 14, None, True),
        (GRPC_STATUS + 5, frozenset({14}), False),
        (GRPC_STATUS + 14, frozenset({14}), True),
        (GRPC_STATUS, frozenset({0}), True),
    ],
)
def test_grpc_failures_follow_the_codes_chosen(
    outcome: int, codes: frozenset[int] | None, failed: bool
) -> None:
    assert is_failure_outcome(outcome, grpc_failure_codes=codes) is failed
    # the HTTP statuses chosen never make a gRPC outcome a failure
    assert (
        is_failure_outcome(outcome, failure_statuses=frozenset({500}), grpc_failure_codes=codes)
        is failed
    )
