"""Request and response heads as the proxy rewrites them.

Request headers travel as `(lower_name, raw_name, value)` byte triples: the lower-case
name is computed once in the parser callback and serves every lookup; the raw name
keeps the sender's spelling on the way out. The per-header decision is one dictionary
lookup (see `_action`). Response heads are rewritten whole, as bytes (see below).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final, cast

Header = tuple[bytes, bytes, bytes]

# RFC 9110 §7.6.1: meaningful for one connection only; "proxy-*" is handled apart.
HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
VARIANT: Final = b"x-canary-variant"
EXPERIMENT: Final = b"x-canary-experiment"
DEGRADE: Final = b"x-canary-degrade"  # sent upstream under heavy overload (sidecar.overload)
# set by the proxy itself: any value the client sent is replaced, never trusted
_SET_ON_REQUEST: Final = frozenset({b"host", b"x-forwarded-proto", VARIANT, EXPERIMENT, DEGRADE})

_KEEP: Final = 0
_DROP: Final = 1
_FORWARDED_FOR: Final = 2
_LENGTH: Final = 3
_CACHE_LIMIT: Final = 4096  # distinct header names remembered; unusual names beyond are computed
_request_actions: Final[dict[bytes, int]] = {}


def _action(lower: bytes) -> int:
    if lower in HOP_BY_HOP or lower.startswith(b"proxy-") or lower in _SET_ON_REQUEST:
        action = _DROP
    elif lower == b"x-forwarded-for":
        action = _FORWARDED_FOR
    elif lower == b"content-length":
        action = _LENGTH
    else:
        action = _KEEP
    if len(_request_actions) < _CACHE_LIMIT:
        _request_actions[lower] = action
    return action


# `upgrade` is not among them: a request asking to upgrade takes the slower path
PLAIN_CONNECTION: Final = frozenset({b"keep-alive", b"Keep-Alive", b"close", b"Close"})


def connection_options(value: bytes) -> frozenset[bytes] | None:
    """Header names a `Connection` value lists beyond the standard hop-by-hop ones
    (they are hop-by-hop too), or None for the usual `keep-alive` / `close`."""
    if value in PLAIN_CONNECTION:
        return None
    tokens = {t.strip().lower() for t in value.split(b",")} - HOP_BY_HOP - {b"", b"close"}
    return frozenset(tokens) if tokens else None


class HeaderView(Mapping[str, str]):
    """The header mapping a Chooser sees: lower-case names, the first of duplicates,
    except cookies, which are joined with "; " as one Cookie header would be.

    A chooser looks at one to three names per request, so `get` scans the request's
    headers for the one asked for instead of decoding them all into a dict."""

    __slots__ = ("_headers", "_view")

    def __init__(self, headers: list[Header]) -> None:
        self._headers = headers
        self._view: dict[str, str] | None = None

    def get(self, key: str, default: Any = None) -> Any:
        view = self._view
        if view is not None:
            return view.get(key, default)
        try:
            wanted = key.encode("latin-1")
        except UnicodeEncodeError:
            return default
        found: bytes | None = None
        for lower, _, value in self._headers:
            if lower == wanted:
                if found is None:
                    found = value
                    if wanted != b"cookie":
                        break
                else:
                    found += b"; " + value
        return default if found is None else found.decode("latin-1")

    def __getitem__(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return cast(str, value)

    def _all(self) -> dict[str, str]:
        view = self._view
        if view is None:
            view = self._view = {}
            for lower, _, value in self._headers:
                name = lower.decode("latin-1")
                if name in view:
                    if name == "cookie":
                        view[name] = view[name] + "; " + value.decode("latin-1")
                    continue
                view[name] = value.decode("latin-1")
        return view

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def request_head(
    method: bytes,
    target: bytes,
    headers: list[Header],
    *,
    host: bytes,
    client_ip: bytes,
    proto: bytes,
    variant: bytes,
    experiment: bytes | None,
    chunked: bool,
    named: frozenset[bytes] | None,
    tail: bytes | None = None,
) -> bytes:
    """The head sent upstream: hop-by-hop headers (and those `named` in Connection)
    dropped, X-Forwarded-For appended, X-Forwarded-Proto and the canary tags set.
    `tail`: `request_tail` of the same address and choice, if the caller kept it."""
    out = [method, b" ", target, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
    forwarded_for: bytes | None = None
    actions = _request_actions
    for lower, raw, value in headers:
        action = actions.get(lower)
        if action is None:
            action = _action(lower)
        if action:
            if action == _FORWARDED_FOR:
                forwarded_for = value if forwarded_for is None else forwarded_for + b", " + value
                continue
            if action == _DROP or chunked:  # RFC 9112 §6.3: chunked wins over a length
                continue
        if named is not None and lower in named:
            continue
        out += (raw, b": ", value, b"\r\n")
    if forwarded_for is None and not chunked:
        out.append(
            tail if tail is not None else _tail(client_ip, proto, variant, experiment, False)
        )
        return b"".join(out)
    forwarded_for = client_ip if forwarded_for is None else forwarded_for + b", " + client_ip
    out.append(_tail(forwarded_for, proto, variant, experiment, chunked))
    return b"".join(out)


def _tail(
    forwarded_for: bytes, proto: bytes, variant: bytes, experiment: bytes | None, chunked: bool
) -> bytes:
    """The fields the proxy adds, and the end of the head."""
    out = [b"X-Forwarded-For: ", forwarded_for, b"\r\nX-Forwarded-Proto: ", proto]
    out += (b"\r\nX-Canary-Variant: ", variant, b"\r\n")
    if experiment is not None:
        out += (b"X-Canary-Experiment: ", experiment, b"\r\n")
    out.append(b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"\r\n")
    return b"".join(out)


def request_tail(client_ip: bytes, proto: bytes, variant: bytes, experiment: bytes | None) -> bytes:
    """The usual end of a head sent upstream (the client sent no X-Forwarded-For, no
    chunked body): the fields the proxy adds and the blank line. It depends only on
    the client's address and the choice, so a connection keeps it from one request
    to the next (`ClientConnection.tags`) instead of joining a dozen parts each time."""
    return _tail(client_ip, proto, variant, experiment, False)


# --- response heads ------------------------------------------------------------
#
# A response head reaches these functions as the upstream sent it, already checked by
# httptools: CRLF line ends, no obs-fold, no space before a colon, one Content-Length.
# So one regular expression over the whole head finds the few fields the proxy reads or
# drops, and everything else passes as it came, without a Python step per field.
# `fields` is the head after its status line and before the blank line that ends it:
# "\r\nName: value" per field.

# Matched against the lower-cased fields, so no IGNORECASE (several times slower);
# bytes.lower() changes ASCII letters only, so positions stay those of the original.
_RESPONSE_FIELD: Final = re.compile(
    rb"\r\n(connection|content-length|keep-alive|proxy-[^:]*|te|trailer"
    rb"|transfer-encoding|upgrade|x-canary-variant):[ \t]*([^\r]*)"
)
# The fields a typical response does not carry (Transfer-Encoding included: its
# framing needs the full reading). Without any of them, which one search tells, only
# Connection and Content-Length matter, and bytes.find finds them faster than a loop
# over regex matches would.
_RESPONSE_RARE: Final = re.compile(
    rb"\r\n(?:keep-alive|proxy-[^:]*|te|trailer|transfer-encoding|upgrade|x-canary-variant):"
)
_CONNECTION: Final = b"\r\nconnection:"


class ResponseFields:
    """What the proxy reads from a response head's fields."""

    __slots__ = ("coding", "drop", "has_length", "length_span", "named", "rewrites")

    def __init__(self, fields: bytes) -> None:
        self.coding: bytes | None = None  # the last Transfer-Encoding value, lower-case
        # the head as sent to a keep-alive HTTP/1.1 client, per variant: kept when the
        # head is shared by many responses (head_cache.HeadCache), else None
        self.rewrites: dict[bytes, bytes] | None = None
        self.named: frozenset[bytes] | None = None  # extra names Connection lists
        # Content-Length's span: found by the general path; the fast path leaves it
        # to `length_field`, needed only when the proxy re-frames a body
        self.length_span: tuple[int, int] | None = None
        low = fields.lower()
        if _RESPONSE_RARE.search(low) is None:
            start = low.find(_CONNECTION)
            if start < 0:
                self.drop: list[tuple[int, int]] = []  # spans of the hop-by-hop fields
                self.has_length = low.find(b"\r\ncontent-length:") >= 0
                return
            end = low.find(b"\r", start + 2)
            if end < 0:
                end = len(low)
            if low.find(_CONNECTION, end) < 0:  # one Connection field, the usual case
                self.drop = [(start, end)]
                self.named = connection_options(low[start + 13 : end].strip())
                self.has_length = low.find(b"\r\ncontent-length:") >= 0
                return
        self._all(low)

    def length_field(self, fields: bytes) -> tuple[int, int] | None:
        """The span of the Content-Length field in `fields` (the ones scanned)."""
        if self.length_span is None and self.has_length:
            low = fields.lower()
            start = low.find(b"\r\ncontent-length:")
            end = low.find(b"\r", start + 2)
            self.length_span = (start, len(low) if end < 0 else end)
        return self.length_span

    def _all(self, low: bytes) -> None:
        """Every field the proxy reads or drops, in order (the general case)."""
        self.has_length = False
        self.drop = []
        for match in _RESPONSE_FIELD.finditer(low):
            name = match.group(1)
            if name == b"content-length":
                self.has_length = True
                self.length_span = match.span()
                continue
            self.drop.append(match.span())
            if name == b"transfer-encoding":
                self.coding = match.group(2).rstrip()
            elif name == b"connection":
                options = connection_options(match.group(2).rstrip())
                if options is not None:
                    named = self.named
                    self.named = options if named is None else named | options


def split_response_head(head: bytes) -> tuple[bytes, bytes]:
    """(status line as HTTP/1.1, fields) of a head without its final blank line."""
    line_end = head.find(b"\r\n")
    if line_end < 0:
        line_end = len(head)
    line = head[:line_end]
    if not line.startswith(b"HTTP/1.1 "):
        line = b"HTTP/1.1" + line[8:]  # the proxy speaks HTTP/1.1 to its clients
    return line, head[line_end:]


def _cut(fields: bytes, spans: list[tuple[int, int]]) -> bytes:
    if not spans:
        return fields
    parts = []
    at = 0
    for start, end in spans:
        parts.append(fields[at:start])
        at = end
    parts.append(fields[at:])
    return b"".join(parts)


def _without_named(fields: bytes, named: frozenset[bytes]) -> bytes:
    kept = [
        line for line in fields.split(b"\r\n")[1:] if line.partition(b":")[0].lower() not in named
    ]
    return b"".join([b"\r\n" + line for line in kept])


def response_head(
    status_line: bytes,
    fields: bytes,
    scan: ResponseFields,
    *,
    variant: bytes,
    chunked: bool,
    close: bool,
    keep_alive_1_0: bool,
) -> bytes:
    """The head sent to the client: hop-by-hop fields (and those Connection names)
    dropped, X-Canary-Variant set, framing and connection handling chosen by the
    caller (`chunked`: the proxy re-frames the body, so the upstream's length goes)."""
    rewrites = scan.rewrites
    if rewrites is not None and not (chunked or close or keep_alive_1_0):
        head = rewrites.get(variant)
        if head is None:
            head = _rewrite(status_line, fields, scan, variant, False, False, False)
            if len(rewrites) < _REWRITES_KEPT:
                rewrites[variant] = head
        return head
    return _rewrite(status_line, fields, scan, variant, chunked, close, keep_alive_1_0)


# rewrites kept per shared head: one per variant of a route is what is expected
_REWRITES_KEPT: Final = 16


def _rewrite(
    status_line: bytes,
    fields: bytes,
    scan: ResponseFields,
    variant: bytes,
    chunked: bool,
    close: bool,
    keep_alive_1_0: bool,
) -> bytes:
    drop = scan.drop
    if chunked:
        length = scan.length_field(fields)
        if length is not None:
            drop = sorted([*drop, length])
    fields = _cut(fields, drop)
    if scan.named is not None:
        fields = _without_named(fields, scan.named)
    out = [status_line, fields, b"\r\nX-Canary-Variant: ", variant]
    if chunked:
        out.append(b"\r\nTransfer-Encoding: chunked")
    if close:
        out.append(b"\r\nConnection: close")
    elif keep_alive_1_0:
        out.append(b"\r\nConnection: keep-alive")
    out.append(b"\r\n\r\n")
    return b"".join(out)


def switching_head(
    status_line: bytes, fields: bytes, scan: ResponseFields, *, upgrade: bytes, variant: bytes
) -> bytes:
    """A 101 sent to the client: the upstream's fields minus hop-by-hop and framing
    ones, then the upgrade it accepted and X-Canary-Variant."""
    drop = scan.drop
    length = scan.length_field(fields)
    if length is not None:
        drop = sorted([*drop, length])
    fields = _cut(fields, drop)
    if scan.named is not None:
        fields = _without_named(fields, scan.named)
    return b"".join(
        [
            status_line,
            fields,
            b"\r\nConnection: upgrade\r\nUpgrade: ",
            upgrade,
            b"\r\nX-Canary-Variant: ",
            variant,
            b"\r\n\r\n",
        ]
    )


def interim_head(status_line: bytes, fields: bytes, scan: ResponseFields) -> bytes:
    """A 1xx response (e.g. 100 Continue) relayed as it came, minus hop-by-hop fields."""
    fields = _cut(fields, scan.drop)
    if scan.named is not None:
        fields = _without_named(fields, scan.named)
    return b"".join([status_line, fields, b"\r\n\r\n"])
