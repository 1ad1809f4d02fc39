"""Heads between HTTP/2 and the upstreams: what a stream's request becomes upstream
(HTTP/2 or HTTP/1.1) and what a response becomes on the way to an HTTP/2 client.

Pure functions over `(name, value)` byte pairs, names lower-case as HTTP/2 has them
(the `h2` library has already refused what RFC 9113 §8.2 forbids on the way in:
upper-case names, connection-specific fields, CR, LF and NUL in values, `te` other
than `trailers`). What a stream's head becomes in an HTTP/1.1 request line is checked
here by the rules the HTTP/1.1 side applies (`conformance`): nothing the client sent
frames the message upstream, the proxy frames it from the bytes it counted
(decision 0037).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

from sidecar.proxy import conformance
from sidecar.proxy.headers import (
    DEGRADE,
    EXPERIMENT,
    HOP_BY_HOP,
    VARIANT,
    Header,
    request_head,
)

Pair = tuple[bytes, bytes]

# set by the proxy itself on the way up: what the client sent is dropped
_SET_ON_REQUEST = frozenset({b"host", b"x-forwarded-proto", VARIANT, EXPERIMENT, DEGRADE})
_FORWARDED_FOR = b"x-forwarded-for"
_CONTENT_LENGTH = b"content-length"


@dataclass(frozen=True, slots=True)
class Request:
    """A stream's request head, read once from the HEADERS the client sent."""

    method: bytes
    scheme: bytes
    authority: bytes | None
    path: bytes
    fields: tuple[Pair, ...]  # regular fields, in order; never a content-length
    # the content-length the client declared, checked against the DATA it sends; the
    # field itself is not forwarded as the client wrote it
    length: int | None = None

    def content_type(self) -> bytes | None:
        return first(self.fields, b"content-type")

    def chooser_headers(self) -> list[Header]:
        """The fields as the Chooser's HeaderView takes them (cookie crumbs are joined
        by the view, RFC 9113 §8.2.3)."""
        return [(name, name, value) for name, value in self.fields]


class BadRequest(ValueError):
    """A request head the proxy does not forward (answered 400, or 405 for CONNECT)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def read_request(headers: list[Pair]) -> Request:
    """The request head of a stream; raises BadRequest for one that is not forwarded.

    `h2` has checked the field syntax of RFC 9113 §8.2; what becomes an HTTP/1.1
    request line or field is checked here as the HTTP/1.1 side checks it, so the
    same request is refused on either protocol."""
    pseudo: dict[bytes, bytes] = {}
    fields: list[Pair] = []
    length: int | None = None
    for name, value in headers:
        if name.startswith(b":"):
            pseudo[name] = value
        elif name == _CONTENT_LENGTH:
            length = _declared_length(value, length)
        else:
            fields.append((name, value))
    method = pseudo.get(b":method", b"")
    if method == b"CONNECT" or b":protocol" in pseudo:
        raise BadRequest(405, "CONNECT is not proxied")
    path = pseudo.get(b":path", b"")
    if not method or not path:
        raise BadRequest(400, "a request needs :method and :path")
    scheme = pseudo.get(b":scheme", b"http")
    authority = pseudo.get(b":authority") or first(fields, b"host")
    try:
        conformance.check_method(method)
        conformance.check_origin_target(method, path)
        if scheme not in _SCHEMES:
            raise conformance.Rejected(400, "scheme", "the :scheme must be http or https")
        if authority is not None:
            conformance.check_authority(authority)
        conformance.check_fields(fields)
    except conformance.Rejected as exc:
        raise BadRequest(exc.status, exc.detail) from None
    return Request(method, scheme, authority, path, tuple(fields), length)


_SCHEMES = frozenset({b"http", b"https"})


def _declared_length(value: bytes, before: int | None) -> int:
    """A content-length field's value; `h2` has refused non-digits and conflicting
    repeats, which are checked again here because the framing depends on them."""
    if not value.isdigit() or len(value) > 18:
        raise BadRequest(400, "the content-length must be a decimal number")
    length = int(value)
    if before is not None and before != length:
        raise BadRequest(400, "conflicting content-length fields")
    return length


def first(fields: tuple[Pair, ...] | list[Pair], name: bytes) -> bytes | None:
    return next((value for low, value in fields if low == name), None)


@dataclass(frozen=True, slots=True)
class Forwarding:
    """What a request carries to any upstream beside its own fields."""

    host: bytes  # :authority (HTTP/2) or Host (HTTP/1.1) upstream
    scheme: bytes  # the upstream's: http or https
    base_path: bytes
    client_ip: bytes
    proto: bytes  # X-Forwarded-Proto: the scheme the client used
    variant: bytes
    experiment: bytes | None
    degrade: bool = False  # heavy overload: ask the upstream to degrade (sidecar.overload)

    def target(self, path: bytes) -> bytes:
        return self.base_path + path if self.base_path and path != b"*" else path


def h2_request(request: Request, fwd: Forwarding) -> list[Pair]:
    """The HEADERS sent to an HTTP/2 upstream."""
    out: list[Pair] = [
        (b":method", request.method),
        (b":scheme", fwd.scheme),
        (b":authority", fwd.host),
        (b":path", fwd.target(request.path)),
    ]
    if request.length is not None:  # checked against the DATA before the stream ends
        out.append((_CONTENT_LENGTH, b"%d" % request.length))
    forwarded_for: bytes | None = None
    for name, value in request.fields:
        if name == _FORWARDED_FOR:
            forwarded_for = value if forwarded_for is None else forwarded_for + b", " + value
        elif name not in _SET_ON_REQUEST and not name.startswith(b"proxy-"):
            out.append((name, value))
    client = fwd.client_ip
    out.append(
        (_FORWARDED_FOR, client if forwarded_for is None else forwarded_for + b", " + client)
    )
    out.append((b"x-forwarded-proto", fwd.proto))
    out.append((VARIANT, fwd.variant))
    if fwd.experiment is not None:
        out.append((EXPERIMENT, fwd.experiment))
    if fwd.degrade:
        out.append((DEGRADE, b"1"))
    return out


def h1_request(
    request: Request, fwd: Forwarding, *, chunked: bool, length: int | None
) -> bytes:
    """The HTTP/1.1 head sent to an HTTP/1.1 upstream. Its framing is the proxy's,
    never the client's: a chunked body, or `length` (the size of a body the proxy
    holds whole), or none (no content)."""
    fields = [(name, value) for name, value in request.fields if name != b"cookie"]
    cookies = [value for name, value in request.fields if name == b"cookie"]
    if cookies:
        fields.append((b"cookie", b"; ".join(cookies)))
    if length is not None and not chunked:
        fields.append((_CONTENT_LENGTH, b"%d" % length))
    head = request_head(
        request.method,
        fwd.target(request.path),
        [(name, name, value) for name, value in fields],
        host=fwd.host,
        client_ip=fwd.client_ip,
        proto=fwd.proto,
        variant=fwd.variant,
        experiment=fwd.experiment,
        chunked=chunked,
        named=None,
    )
    if fwd.degrade:
        head = head[:-2] + b"X-Canary-Degrade: 1\r\n\r\n"
    return head


def h2_response(status: int, fields: list[Pair], variant: bytes) -> list[Pair]:
    """The HEADERS of a response to an HTTP/2 client: the upstream's fields with the
    variant tag set by the proxy."""
    out: list[Pair] = [(b":status", str(status).encode())]
    out += [(name, value) for name, value in fields if name != VARIANT]
    if variant:  # none for the proxy's own answers before a variant was chosen
        out.append((VARIANT, variant))
    return out


_DROPPED_FROM_H1 = HOP_BY_HOP | {VARIANT}


def h1_response_fields(
    fields: bytes, named: frozenset[bytes] | None, *, keep_length: bool
) -> list[Pair]:
    """An HTTP/1.1 response's fields (`\\r\\nName: value` each, checked by httptools)
    as HTTP/2 fields: names lower-case, hop-by-hop ones (and those the Connection
    field names) dropped, Content-Length only when it frames the body."""
    out: list[Pair] = []
    for line in fields.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        low = name.strip().lower()
        if (
            low in _DROPPED_FROM_H1
            or low.startswith(b"proxy-")
            or (named is not None and low in named)
            or (low == _CONTENT_LENGTH and not keep_length)
        ):
            continue
        out.append((low, value.strip(b" \t")))
    return out


_TE = b"te"
_TRAILERS = b"trailers"


def request_from_h1(
    method: bytes,
    target: bytes,
    headers: list[Header],
    *,
    named: frozenset[bytes] | None,
    chunked: bool,
) -> Request:
    """An HTTP/1.1 request head as a stream's request (RFC 9113 §8.2.2): hop-by-hop
    fields and those Connection names dropped, TE kept only as `trailers` (gRPC
    asks for it); Content-Length is the length the HTTP/1.1 parser framed the body
    by (none for a chunked body); Host becomes the :authority."""
    fields: list[Pair] = []
    host: bytes | None = None
    length: int | None = None
    for lower, _, value in headers:
        if lower == b"host":
            host = value
        elif lower == _CONTENT_LENGTH:
            if not chunked:  # one decimal value: httptools refused anything else
                length = int(value)
        elif lower == _TE:
            if _TRAILERS in (token.strip().lower() for token in value.split(b",")):
                fields.append((_TE, _TRAILERS))
        elif lower in HOP_BY_HOP or (named is not None and lower in named):
            continue
        else:
            fields.append((lower, value))
    return Request(method, b"http", host, target, tuple(fields), length)


def h1_status_line(status: int) -> bytes:
    """The HTTP/1.1 status line of an HTTP/2 response (HTTP/2 carries no reason)."""
    try:
        reason = HTTPStatus(status).phrase.encode()
    except ValueError:
        reason = b""
    return b"HTTP/1.1 %d %s" % (status, reason)


def h1_fields(fields: list[Pair]) -> bytes:
    """HTTP/2 fields (checked by `h2` on the way in) as HTTP/1.1 field lines, each
    `\r\nname: value`, the form `headers.ResponseFields` reads."""
    return b"".join([b"\r\n%s: %s" % pair for pair in fields])


def trailer_section(trailers: list[Pair]) -> bytes:
    """Trailers as the field lines of a chunked message's trailer section."""
    return b"".join([b"%s: %s\r\n" % pair for pair in trailers])
