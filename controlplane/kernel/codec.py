"""The sample batch codec (DESIGN §5): compact, columnar, versioned, checksummed.

A batch is one Redis Stream entry with fields `v, exp, src, seq, n, data`. `data`
is the binary payload below; the sidecar builds it with `BatchBuilder` (stdlib
arrays, cheap per request) and the collector decodes it straight into numpy arrays.

Payload, version 1, little-endian:

    magic  b"CSB"          3 bytes
    version u8             = 1
    n       u32            samples in the batch
    k       u8             number of variant names, then k x (u8 length, utf-8 bytes)
    t0      f64            batch base time, seconds since the epoch
    dt_us   u32[n]         sample time - t0, microseconds
    variant u8[n]          index into the variant names
    rt_us   u32[n]         response time, microseconds (saturates at ~71 minutes)
    outcome u16[n]         HTTP status, or CONNECT_ERROR / TIMEOUT / ABORTED below 100
    unit    u32[n]         32-bit hash of the sticky unit (0: none), for per-unit analysis
    crc32   u32            zlib.crc32 of everything before it
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from controlplane.kernel.errors import CodecError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

VERSION = 1
MAGIC = b"CSB"
CONNECT_ERROR = 0
TIMEOUT = 1
ABORTED = 2  # the client went away before the upstream answered

_HEAD = struct.Struct("<3sBIB")
_T0 = struct.Struct("<d")
_CRC = struct.Struct("<I")
_U32_MAX = 0xFFFF_FFFF
_BYTES_PER_SAMPLE = 4 + 1 + 4 + 2 + 4
_LITTLE = sys.byteorder == "little"


def is_failure_outcome(outcome: int, *, failure_statuses: frozenset[int] | None = None) -> bool:
    """Connect errors, timeouts and (by default) 5xx are failures."""
    if outcome < 100:
        return outcome != ABORTED
    if failure_statuses is None:
        return outcome >= 500
    return outcome in failure_statuses


class BatchBuilder:
    """Accumulates one experiment's samples; `encode()` yields the payload."""

    __slots__ = ("_dt", "_outcome", "_rt", "_t0", "_unit", "_variant", "_variants")

    def __init__(self) -> None:
        self._variants: dict[str, int] = {}
        self._t0: float | None = None
        self._dt = array("I")
        self._variant = array("B")
        self._rt = array("I")
        self._outcome = array("H")
        self._unit = array("I")

    def __len__(self) -> int:
        return len(self._rt)

    @property
    def first_ts(self) -> float | None:
        return self._t0

    def add(self, ts: float, variant: str, rt_us: int, outcome: int, unit: int = 0) -> None:
        index = self._variants.get(variant)
        if index is None:
            if len(self._variants) >= 255:
                raise CodecError("a batch holds at most 255 variant names")
            index = self._variants[variant] = len(self._variants)
        if self._t0 is None:
            self._t0 = ts
        # samples recorded slightly out of order (concurrent requests) clamp to t0;
        # comparisons rather than min/max calls: this runs once per proxied request
        dt = int((ts - self._t0) * 1e6)
        self._dt.append(dt if 0 <= dt <= _U32_MAX else (0 if dt < 0 else _U32_MAX))
        self._variant.append(index)
        self._rt.append(rt_us if 0 <= rt_us <= _U32_MAX else (0 if rt_us < 0 else _U32_MAX))
        self._outcome.append(outcome)
        self._unit.append(unit & _U32_MAX)

    def add_columns(
        self,
        ts: Sequence[float],
        variants: Sequence[str],
        rt_us: Sequence[int],
        outcomes: Sequence[int],
        units: Sequence[int],
    ) -> None:
        """Add several samples given column by column: what `add` does for each, with
        C loops instead of a Python call per sample (the sidecar records this way).
        All or nothing: on an error (CodecError, or a value out of its column's range)
        the builder is left as it was."""
        if not ts:
            return
        index = self._variants
        # new names are numbered in order of first appearance, as `add` numbers them
        new = [name for name in dict.fromkeys(variants) if name not in index]
        if len(index) + len(new) > 255:
            raise CodecError("a batch holds at most 255 variant names")
        lookup = {**index, **{name: len(index) + i for i, name in enumerate(new)}}
        t0 = ts[0] if self._t0 is None else self._t0
        if units and (min(units) < 0 or max(units) > _U32_MAX):
            units = [unit & _U32_MAX for unit in units]
        columns = (
            array("I", _clamped([int((t - t0) * 1e6) for t in ts])),
            array("B", map(lookup.__getitem__, variants)),
            array("I", _clamped(rt_us)),
            array("H", outcomes),
            array("I", units),
        )
        index.update(lookup)
        self._t0 = t0
        for column, values in zip(
            (self._dt, self._variant, self._rt, self._outcome, self._unit), columns, strict=True
        ):
            column.extend(values)

    def encode(self) -> bytes:
        names = sorted(self._variants, key=self._variants.__getitem__)
        parts = [_HEAD.pack(MAGIC, VERSION, len(self), len(names))]
        for name in names:
            raw = name.encode()
            if len(raw) > 255:
                raise CodecError(f"variant name too long: {name[:32]!r}…")
            parts.append(bytes([len(raw)]) + raw)
        parts.append(_T0.pack(self._t0 or 0.0))
        for column in (self._dt, self._variant, self._rt, self._outcome, self._unit):
            if not _LITTLE:
                column = array(column.typecode, column)
                column.byteswap()
            parts.append(column.tobytes())
        body = b"".join(parts)
        return body + _CRC.pack(zlib.crc32(body))


def _clamped(values: Sequence[int]) -> Sequence[int]:
    """`values` within u32, as `add` clamps them (checked in C, fixed only if needed)."""
    if min(values) >= 0 and max(values) <= _U32_MAX:
        return values
    return [0 if v < 0 else (_U32_MAX if v > _U32_MAX else v) for v in values]


@dataclass(frozen=True)
class DecodedBatch:
    variants: tuple[str, ...]
    ts: npt.NDArray[np.float64]
    variant: npt.NDArray[np.uint8]
    rt_us: npt.NDArray[np.uint32]
    outcome: npt.NDArray[np.uint16]
    unit: npt.NDArray[np.uint32]

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

    def __len__(self) -> int:
        return int(self.rt_us.shape[0])


def decode_raw(payload: bytes) -> RawBatch:
    """Check a payload and view its columns; raises CodecError on anything corrupt."""
    import numpy as np

    if len(payload) < _HEAD.size + _T0.size + _CRC.size:
        raise CodecError(f"sample payload truncated: {len(payload)} bytes")
    end = len(payload) - _CRC.size
    (crc,) = _CRC.unpack_from(payload, end)
    if zlib.crc32(memoryview(payload)[:end]) != crc:
        raise CodecError("sample payload checksum mismatch (corrupt or truncated)")
    magic, version, n, k = _HEAD.unpack_from(payload, 0)
    if magic != MAGIC:
        raise CodecError(f"not a sample payload (magic {magic!r})")
    if version != VERSION:
        raise CodecError(f"unsupported sample payload version {version}")
    offset = _HEAD.size
    names: list[str] = []
    try:
        for _ in range(k):
            size = payload[offset]
            if offset + 1 + size > end:
                raise IndexError(offset)
            names.append(payload[offset + 1 : offset + 1 + size].decode())
            offset += 1 + size
    except (IndexError, UnicodeDecodeError) as exc:
        raise CodecError("sample payload has a corrupt variant table") from exc
    if end != offset + _T0.size + n * _BYTES_PER_SAMPLE:
        raise CodecError(f"sample payload length does not match its {n} samples")
    (t0,) = _T0.unpack_from(payload, offset)
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
    if n and int(variant.max()) >= len(names):
        raise CodecError("sample payload names a variant it does not define")
    return RawBatch(tuple(names), t0, dt, variant, rt_us, outcome, unit)


def _owned(raw: RawBatch) -> DecodedBatch:
    import numpy as np

    return DecodedBatch(
        variants=raw.variants,
        ts=raw.t0 + raw.dt_us.astype(np.float64) / 1e6,
        variant=raw.variant.astype(np.uint8),
        rt_us=raw.rt_us.astype(np.uint32),
        outcome=raw.outcome.astype(np.uint16),
        unit=raw.unit.astype(np.uint32),
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


def entry_fields(meta: BatchMeta, payload: bytes) -> dict[str, bytes]:
    """The stream entry's fields for one batch (DESIGN §5)."""
    return {
        "v": str(VERSION).encode(),
        "exp": meta.experiment.encode(),
        "src": meta.source.encode(),
        "seq": str(meta.seq).encode(),
        "n": str(meta.n).encode(),
        "data": payload,
    }


def parse_entry_raw(fields: Mapping[str, bytes]) -> tuple[BatchMeta, RawBatch]:
    """Validate one stream entry and view its columns (see `decode_raw`)."""
    try:
        version = int(fields["v"])
        meta = BatchMeta(
            experiment=fields["exp"].decode(),
            source=fields["src"].decode(),
            seq=int(fields["seq"]),
            n=int(fields["n"]),
        )
        payload = fields["data"]
    except KeyError as exc:
        raise CodecError(f"sample entry lacks field {exc.args[0]!r}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise CodecError(f"sample entry has a malformed field: {exc}") from exc
    if version != VERSION:
        raise CodecError(f"unsupported sample entry version {version}")
    batch = decode_raw(payload)
    if len(batch) != meta.n:
        raise CodecError(f"sample entry says n={meta.n} but carries {len(batch)} samples")
    return meta, batch


def parse_entry(fields: Mapping[str, bytes]) -> tuple[BatchMeta, DecodedBatch]:
    """Validate and decode one stream entry; CodecError names what is wrong."""
    meta, raw = parse_entry_raw(fields)
    return meta, _owned(raw)
