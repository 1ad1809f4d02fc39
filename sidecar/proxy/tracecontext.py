"""W3C Trace Context (`traceparent`) as the proxy reads and writes it: pure functions.

    traceparent: 00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>

Lower-case hex only; an all-zero trace or parent id is invalid, version ff is invalid.
A later version is read by its first four fields when a `-` or the end follows them
(Trace Context §3.2.4: a parser reading an unknown version must still use them).
Anything else is not a traceparent: the proxy starts a new trace instead.
"""

from __future__ import annotations

_HEX = frozenset(b"0123456789abcdef")
_V00_LENGTH = 55  # 2 + 1 + 32 + 1 + 16 + 1 + 2
SAMPLED = 0x01

TraceParent = tuple[int, int, int]  # trace id, parent (span) id, flags


def _hex(part: bytes) -> bool:
    return bool(part) and _HEX.issuperset(part)


def parse_traceparent(value: bytes) -> TraceParent | None:
    """(trace id, parent id, flags) of a valid traceparent value, else None."""
    value = value.strip(b" \t")
    if len(value) < _V00_LENGTH:
        return None
    version = value[:2]
    if not _hex(version) or version == b"ff":
        return None
    if version == b"00" and len(value) != _V00_LENGTH:
        return None
    if len(value) > _V00_LENGTH and value[_V00_LENGTH : _V00_LENGTH + 1] != b"-":
        return None
    if value[2:3] != b"-" or value[35:36] != b"-" or value[52:53] != b"-":
        return None
    trace, parent, flags = value[3:35], value[36:52], value[53:55]
    if not (_hex(trace) and _hex(parent) and _hex(flags)):
        return None
    trace_id, parent_id = int(trace, 16), int(parent, 16)
    if trace_id == 0 or parent_id == 0:
        return None
    return trace_id, parent_id, int(flags, 16)


def format_traceparent(trace_id: int, span_id: int, sampled: bool) -> bytes:
    return b"00-%032x-%016x-%s" % (trace_id, span_id, b"01" if sampled else b"00")


def ratio_bound(ratio: float) -> int:
    """The bound under which a trace id's low 64 bits are sampled at `ratio`: the rule
    of OpenTelemetry's TraceIdRatioBased sampler, so every process that applies it to
    the same trace agrees."""
    return round(min(max(ratio, 0.0), 1.0) * (1 << 64))


def sampled_by_ratio(trace_id: int, bound: int) -> bool:
    return trace_id & 0xFFFFFFFFFFFFFFFF < bound
