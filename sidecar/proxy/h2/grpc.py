"""A gRPC call's outcome from its response (gRPC over HTTP/2, "Responses").

A failed call is an HTTP 200 whose grpc-status, in the trailers (or in the one head
of a trailers-only response), says how it ended. The sample outcome is
`codec.grpc_outcome(code)`; a response that is not gRPC keeps its HTTP status.
"""

from __future__ import annotations

from controlplane.kernel.codec import GRPC_MAX_CODE, grpc_outcome

GRPC_CONTENT_TYPE = b"application/grpc"
UNKNOWN = 2  # the code gRPC clients give a call whose status is missing or unreadable


def is_grpc(content_type: bytes | None) -> bool:
    """application/grpc, or application/grpc+proto and the like."""
    if content_type is None or not content_type.startswith(GRPC_CONTENT_TYPE):
        return False
    rest = content_type[len(GRPC_CONTENT_TYPE) :]
    return not rest or rest[:1] in (b"+", b";")


def status_code(raw: bytes | None) -> int | None:
    """The grpc-status value as a code 0..16; None when missing or not one."""
    if raw is None or not 1 <= len(raw) <= 2 or not raw.isdigit():
        return None
    code = int(raw)
    return code if code <= GRPC_MAX_CODE else None


def call_outcome(http_status: int, grpc: bool, grpc_status: bytes | None) -> int:
    """The sample outcome of a response: its HTTP status unless it is a gRPC answer
    (HTTP 200 with a gRPC content type), then its grpc-status, UNKNOWN when that is
    missing or unreadable."""
    if not grpc or http_status != 200:
        return http_status
    code = status_code(grpc_status)
    return grpc_outcome(UNKNOWN if code is None else code)
