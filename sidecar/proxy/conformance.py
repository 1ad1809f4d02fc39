"""What a request must satisfy before the proxy forwards it (RFC 9110, RFC 9112).

A proxy that reads a message's framing one way while the upstream reads it another
lets a client smuggle a second request inside the first one's body. httptools (llhttp)
already refuses most framing tricks on its own: Content-Length together with
Transfer-Encoding, repeated or non-decimal Content-Length values (even identical
ones), a final coding other than chunked, obs-fold, whitespace before a colon, bare
CR or LF line ends, control characters in values and bad chunk sizes. What it lets
through is checked here:

- a `Connection` field naming a field the proxy frames or addresses the message by,
  which the hop-by-hop rule would otherwise make the proxy drop;
- Transfer-Encoding spread over several fields, or with a coding before `chunked`
  (the proxy decodes chunked and re-chunks, so any other coding would be lost);
- HTTP/0.9 and versions other than 1.0 and 1.1, CONNECT, a missing (HTTP/1.1) or
  repeated Host, and targets other than origin-form, `*` for OPTIONS, or an
  absolute-form naming the Host the request carries.

These run on the rare path only: the common request (origin-form target, no
Transfer-Encoding, a plain `Connection` value) costs no call here. Each refusal
raises `Rejected` with its status and the reason it is counted under.

An HTTP/2 stream's head is not read by httptools, yet it becomes an HTTP/1.1 request
line and fields when its upstream speaks HTTP/1.1. `check_method`,
`check_origin_target`, `check_authority` and `check_fields` hold it to what the
HTTP/1.1 parser accepts (a method it knows, a target of visible ASCII, field values
without control characters), so neither protocol lets through what the other
refuses.
"""

from __future__ import annotations

import re
from typing import Final

import httptools


class Rejected(Exception):
    """A request the proxy refuses. Raised from a parser callback, httptools wraps
    it in HttpParserCallbackError, with this exception as its `__context__`."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason  # the label it is counted under
        self.detail = detail


# Naming one of these in Connection would make the proxy drop it as hop-by-hop while
# the body it frames (or the host it addresses) is still relayed.
NOT_NOMINABLE: Final = frozenset({b"content-length", b"transfer-encoding", b"host"})


def check_connection(value: bytes) -> None:
    """Refuse a Connection field that names a framing or addressing field (called
    for values other than the plain keep-alive / close)."""
    named = {t.strip(b" \t").lower() for t in value.split(b",")} & NOT_NOMINABLE
    if named:
        listed = ", ".join(sorted(n.decode("latin-1") for n in named))
        raise Rejected(400, "connection_option", f"Connection must not name {listed}")


def check_transfer_coding(value: bytes) -> None:
    """Accept exactly `chunked` (any case, empty list elements ignored, RFC 9110
    §5.6.1); a coding before it is not implemented (501), anything else is a 400."""
    if value == b"chunked":
        return
    codings = [coding for coding in (c.strip(b" \t").lower() for c in value.split(b",")) if coding]
    if codings == [b"chunked"]:
        return
    if len(codings) > 1 and codings[-1] == b"chunked":
        raise Rejected(
            501, "transfer_coding", "only the chunked transfer coding is implemented"
        )
    raise Rejected(400, "framing", "Transfer-Encoding must be exactly chunked")


def duplicate_transfer_encoding() -> Rejected:
    return Rejected(400, "framing", "more than one Transfer-Encoding field")


def duplicate_host() -> Rejected:
    return Rejected(400, "host", "more than one Host field")


def unsupported_version(version: str) -> Rejected:
    """For a version other than 1.0 and 1.1; llhttp reports a request line without
    one (HTTP/0.9) as version 0.9."""
    if version == "0.9":
        return Rejected(400, "version", "HTTP/0.9 request lines are not accepted")
    return Rejected(505, "version", f"HTTP/{version} is not supported: use HTTP/1.1")


def connect_refused() -> Rejected:
    return Rejected(405, "method", "CONNECT is not supported: this is a reverse proxy")


def missing_host() -> Rejected:
    return Rejected(400, "host", "an HTTP/1.1 request must carry a Host field")


def request_target(method: bytes, target: bytes, host: bytes | None) -> bytes:
    """The target to forward, for a target not in origin-form (not starting with /).

    `*` is for OPTIONS only. An absolute-form target (RFC 9112 §3.2.2) is accepted
    only when its authority is the Host the request carries: anything else asks
    this proxy to reach some other host. It is forwarded in origin-form."""
    if target == b"*":
        if method == b"OPTIONS":
            return target
        raise Rejected(400, "target", "the asterisk-form target is for OPTIONS only")
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        raise Rejected(400, "target", "the request target must be a path or an http(s) URL")
    end = len(rest)
    for mark in (b"/", b"?", b"#"):
        at = rest.find(mark)
        if 0 <= at < end:
            end = at
    authority, path = rest[:end], rest[end:]
    if not authority or b"@" in authority:
        raise Rejected(400, "target", "the target URL must name a host and no user")
    if host is None or authority.lower() != host.strip(b" \t").lower():
        raise Rejected(400, "target", "an absolute target must name the Host it is sent with")
    path = path.partition(b"#")[0]
    return path if path.startswith(b"/") else b"/" + path


# RFC 9110 §5.6.2 token characters; methods are case-sensitive and the ones the
# HTTP/1.1 parser knows are upper-case
_METHOD: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Z]+\Z")
_TCHAR: Final = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# what httptools accepts in a request target: visible ASCII, nothing else
_VISIBLE: Final = bytes(range(0x21, 0x7F))
# RFC 3986 §3.2.2-3 host [":" port]: an IP literal or a reg-name, no userinfo
_AUTHORITY: Final = re.compile(
    rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]+)(?::[0-9]{0,5})?\Z"
)
# RFC 9110 §5.5: no control character but HTAB (httptools refuses the same)
_CONTROL: Final = bytes(range(0x09)) + bytes(range(0x0A, 0x20)) + b"\x7f"
_known_methods: Final[dict[bytes, bool]] = {}
_METHODS_KEPT: Final = 256


class _Probe:
    """httptools wants a protocol object; the method check needs none of its calls."""


def _parser_knows(method: bytes) -> bool:
    parser = httptools.HttpRequestParser(_Probe())
    try:
        parser.feed_data(method + b" / HTTP/1.1\r\nHost: h\r\n\r\n")
    except httptools.HttpParserError:
        return False
    return True


def check_method(method: bytes) -> None:
    """A method the HTTP/1.1 parser would accept in a request line: a token of
    upper-case characters that llhttp knows (asked once per distinct method)."""
    known = _known_methods.get(method)
    if known is None:
        known = _METHOD.match(method) is not None and _parser_knows(method)
        if len(_known_methods) < _METHODS_KEPT:
            _known_methods[method] = known
    if not known:
        raise Rejected(400, "method", "the method is not one the proxy forwards")


def check_origin_target(method: bytes, target: bytes) -> None:
    """A target in origin-form (or `*` for OPTIONS) of the characters the HTTP/1.1
    parser accepts; an HTTP/2 `:path` has no absolute-form (RFC 9113 §8.3.1)."""
    if not target or target.translate(None, _VISIBLE):
        raise Rejected(400, "target", "the target has a character a request line cannot carry")
    if target == b"*":
        request_target(method, target, None)
    elif not target.startswith(b"/"):
        raise Rejected(400, "target", "the target must be a path starting with /")


def check_authority(authority: bytes) -> None:
    """host [":" port] and nothing else: no userinfo, no spaces, no path."""
    if _AUTHORITY.match(authority) is None:
        raise Rejected(400, "host", "the authority must be a host and an optional port")


def check_fields(fields: list[tuple[bytes, bytes]]) -> None:
    """Fields the HTTP/1.1 parser would accept: token names, values without control
    characters. Each rule is about single characters, so one pass over the names
    joined (all non-empty: `h2` refuses an empty one) and one over the values check
    them all."""
    if b"".join([name for name, _ in fields]).translate(None, _TCHAR):
        raise Rejected(400, "malformed", "a field name must be a token")
    values = b"".join([value for _, value in fields])
    if len(values.translate(None, _CONTROL)) != len(values):
        raise Rejected(400, "malformed", "a field value must not carry control characters")


def too_many_fields(limit: int, *, trailers: bool) -> Rejected:
    """A head (or a chunked request's trailer section) with more than `limit` fields:
    each costs the proxy work on the way through, so their number is bounded as
    their bytes are."""
    if trailers:
        return Rejected(431, "too_many_trailers", f"more than {limit} trailer fields")
    return Rejected(431, "too_many_headers", f"more than {limit} header fields")


def parser_error_reason(exc: httptools.HttpParserError) -> str:
    """The counter label of a request httptools refused."""
    text = str(exc).lower()
    if "content-length" in text or "transfer-encoding" in text or "chunk" in text:
        return "framing"
    if isinstance(exc, httptools.HttpParserInvalidMethodError):
        return "method"
    return "malformed"
