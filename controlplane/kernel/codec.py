"""The sample batch codec (architecture §5): compact, columnar, versioned, checksummed.

A batch is one Redis Stream entry with fields `v, exp, src, seq, n, data`. `data`
is the binary payload below; the sidecar builds it with `BatchBuilder` (stdlib
arrays, cheap per request) and the collector decodes it straight into numpy arrays.

Payload, version 2, little-endian (version 1 is the same without `fb_us`; version 3
is the layout of version 2, and the only one that may carry SHED tallies):

    magic  b"CSB"          3 bytes
    version u8             = 2 (or 1, from a sidecar that predates the first byte)
    n       u32            samples in the batch
    k       u8             number of variant names, then k x (u8 length, utf-8 bytes)
    t0      f64            batch base time, seconds since the epoch
    dt_us   u32[n]         sample time - t0, microseconds
    variant u8[n]          index into the variant names
    rt_us   u32[n]         response time, microseconds (saturates at ~71 minutes)
    outcome u16[n]         HTTP status, or CONNECT_ERROR / TIMEOUT / ABORTED below 100,
                           or GRPC_STATUS + a gRPC status code (1000..1016), or SHED
                           (version 3 only): a tally, not a sample (below)
    unit    u32[n]         32-bit hash of the sticky unit (0: none), for per-unit analysis
    fb_us   u32[n]         time to the first response byte, microseconds, <= rt_us
                           (version 2 only; an exchange without a response head: rt_us)
    crc32   u32            zlib.crc32 of everything before it

The entry field `v` names the payload's version, and both must agree. A collector
reads versions 1 to 3 (old sidecars keep sending version 1 during a rolling upgrade:
their samples have no first byte, `fb_us` is None) and refuses any other.

A record with outcome SHED is a *tally* of requests the sidecar's overload
protection answered itself (docs/decisions/0025-overload-and-judgment.md): `rt_us`
is how many requests of that variant were shed since the previous tally, `fb_us` and
`unit` are 0, `dt_us` when the tally was taken. A builder seals a batch as version 3
only when it holds a tally, so collectors of the previous release keep reading the
sidecar's other batches; SHED in a version 1 or 2 batch is refused (bad_outcome).

Every byte of an entry is untrusted (anyone who can write to Redis writes entries),
so decoding is strict and bounded, all of it here: a caller gets a valid batch or a
CodecError whose `reason` is a fixed label (one of REASONS) for its drop counter.
What the format makes unrepresentable needs no check (a latency is a u32 of µs:
never NaN or negative; its largest value is the builder's saturation mark). What it
can carry is checked: t0 finite, sample counts within the byte length and
MAX_SAMPLES, every first byte no later than its total, outcomes an HTTP status
(100-999), one of the codes below 100 or a gRPC status (GRPC_STATUS + 0..16),
variant names printable and unique, the entry's experiment id and source bounded
(controlplane.kernel.keys). `check_times` bounds t0 against the reader's clock.
"""

from __future__ import annotations

import math
import operator
import re
import struct
import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

from controlplane.kernel.errors import CodecError
from controlplane.kernel.keys import is_experiment_id

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

VERSION = 2  # what a builder writes when it holds no tally
VERSION_SHED = 3  # what it writes when it does
VERSIONS = (1, 2, 3)  # what a collector reads
MAGIC = b"CSB"
CONNECT_ERROR = 0
TIMEOUT = 1
ABORTED = 2  # the client went away before the upstream answered
SHED = 3  # a tally of requests shed by the sidecar (version 3 only): never a sample
# A gRPC call's outcome is its grpc-status, not its HTTP status (a failed call is an
# HTTP 200): GRPC_STATUS + code, for the codes gRPC defines (0 OK .. 16
# UNAUTHENTICATED). A collector that predates the range refuses such a batch as
# bad_outcome: collectors are upgraded before sidecars.
GRPC_STATUS = 1000
GRPC_MAX_CODE = 16
GRPC_OK = GRPC_STATUS

_HEAD = struct.Struct("<3sBIB")
_T0 = struct.Struct("<d")
_CRC = struct.Struct("<I")
_U32_MAX = 0xFFFF_FFFF
_BYTES_PER_SAMPLE = {1: 4 + 1 + 4 + 2 + 4, 2: 4 + 1 + 4 + 2 + 4 + 4, 3: 4 + 1 + 4 + 2 + 4 + 4}
_LITTLE = sys.byteorder == "little"

# bounds of what a collector accepts (a sidecar sends 512 samples, ~7.7 KB, by default)
MAX_SAMPLES = 65_536
MAX_PAYLOAD = _HEAD.size + 255 * 256 + _T0.size + MAX_SAMPLES * _BYTES_PER_SAMPLE[2] + _CRC.size
MAX_SOURCE = 128
# t0 further from the reader's clock than this is not a clock skew but a bad batch;
# closer, the window counts samples as late or clamps them (windows.py)
MAX_PAST_SEC = 86_400.0
MAX_AHEAD_SEC = 600.0
_SOURCE = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_DIGITS = re.compile(rb"[0-9]{1,19}")
_FIELD_MAX = 64  # bytes of a numeric or id field worth parsing at all

# the reasons a CodecError gives: bounded label values for the collector's counter
MALFORMED = "malformed"
BAD_VERSION = "bad_version"
TRUNCATED = "truncated"
OVERSIZED = "oversized"
BAD_CHECKSUM = "bad_checksum"
BAD_COUNT = "bad_count"
BAD_TIMESTAMP = "bad_timestamp"
BAD_VARIANT = "bad_variant"
BAD_OUTCOME = "bad_outcome"
BAD_EXPERIMENT = "bad_experiment"
BAD_SOURCE = "bad_source"
BAD_FIRST_BYTE = "bad_first_byte"
REASONS = (
    MALFORMED, BAD_VERSION, TRUNCATED, OVERSIZED, BAD_CHECKSUM, BAD_COUNT, BAD_TIMESTAMP,
    BAD_VARIANT, BAD_OUTCOME, BAD_EXPERIMENT, BAD_SOURCE, BAD_FIRST_BYTE,
)  # fmt: skip


def grpc_outcome(code: int) -> int:
    """The outcome of a gRPC call that ended with grpc-status `code` (0..GRPC_MAX_CODE)."""
    if not 0 <= code <= GRPC_MAX_CODE:
        raise ValueError(f"gRPC status {code} outside 0..{GRPC_MAX_CODE}")
    return GRPC_STATUS + code


def is_grpc_outcome(outcome: int) -> bool:
    return GRPC_STATUS <= outcome <= GRPC_STATUS + GRPC_MAX_CODE


def is_failure_outcome(
    outcome: int,
    *,
    failure_statuses: frozenset[int] | None = None,
    grpc_failure_codes: frozenset[int] | None = None,
) -> bool:
    """Connect errors, timeouts and (by default) 5xx are failures; a gRPC call fails
    with the codes in `grpc_failure_codes` (by default every code but 0, OK)."""
    if outcome < 100:
        return outcome != ABORTED and outcome != SHED
    if outcome >= GRPC_STATUS:
        code = outcome - GRPC_STATUS
        return code != 0 if grpc_failure_codes is None else code in grpc_failure_codes
    if failure_statuses is None:
        return outcome >= 500
    return outcome in failure_statuses


class BatchBuilder:
    """Accumulates one experiment's samples; `encode()` yields the payload."""

    __slots__ = (
        "_dt", "_fb", "_outcome", "_rt", "_t0", "_tallies", "_unit", "_variant", "_variants",
    )  # fmt: skip

    def __init__(self) -> None:
        self._variants: dict[str, int] = {}
        self._t0: float | None = None
        self._dt = array("I")
        self._variant = array("B")
        self._rt = array("I")
        self._outcome = array("H")
        self._unit = array("I")
        self._fb = array("I")
        self._tallies = 0  # records with outcome SHED: they make the batch version 3

    def __len__(self) -> int:
        return len(self._rt)

    @property
    def first_ts(self) -> float | None:
        return self._t0

    @property
    def version(self) -> int:
        """The version `encode()` writes: 3 when the batch holds a shed tally, else 2."""
        return VERSION_SHED if self._tallies else VERSION

    def add_shed(self, ts: float, variant: str, count: int) -> None:
        """A tally: `count` requests of `variant` shed since the previous one."""
        if count > 0:
            self.add(ts, variant, count, SHED, 0, 0)

    def add(
        self,
        ts: float,
        variant: str,
        rt_us: int,
        outcome: int,
        unit: int = 0,
        first_byte_us: int | None = None,
    ) -> None:
        """One sample; `first_byte_us` None: the first byte is the whole time (an
        exchange that ended without a response head of its own)."""
        index = self._variants.get(variant)
        if index is None:
            if len(self._variants) >= 255:
                raise CodecError("a batch holds at most 255 variant names")
            index = self._variants[variant] = len(self._variants)
        if self._t0 is None:
            if not math.isfinite(ts):
                raise CodecError("a sample time must be a finite number", BAD_TIMESTAMP)
            self._t0 = ts
        # samples recorded slightly out of order (concurrent requests) clamp to t0;
        # comparisons rather than min/max calls: this runs once per proxied request
        dt = int((ts - self._t0) * 1e6)
        self._dt.append(dt if 0 <= dt <= _U32_MAX else (0 if dt < 0 else _U32_MAX))
        self._variant.append(index)
        rt = rt_us if 0 <= rt_us <= _U32_MAX else (0 if rt_us < 0 else _U32_MAX)
        self._rt.append(rt)
        self._outcome.append(outcome)
        if outcome == SHED:
            self._tallies += 1
        self._unit.append(unit & _U32_MAX)
        fb = rt if first_byte_us is None else first_byte_us
        self._fb.append(fb if 0 <= fb <= rt else (0 if fb < 0 else rt))

    def add_columns(
        self,
        ts: Sequence[float],
        variants: Sequence[str],
        rt_us: Sequence[int],
        outcomes: Sequence[int],
        units: Sequence[int],
        first_byte_us: Sequence[int] | None = None,
    ) -> None:
        """Add several samples given column by column: what `add` does for each, with
        C loops instead of a Python call per sample (the sidecar records this way).
        All or nothing: on an error (CodecError, or a value out of its column's range)
        the builder is left as it was."""
        if not ts:
            return
        index = self._variants
        # one variant, the usual run: the chooser hands out one string, which count()
        # matches by identity before it compares
        names = {variants[0]} if variants.count(variants[0]) == len(variants) else set(variants)
        # new names are numbered in order of first appearance, as `add` numbers them
        new = sorted(names.difference(index), key=variants.index)
        if len(index) + len(new) > 255:
            raise CodecError("a batch holds at most 255 variant names")
        lookup = {**index, **{name: len(index) + i for i, name in enumerate(new)}}
        t0 = ts[0] if self._t0 is None else self._t0
        if not math.isfinite(t0):
            raise CodecError("a sample time must be a finite number", BAD_TIMESTAMP)
        if len(names) == 1:
            variant = array("B", bytes([lookup[variants[0]]]) * len(variants))
        else:
            variant = array("B", bytes(itemgetter(*variants)(lookup)))
        rt = _u32_clamped(rt_us)
        if first_byte_us is None:
            fb = array("I", rt)
        else:
            if len(first_byte_us) != len(rt):
                raise CodecError("first_byte_us must have one value per sample")
            fb = _first_bytes(first_byte_us, rt)
        columns = (
            _micros_since(ts, t0),
            variant,
            rt,
            array("H", _packed("H", outcomes)),
            _u32_masked(units),
            fb,
        )
        if len({len(column) for column in columns}) != 1:
            raise CodecError("sample columns of different lengths")
        index.update(lookup)
        self._t0 = t0
        self._tallies += columns[3].count(SHED)
        for column, values in zip(self._columns(VERSION), columns, strict=True):
            column.extend(values)

    def _columns(self, version: int) -> tuple[array[int], ...]:
        """The payload's columns in order: version 1 lacks the first byte."""
        columns = (self._dt, self._variant, self._rt, self._outcome, self._unit)
        return columns if version == 1 else (*columns, self._fb)

    def encode(self, version: int | None = None) -> bytes:
        """The payload, of `self.version` by default; `version=1` writes what a sidecar
        before the first byte wrote (for tests and benchmarks of a rolling upgrade)."""
        if version is None:
            version = self.version
        if version not in VERSIONS:
            raise CodecError(f"no sample payload version {version}", BAD_VERSION)
        if self._tallies and version != VERSION_SHED:
            raise CodecError(f"a batch with shed tallies is version 3, not {version}", BAD_VERSION)
        names = sorted(self._variants, key=self._variants.__getitem__)
        parts = [_HEAD.pack(MAGIC, version, len(self), len(names))]
        for name in names:
            raw = name.encode()
            if len(raw) > 255:
                raise CodecError(f"variant name too long: {name[:32]!r}…")
            parts.append(bytes([len(raw)]) + raw)
        parts.append(_T0.pack(self._t0 or 0.0))
        for column in self._columns(version):
            if not _LITTLE:
                column = array(column.typecode, column)
                column.byteswap()
            parts.append(column.tobytes())
        body = b"".join(parts)
        return body + _CRC.pack(zlib.crc32(body))


def _packed(code: str, values: Sequence[float]) -> bytes:
    """`values` as C numbers of struct `code` in native order: a cheaper conversion
    than array()'s for floats and u16 (raises struct.error for one out of range)."""
    return struct.pack(f"{len(values)}{code}", *values)


def _u32_clamped(values: Sequence[int]) -> array[int]:
    """`values` within u32, as `add` clamps them (checked in C, fixed only if needed)."""
    try:
        return array("I", values)
    except OverflowError:
        return array("I", [0 if v < 0 else (_U32_MAX if v > _U32_MAX else v) for v in values])


def _u32_masked(values: Sequence[int]) -> array[int]:
    """The low 32 bits of each of `values`, as `add` keeps a unit hash."""
    try:
        return array("I", values)
    except OverflowError:
        return array("I", [v & _U32_MAX for v in values])


def _first_bytes(first_byte_us: Sequence[int], rt: array[int]) -> array[int]:
    """Each first byte within 0 and its (clamped) total, as `add` keeps it: a first
    byte after the whole exchange is a measuring slip, it is the end."""
    try:
        fb = array("I", first_byte_us)
    except OverflowError:  # below 0 or beyond u32: rare, one by one
        fb = array("I", [0 if f < 0 else min(f, _U32_MAX) for f in first_byte_us])
    if any(map(operator.gt, fb, rt)):  # one C loop; rare, then fixed one by one
        return array("I", [f if f <= r else r for f, r in zip(fb, rt, strict=True)])
    return fb


def _micros_since(ts: Sequence[float], t0: float) -> array[int]:
    """`int((t - t0) * 1e6)` for each of `ts`, clamped to u32, as `add` computes dt.
    A time that is not finite raises ValueError. (numpy does this no faster for a
    flush of a few hundred: packing the floats costs what the loop does; and it
    would cost every sidecar process ~15 MB and a BLAS thread pool.)"""
    try:
        dt = [int((t - t0) * 1e6) for t in ts]
    except (ValueError, OverflowError):  # NaN, or an infinity
        raise ValueError("a sample time must be a finite number") from None
    return _u32_clamped(dt)


@dataclass(frozen=True)
class DecodedBatch:
    variants: tuple[str, ...]
    ts: npt.NDArray[np.float64]
    variant: npt.NDArray[np.uint8]
    rt_us: npt.NDArray[np.uint32]
    outcome: npt.NDArray[np.uint16]
    unit: npt.NDArray[np.uint32]
    # time to the first response byte; None: a version 1 batch, which has none
    fb_us: npt.NDArray[np.uint32] | None = None

    def __len__(self) -> int:
        return int(self.rt_us.shape[0])


@dataclass(frozen=True)
class RawBatch:
    """A checked payload's columns as read-only views into it (no copies).

    For consumers that concatenate many batches before using them: `ts` is
    `t0 + dt_us / 1e6`, computed by whoever concatenates (`decode` does it for one).
    """

    variants: tuple[str, ...]
    t0: float
    dt_us: npt.NDArray[np.uint32]
    variant: npt.NDArray[np.uint8]
    rt_us: npt.NDArray[np.uint32]
    outcome: npt.NDArray[np.uint16]
    unit: npt.NDArray[np.uint32]
    fb_us: npt.NDArray[np.uint32] | None = None  # None: a version 1 batch
    version: int = VERSION

    def __len__(self) -> int:
        return int(self.rt_us.shape[0])


def decode_raw(payload: bytes) -> RawBatch:
    """Check a payload and view its columns; raises CodecError on anything corrupt."""
    import numpy as np

    if not isinstance(payload, bytes | bytearray | memoryview):
        raise CodecError("sample payload is not bytes", MALFORMED)
    if len(payload) < _HEAD.size + _T0.size + _CRC.size:
        raise CodecError(f"sample payload truncated: {len(payload)} bytes", TRUNCATED)
    if len(payload) > MAX_PAYLOAD:
        raise CodecError(f"sample payload of {len(payload)} bytes is too large", OVERSIZED)
    end = len(payload) - _CRC.size
    (crc,) = _CRC.unpack_from(payload, end)
    if zlib.crc32(memoryview(payload)[:end]) != crc:
        raise CodecError("sample payload checksum mismatch (corrupt or truncated)", BAD_CHECKSUM)
    magic, version, n, k = _HEAD.unpack_from(payload, 0)
    if magic != MAGIC:
        raise CodecError("not a sample payload (bad magic)", MALFORMED)
    if version not in VERSIONS:
        raise CodecError(f"unsupported sample payload version {version}", BAD_VERSION)
    if n > MAX_SAMPLES:
        raise CodecError(f"sample payload claims {n} samples, over {MAX_SAMPLES}", BAD_COUNT)
    names = _variant_names(payload, k, end)
    offset = _HEAD.size + sum(1 + len(name.encode()) for name in names)
    if end != offset + _T0.size + n * _BYTES_PER_SAMPLE[version]:
        raise CodecError(f"sample payload length does not match its {n} samples", BAD_COUNT)
    (t0,) = _T0.unpack_from(payload, offset)
    if not math.isfinite(t0):
        raise CodecError("sample payload has a non-finite base time", BAD_TIMESTAMP)
    offset += _T0.size
    frombuffer = np.frombuffer
    dt = frombuffer(payload, dtype="<u4", count=n, offset=offset)
    offset += 4 * n
    variant = frombuffer(payload, dtype="u1", count=n, offset=offset)
    offset += n
    rt_us = frombuffer(payload, dtype="<u4", count=n, offset=offset)
    offset += 4 * n
    outcome = frombuffer(payload, dtype="<u2", count=n, offset=offset)
    offset += 2 * n
    unit = frombuffer(payload, dtype="<u4", count=n, offset=offset)
    fb_us = None
    if version >= 2:
        offset += 4 * n
        fb_us = frombuffer(payload, dtype="<u4", count=n, offset=offset)
        if n and bool((fb_us > rt_us).any()):
            raise CodecError("sample payload has a first byte after its total", BAD_FIRST_BYTE)
    if n and int(variant.max()) >= len(names):
        raise CodecError("sample payload names a variant it does not define", BAD_VARIANT)
    if n and _outcomes_out_of_range(outcome):
        raise CodecError("sample payload has an outcome out of range", BAD_OUTCOME)
    if n and version < VERSION_SHED and bool((outcome == SHED).any()):
        raise CodecError(
            f"sample payload of version {version} carries a shed tally", BAD_OUTCOME
        )
    return RawBatch(tuple(names), t0, dt, variant, rt_us, outcome, unit, fb_us, version)


def _variant_names(payload: bytes, k: int, end: int) -> list[str]:
    """The variant table: k printable, unique, non-empty UTF-8 names within the payload."""
    names: list[str] = []
    offset = _HEAD.size
    for _ in range(k):
        if offset >= end:
            raise CodecError("sample payload has a truncated variant table", BAD_VARIANT)
        size = payload[offset]
        if not size or offset + 1 + size > end:
            raise CodecError("sample payload has a corrupt variant table", BAD_VARIANT)
        try:
            name = bytes(payload[offset + 1 : offset + 1 + size]).decode()
        except UnicodeDecodeError as exc:
            raise CodecError("sample payload has a non-UTF-8 variant name", BAD_VARIANT) from exc
        if not name.isprintable():
            raise CodecError("sample payload has an unprintable variant name", BAD_VARIANT)
        names.append(name)
        offset += 1 + size
    if len(set(names)) != len(names):
        raise CodecError("sample payload names a variant twice", BAD_VARIANT)
    return names


_OUTCOME_OK: npt.NDArray[np.bool_] | None = None


def _outcomes_out_of_range(outcome: npt.NDArray[np.uint16]) -> bool:
    """Any outcome neither one of the codes below 100 (SHED included: its version is
    checked apart), a three-digit HTTP status nor a gRPC status?"""
    global _OUTCOME_OK
    if _OUTCOME_OK is None:
        import numpy as np

        # one gather over the column: cheaper than the two comparisons it replaces
        table = np.zeros(65536, dtype=bool)
        table[: SHED + 1] = True
        table[100:1000] = True
        table[GRPC_STATUS : GRPC_STATUS + GRPC_MAX_CODE + 1] = True
        _OUTCOME_OK = table
    return not bool(_OUTCOME_OK[outcome].all())


def check_times(
    batch: RawBatch,
    now: float,
    *,
    max_past_sec: float = MAX_PAST_SEC,
    max_ahead_sec: float = MAX_AHEAD_SEC,
) -> None:
    """Refuse a batch whose samples lie absurdly far from `now` (the reader's clock).

    Within the bounds the window decides (late samples dropped, early ones clamped);
    outside them the batch is bad, not late: a broken clock, a forged or replayed batch.
    """
    last = batch.t0 + (int(batch.dt_us.max()) / 1e6 if len(batch) else 0.0)
    if batch.t0 < now - max_past_sec or last > now + max_ahead_sec:
        raise CodecError(
            f"sample batch times lie {batch.t0 - now:+.0f} s from the collector's clock",
            BAD_TIMESTAMP,
        )


def _owned(raw: RawBatch) -> DecodedBatch:
    import numpy as np

    return DecodedBatch(
        variants=raw.variants,
        ts=raw.t0 + raw.dt_us.astype(np.float64) / 1e6,
        variant=raw.variant.astype(np.uint8),
        rt_us=raw.rt_us.astype(np.uint32),
        outcome=raw.outcome.astype(np.uint16),
        unit=raw.unit.astype(np.uint32),
        fb_us=None if raw.fb_us is None else raw.fb_us.astype(np.uint32),
    )


def decode(payload: bytes) -> DecodedBatch:
    """Decode a payload; raises CodecError on anything corrupt or truncated."""
    return _owned(decode_raw(payload))


@dataclass(frozen=True)
class BatchMeta:
    experiment: str
    source: str
    seq: int
    n: int
    version: int = VERSION


def entry_fields(meta: BatchMeta, payload: bytes) -> dict[str, bytes]:
    """The stream entry's fields for one batch (architecture §5); `v` is the payload's."""
    return {
        "v": str(meta.version).encode(),
        "exp": meta.experiment.encode(),
        "src": meta.source.encode(),
        "seq": str(meta.seq).encode(),
        "n": str(meta.n).encode(),
        "data": payload,
    }


def _field(fields: Mapping[str, bytes], name: str) -> bytes:
    try:
        value = fields[name]
    except KeyError as exc:
        raise CodecError(f"sample entry lacks field {name!r}", MALFORMED) from exc
    if not isinstance(value, bytes):
        raise CodecError(f"sample entry field {name!r} is not bytes", MALFORMED)
    return value


def _number(fields: Mapping[str, bytes], name: str) -> int:
    value = _field(fields, name)
    if not _DIGITS.fullmatch(value):
        # the value is not echoed: it may be kilobytes of anything
        raise CodecError(f"sample entry field {name!r} is not a number", MALFORMED)
    return int(value)


def parse_meta(fields: Mapping[str, bytes]) -> BatchMeta:
    """The entry's fields other than the payload, checked and bounded."""
    version = _number(fields, "v")
    if version not in VERSIONS:
        raise CodecError(f"unsupported sample entry version {version}", BAD_VERSION)
    raw_exp = _field(fields, "exp")
    experiment = raw_exp.decode("ascii", "replace") if len(raw_exp) <= _FIELD_MAX else ""
    if not is_experiment_id(experiment):
        raise CodecError(f"malformed experiment id ({len(raw_exp)} bytes)", BAD_EXPERIMENT)
    source = _field(fields, "src")
    if not _SOURCE.fullmatch(source):
        raise CodecError(f"malformed source ({len(source)} bytes)", BAD_SOURCE)
    n = _number(fields, "n")
    if not 0 < n <= MAX_SAMPLES:
        raise CodecError(f"sample entry says n={n}: not 1..{MAX_SAMPLES}", BAD_COUNT)
    return BatchMeta(experiment, source.decode("ascii"), _number(fields, "seq"), n, version)


def source_and_seq(fields: Mapping[str, bytes]) -> tuple[str, int] | None:
    """The entry's (src, seq) when both are well-formed, else None; nothing else checked."""
    source = fields.get("src")
    seq = fields.get("seq")
    if not isinstance(source, bytes) or not isinstance(seq, bytes):
        return None
    if not _SOURCE.fullmatch(source) or not _DIGITS.fullmatch(seq):
        return None
    return source.decode("ascii"), int(seq)


def parse_entry_raw(fields: Mapping[str, bytes]) -> tuple[BatchMeta, RawBatch]:
    """Validate one stream entry and view its columns (see `decode_raw`)."""
    meta = parse_meta(fields)
    batch = decode_raw(_field(fields, "data"))
    if len(batch) != meta.n:
        raise CodecError(
            f"sample entry says n={meta.n} but carries {len(batch)} samples", BAD_COUNT
        )
    if batch.version != meta.version:
        raise CodecError(
            f"sample entry says v={meta.version} but carries a version {batch.version} payload",
            BAD_VERSION,
        )
    return meta, batch


def parse_entry(fields: Mapping[str, bytes]) -> tuple[BatchMeta, DecodedBatch]:
    """Validate and decode one stream entry; CodecError names what is wrong."""
    meta, raw = parse_entry_raw(fields)
    return meta, _owned(raw)
