"""Request and response heads as the proxy rewrites them.

Headers travel as `(lower_name, raw_name, value)` byte triples: the lower-case name
is computed once in the parser callback and serves every lookup; the raw name keeps
the sender's spelling on the way out. These functions run for every request, so the
per-header decision is one dictionary lookup (see `_action`).
"""

from __future__ import annotations

from collections.abc import Iterable

Header = tuple[bytes, bytes, bytes]

# RFC 9110 §7.6.1: meaningful for one connection only; "proxy-*" is handled apart.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
VARIANT = b"x-canary-variant"
EXPERIMENT = b"x-canary-experiment"
# set by the proxy itself: any value the client sent is replaced, never trusted
_SET_ON_REQUEST = frozenset({b"host", b"x-forwarded-proto", VARIANT, EXPERIMENT})
_SET_ON_RESPONSE = frozenset({VARIANT})

_KEEP, _DROP, _FORWARDED_FOR, _LENGTH = 0, 1, 2, 3
_CACHE_LIMIT = 4096  # distinct header names remembered; unusual names beyond are computed
_request_actions: dict[bytes, int] = {}
_response_actions: dict[bytes, int] = {}


def _action(lower: bytes, *, request: bool) -> int:
    if (
        lower in HOP_BY_HOP
        or lower.startswith(b"proxy-")
        or lower in (_SET_ON_REQUEST if request else _SET_ON_RESPONSE)
    ):
        action = _DROP
    elif request and lower == b"x-forwarded-for":
        action = _FORWARDED_FOR
    elif lower == b"content-length":
        action = _LENGTH
    else:
        action = _KEEP
    cache = _request_actions if request else _response_actions
    if len(cache) < _CACHE_LIMIT:
        cache[lower] = action
    return action


_PLAIN_CONNECTION = frozenset({b"keep-alive", b"Keep-Alive", b"close", b"Close", b"upgrade"})


def connection_options(value: bytes) -> frozenset[bytes] | None:
    """Header names a `Connection` value lists beyond the standard hop-by-hop ones
    (they are hop-by-hop too), or None for the usual `keep-alive` / `close`."""
    if value in _PLAIN_CONNECTION:
        return None
    tokens = {t.strip().lower() for t in value.split(b",")} - HOP_BY_HOP - {b"", b"close"}
    return frozenset(tokens) if tokens else None


def connection_tokens(headers: Iterable[Header]) -> frozenset[bytes]:
    """Every extra header name listed in `Connection` headers, lower-case."""
    named: set[bytes] = set()
    for lower, _, value in headers:
        if lower == b"connection":
            named |= connection_options(value) or frozenset()
    return frozenset(named)


def chooser_view(headers: Iterable[Header]) -> dict[str, str]:
    """The header mapping a Chooser sees: lower-case names, the first of duplicates,
    except cookies, which are joined with "; " as one Cookie header would be."""
    view: dict[str, str] = {}
    for lower, _, value in headers:
        name = lower.decode("latin-1")
        if name in view:
            if name == "cookie":
                view[name] = view[name] + "; " + value.decode("latin-1")
            continue
        view[name] = value.decode("latin-1")
    return view


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
) -> bytes:
    """The head sent upstream: hop-by-hop headers (and those `named` in Connection)
    dropped, X-Forwarded-For appended, X-Forwarded-Proto and the canary tags set."""
    out = [method, b" ", target, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
    forwarded_for: bytes | None = None
    actions = _request_actions
    for lower, raw, value in headers:
        action = actions.get(lower)
        if action is None:
            action = _action(lower, request=True)
        if action:
            if action == _FORWARDED_FOR:
                forwarded_for = value if forwarded_for is None else forwarded_for + b", " + value
                continue
            if action == _DROP or chunked:  # RFC 9112 §6.3: chunked wins over a length
                continue
        if named is not None and lower in named:
            continue
        out += (raw, b": ", value, b"\r\n")
    forwarded_for = client_ip if forwarded_for is None else forwarded_for + b", " + client_ip
    out += (b"X-Forwarded-For: ", forwarded_for, b"\r\nX-Forwarded-Proto: ", proto)
    out += (b"\r\nX-Canary-Variant: ", variant, b"\r\n")
    if experiment is not None:
        out += (b"X-Canary-Experiment: ", experiment, b"\r\n")
    out.append(b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"\r\n")
    return b"".join(out)


_status_lines: dict[tuple[int, bytes], bytes] = {}


def _status_line(status: int, reason: bytes) -> bytes:
    key = (status, reason)
    line = _status_lines.get(key)
    if line is None:
        line = b"HTTP/1.1 %d %s\r\n" % (status, reason)
        if len(_status_lines) < _CACHE_LIMIT:
            _status_lines[key] = line
    return line


def response_head(
    status: int,
    reason: bytes,
    headers: list[Header],
    *,
    variant: bytes,
    chunked: bool,
    close: bool,
    keep_alive_1_0: bool,
    named: frozenset[bytes] | None,
) -> bytes:
    """The head sent to the client: hop-by-hop headers dropped, X-Canary-Variant set,
    framing and connection handling chosen by the caller."""
    out = [_status_line(status, reason)]
    actions = _response_actions
    for lower, raw, value in headers:
        action = actions.get(lower)
        if action is None:
            action = _action(lower, request=False)
        if action and (action == _DROP or chunked):
            continue
        if named is not None and lower in named:
            continue
        out += (raw, b": ", value, b"\r\n")
    out += (b"X-Canary-Variant: ", variant, b"\r\n")
    if chunked:
        out.append(b"Transfer-Encoding: chunked\r\n")
    if close:
        out.append(b"Connection: close\r\n")
    elif keep_alive_1_0:
        out.append(b"Connection: keep-alive\r\n")
    out.append(b"\r\n")
    return b"".join(out)


def interim_head(status: int, reason: bytes, headers: list[Header]) -> bytes:
    """A 1xx response (e.g. 100 Continue) relayed as it came, minus hop-by-hop headers."""
    named = connection_tokens(headers)
    out = [_status_line(status, reason)]
    for lower, raw, value in headers:
        if lower in HOP_BY_HOP or lower.startswith(b"proxy-") or lower in named:
            continue
        out += (raw, b": ", value, b"\r\n")
    out.append(b"\r\n")
    return b"".join(out)
