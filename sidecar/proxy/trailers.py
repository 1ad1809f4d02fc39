"""Trailer fields of chunked messages (RFC 9112 §7.1.2, RFC 9110 §6.5), both ways.

httptools reports a chunked request's trailer fields through the same `on_header`
callback as its head's, after the body; the client side collects them and ends the
chunked body it sends upstream with them (`last_chunk`). On the response side the
parser has no field callbacks at all (a response head is rewritten whole, see
`headers`): a per-field callback would cost every response ~1 µs to serve the rare
one with trailers. Instead the upstream side keeps the last bytes of a chunked
response and `trailer_section` finds the trailer fields in them once httptools has
accepted the message, so they are already checked for syntax.

Which fields may travel as trailers is decided in one place, `trailer_allowed`, for
both protocols and both directions (HTTP/1.1 chunked trailer sections and HTTP/2
trailing HEADERS, of requests and responses): a trailer arrives after the head was
acted on, so a field the head is read for never comes from one (RFC 9110 §6.5.1;
the list and why: decision 0037). Every field dropped is counted by the caller. The
section is bounded (`MAX_TRAILER_BYTES`, the rest is dropped and counted).
"""

from __future__ import annotations

import re
from typing import Final

from sidecar.proxy.headers import HOP_BY_HOP, Header

MAX_TRAILER_BYTES: Final = 16 * 1024
# how much of a chunked response's end is kept to find its trailers in
TAIL_BYTES: Final = MAX_TRAILER_BYTES + 256

LAST_CHUNK: Final = b"0\r\n\r\n"
# Never a trailer: framing (content-length; transfer-encoding, te and trailer are
# hop-by-hop), routing (host), authentication and credentials, request modifiers
# (controls and conditionals), response controls, content format, and the fields the
# proxy sets or forwards by (the x-canary-* and x-forwarded-* families, forwarded, via).
NEVER_TRAILERS: Final = frozenset(
    {
        b"content-length",
        b"host",
        b"authorization",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"www-authenticate",
        b"cookie",
        b"set-cookie",
        b"cache-control",
        b"expect",
        b"max-forwards",
        b"pragma",
        b"range",
        b"if-match",
        b"if-none-match",
        b"if-modified-since",
        b"if-unmodified-since",
        b"if-range",
        b"age",
        b"expires",
        b"date",
        b"location",
        b"retry-after",
        b"vary",
        b"content-encoding",
        b"content-type",
        b"content-range",
        b"forwarded",
        b"via",
    }
)
_NEVER_PREFIXES: Final = (b"proxy-", b"x-canary-", b"x-forwarded-")
# the last-chunk line: zeros, maybe extensions; no trailer field line can look like it
# (a field line needs a colon after a token, and ";" is not a token character)
_LAST_CHUNK_LINE: Final = re.compile(rb"\r\n0+(?:;[^\r\n]*)?\r\n")


def trailer_allowed(lower: bytes, named: frozenset[bytes] | None) -> bool:
    """Whether a trailer field (its lower-case name) may go on; `named`: the extra
    names the message's Connection field listed (hop-by-hop too)."""
    return not (
        lower in NEVER_TRAILERS
        or lower in HOP_BY_HOP
        or lower.startswith(_NEVER_PREFIXES)
        or (named is not None and lower in named)
    )


def trailer_pairs(
    trailers: list[tuple[bytes, bytes]], named: frozenset[bytes] | None
) -> tuple[list[tuple[bytes, bytes]], int]:
    """HTTP/2 trailers (lower-case names) that may go on, and how many were dropped."""
    kept = [pair for pair in trailers if trailer_allowed(pair[0], named)]
    return kept, len(trailers) - len(kept)


def request_last_chunk(trailers: list[Header], named: frozenset[bytes] | None) -> tuple[bytes, int]:
    """The end of a chunked request body sent upstream: the last chunk, the trailer
    fields that may travel, the blank line; and how many fields were dropped."""
    kept = [
        b"%s: %s\r\n" % (raw, value)
        for lower, raw, value in trailers
        if trailer_allowed(lower, named)
    ]
    return b"".join([b"0\r\n", *kept, b"\r\n"]), len(trailers) - len(kept)


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


def response_trailers(section: bytes, named: frozenset[bytes] | None) -> tuple[bytes, int]:
    """The trailer field lines of a response that go on to the client, and how many
    were dropped."""
    kept = []
    dropped = 0
    for line in section.split(b"\r\n"):
        name, sep, _ = line.partition(b":")
        if not sep:
            continue
        if trailer_allowed(name.strip().lower(), named):
            kept.append(line + b"\r\n")
        else:
            dropped += 1
    return b"".join(kept), dropped
