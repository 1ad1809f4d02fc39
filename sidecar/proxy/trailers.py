"""Trailer fields of chunked messages (RFC 9112 §7.1.2, RFC 9110 §6.5), both ways.

httptools reports a chunked request's trailer fields through the same `on_header`
callback as its head's, after the body; the client side collects them and ends the
chunked body it sends upstream with them (`last_chunk`). On the response side the
parser has no field callbacks at all (a response head is rewritten whole, see
`headers`): a per-field callback would cost every response ~1 µs to serve the rare
one with trailers. Instead the upstream side keeps the last bytes of a chunked
response and `trailer_section` finds the trailer fields in them once httptools has
accepted the message, so they are already checked for syntax.

Trailers follow the rules of heads: hop-by-hop fields, those the head's Connection
named, framing and routing fields and the proxy's own are dropped; the section is
bounded (`MAX_TRAILER_BYTES`, the rest is dropped and counted).
"""

from __future__ import annotations

import re
from typing import Final

from sidecar.proxy.headers import EXPERIMENT, HOP_BY_HOP, VARIANT, Header

MAX_TRAILER_BYTES: Final = 16 * 1024
# how much of a chunked response's end is kept to find its trailers in
TAIL_BYTES: Final = MAX_TRAILER_BYTES + 256

LAST_CHUNK: Final = b"0\r\n\r\n"
# framing and routing never come from a trailer: the message is framed by then
_NEVER: Final = frozenset(
    {b"content-length", b"host", b"x-forwarded-for", b"x-forwarded-proto", VARIANT, EXPERIMENT}
)
# the last-chunk line: zeros, maybe extensions; no trailer field line can look like it
# (a field line needs a colon after a token, and ";" is not a token character)
_LAST_CHUNK_LINE: Final = re.compile(rb"\r\n0+(?:;[^\r\n]*)?\r\n")


def _dropped(lower: bytes, named: frozenset[bytes] | None) -> bool:
    return (
        lower in HOP_BY_HOP
        or lower in _NEVER
        or lower.startswith(b"proxy-")
        or (named is not None and lower in named)
    )


def request_last_chunk(trailers: list[Header], named: frozenset[bytes] | None) -> bytes:
    """The end of a chunked request body sent upstream: the last chunk, the trailer
    fields that may travel, the blank line."""
    kept = [
        b"%s: %s\r\n" % (raw, value) for lower, raw, value in trailers if not _dropped(lower, named)
    ]
    return b"".join([b"0\r\n", *kept, b"\r\n"])


def trailer_section(tail: bytes) -> bytes | None:
    """The trailer field lines ("Name: value\\r\\n" each, b"" for none) at the end of a
    complete chunked message whose last bytes are `tail`; None when they cannot be
    found in it (a section longer than the tail keeps)."""
    if tail.endswith(b"\r\n" + LAST_CHUNK):
        return b""
    matches = list(_LAST_CHUNK_LINE.finditer(tail))
    if not matches:
        return None
    last = matches[-1]
    rest = tail[last.end() :]
    if rest.startswith(b"\r\n"):
        return b""
    end = rest.find(b"\r\n\r\n")
    if end < 0 or end + 2 > MAX_TRAILER_BYTES:
        return None
    return rest[: end + 2]


def response_trailers(section: bytes, named: frozenset[bytes] | None) -> bytes:
    """The trailer field lines of a response that go on to the client."""
    kept = []
    for line in section.split(b"\r\n"):
        name, sep, _ = line.partition(b":")
        if sep and not _dropped(name.strip().lower(), named):
            kept.append(line + b"\r\n")
    return b"".join(kept)
