"""The webhook signature: HMAC-SHA256 over the timestamp and the body.

    X-Canary-Timestamp: 1767312000
    X-Canary-Signature: sha256=<hex of HMAC(secret, "1767312000" + "." + body)>

The key is the subscription's secret as UTF-8 bytes; the body is the exact bytes
sent. The timestamp is the attempt's (every retry is signed again), so a receiver
refuses anything signed too long ago and a captured request cannot be replayed
later; the event id (`X-Canary-Event-Id`) lets it drop a retry it already took.
`verify` is what a receiver runs (docs/decisions/0021-notifications.md has the same
in a few lines for receivers that do not import canary).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Final

TIMESTAMP_HEADER: Final = "X-Canary-Timestamp"
SIGNATURE_HEADER: Final = "X-Canary-Signature"
EVENT_HEADER: Final = "X-Canary-Event-Id"
DELIVERY_HEADER: Final = "X-Canary-Delivery"
ATTEMPT_HEADER: Final = "X-Canary-Attempt"
SCHEME: Final = "sha256="
SECRET_PREFIX: Final = "whsec_"
SECRET_MIN_CHARS: Final = 24
SECRET_MAX_CHARS: Final = 256
DEFAULT_TOLERANCE_SEC: Final = 300


def new_secret() -> str:
    """A fresh signing secret: 256 random bits."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The X-Canary-Signature value for `body` sent at `timestamp` (epoch seconds)."""
    message = str(timestamp).encode("ascii") + b"." + body
    return SCHEME + hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def signed_headers(secret: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: signature(secret, timestamp, body)}


def verify(
    secret: str,
    *,
    timestamp: str | None,
    signature_value: str | None,
    body: bytes,
    now: float,
    tolerance_sec: int = DEFAULT_TOLERANCE_SEC,
) -> bool:
    """Whether a request carries a valid signature made within `tolerance_sec` of `now`."""
    if timestamp is None or signature_value is None:
        return False
    if not timestamp.isdigit() or len(timestamp) > 12:
        return False
    if abs(now - int(timestamp)) > tolerance_sec:
        return False
    expected = signature(secret, int(timestamp), body)
    return hmac.compare_digest(expected.encode("ascii"), signature_value.strip().encode("utf-8"))
