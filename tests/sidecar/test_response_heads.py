"""Response heads as the proxy rewrites them (sidecar.proxy.headers), checked against a
plain line-by-line reference: split the fields into lines, cut each at its first colon,
compare lower-cased names."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.proxy.headers import (
    ResponseFields,
    interim_head,
    response_head,
    split_response_head,
)

# --- the reference -------------------------------------------------------------

_STANDARD_HOP = {b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
_OWS = b" \t"


def _lines(fields: bytes) -> list[tuple[bytes, bytes, bytes]]:
    """(line, lower-case name, value without surrounding whitespace) per field."""
    assert fields == b"" or fields.startswith(b"\r\n")
    out = []
    for line in fields.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        assert colon, line
        out.append((line, name.lower(), value.strip(_OWS)))
    return out


def _listed(fields: bytes) -> set[bytes]:
    """Every name some Connection field lists, lower-case."""
    tokens: set[bytes] = set()
    for _, name, value in _lines(fields):
        if name == b"connection":
            tokens |= {token.strip(_OWS).lower() for token in value.split(b",")}
    return tokens - {b""}


def ref_named(fields: bytes) -> frozenset[bytes] | None:
    extra = _listed(fields) - _STANDARD_HOP - {b"close"}
    return frozenset(extra) if extra else None


def ref_has_length(fields: bytes) -> bool:
    return any(name == b"content-length" for _, name, _ in _lines(fields))


def ref_coding(fields: bytes) -> bytes | None:
    codings = [value.lower() for _, name, value in _lines(fields) if name == b"transfer-encoding"]
    return codings[-1] if codings else None


def ref_kept(fields: bytes, *, chunked: bool) -> bytes:
    listed = _listed(fields)
    kept = []
    for line, name, _ in _lines(fields):
        if (
            name in _STANDARD_HOP
            or name.startswith(b"proxy-")
            or name == b"x-canary-variant"
            or name in listed
            or (chunked and name == b"content-length")
        ):
            continue
        kept.append(b"\r\n" + line)
    return b"".join(kept)


def ref_response_head(
    status_line: bytes,
    fields: bytes,
    *,
    variant: bytes,
    chunked: bool,
    close: bool,
    keep_alive_1_0: bool,
) -> bytes:
    head = status_line + ref_kept(fields, chunked=chunked) + b"\r\nX-Canary-Variant: " + variant
    if chunked:
        head += b"\r\nTransfer-Encoding: chunked"
    if close:
        head += b"\r\nConnection: close"
    elif keep_alive_1_0:
        head += b"\r\nConnection: keep-alive"
    return head + b"\r\n\r\n"


def rewrite(
    fields: bytes,
    *,
    status_line: bytes = b"HTTP/1.1 200 OK",
    variant: bytes = b"canary",
    chunked: bool = False,
    close: bool = False,
    keep_alive_1_0: bool = False,
) -> bytes:
    return response_head(
        status_line,
        fields,
        ResponseFields(fields),
        variant=variant,
        chunked=chunked,
        close=close,
        keep_alive_1_0=keep_alive_1_0,
    )


# A field that only the general path handles: with it, every example below runs the
# general path; without it, the fast one (unless the example has one of its own).
GENERAL = b"\r\nKeep-Alive: timeout=5"
both_paths = pytest.mark.parametrize("extra", [b"", GENERAL], ids=["fast", "general"])


# --- examples ------------------------------------------------------------------


def test_split_response_head_speaks_http_1_1() -> None:
    assert split_response_head(b"HTTP/1.0 200 OK\r\nA: b") == (b"HTTP/1.1 200 OK", b"\r\nA: b")
    assert split_response_head(b"HTTP/1.1 404 Not Here\r\nA: b\r\nC: d") == (
        b"HTTP/1.1 404 Not Here",
        b"\r\nA: b\r\nC: d",
    )
    assert split_response_head(b"HTTP/1.0 204 No Content") == (b"HTTP/1.1 204 No Content", b"")


def test_a_typical_upstream_head() -> None:
    fields = (
        b"\r\nContent-Type: application/json\r\nX-Upstream: baseline"
        b"\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive, x-upstream-hop"
        b"\r\nX-Upstream-Hop: drop me\r\nX-Canary-Variant: spoofed-by-upstream"
        b"\r\nContent-Length: 12"
    )
    assert rewrite(fields, variant=b"baseline") == (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Upstream: baseline"
        b"\r\nContent-Length: 12\r\nX-Canary-Variant: baseline\r\n\r\n"
    )
    scan = ResponseFields(fields)
    assert (scan.has_length, scan.coding, scan.named) == (
        True,
        None,
        frozenset({b"x-upstream-hop"}),
    )


@both_paths
def test_framing_and_connection_fields_the_proxy_adds(extra: bytes) -> None:
    fields = b"\r\nDate: today" + extra
    assert rewrite(fields) == b"HTTP/1.1 200 OK\r\nDate: today\r\nX-Canary-Variant: canary\r\n\r\n"
    assert rewrite(fields, chunked=True, close=True, keep_alive_1_0=True) == (
        b"HTTP/1.1 200 OK\r\nDate: today\r\nX-Canary-Variant: canary"
        b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    assert rewrite(fields, keep_alive_1_0=True) == (
        b"HTTP/1.1 200 OK\r\nDate: today\r\nX-Canary-Variant: canary"
        b"\r\nConnection: keep-alive\r\n\r\n"
    )


@both_paths
def test_every_hop_by_hop_field_goes_and_the_rest_keeps_its_spelling(extra: bytes) -> None:
    fields = (
        b"\r\nX-First: 1\r\nCONNECTION: Keep-Alive\r\nTE: trailers\r\nTrailer: X-Sum"
        b"\r\nUpgrade: h2c\r\nProxy-Authenticate: Basic\r\nPROXY-Whatever: x"
        b"\r\nx-CANARY-variant: spoofed\r\ncOnTeNt-TyPe: text/plain\r\nX-Last: 2" + extra
    )
    assert rewrite(fields) == (
        b"HTTP/1.1 200 OK\r\nX-First: 1\r\ncOnTeNt-TyPe: text/plain\r\nX-Last: 2"
        b"\r\nX-Canary-Variant: canary\r\n\r\n"
    )


@both_paths
def test_names_that_merely_begin_like_hop_by_hop_ones_pass(extra: bytes) -> None:
    fields = (
        b"\r\nTel: x\r\nContent-Lengthy: 1\r\nTEA: green\r\nTrailers: no\r\nProxy: yes"
        b"\r\nX-Proxy-Id: 3\r\nConnections: 4\r\nUpgrade-Insecure-Requests: 1"
        b"\r\nX-Canary-Variants: a, b" + extra
    )
    kept = fields.removesuffix(extra)
    assert rewrite(fields, chunked=True) == (
        b"HTTP/1.1 200 OK" + kept + b"\r\nX-Canary-Variant: canary"
        b"\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    scan = ResponseFields(fields)
    assert (scan.has_length, scan.coding, scan.named) == (False, None, None)


@both_paths
def test_names_listed_in_connection_go_whatever_their_case(extra: bytes) -> None:
    fields = (
        b"\r\nX-Foo: 1\r\nConnection: keep-alive, X-FOO ,\tx-bar\r\nx-bar: 2\r\nX-Baz: 3" + extra
    )
    assert rewrite(fields) == b"HTTP/1.1 200 OK\r\nX-Baz: 3\r\nX-Canary-Variant: canary\r\n\r\n"
    assert ResponseFields(fields).named == frozenset({b"x-foo", b"x-bar"})


def test_every_connection_field_counts() -> None:
    fields = (
        b"\r\nConnection: X-A\r\nX-A: 1\r\nX-B: 2\r\nconnection: close"
        b"\r\nCONNECTION: x-b, Keep-Alive\r\nX-C: 3"
    )
    assert rewrite(fields) == b"HTTP/1.1 200 OK\r\nX-C: 3\r\nX-Canary-Variant: canary\r\n\r\n"
    assert ResponseFields(fields).named == frozenset({b"x-a", b"x-b"})


@pytest.mark.parametrize(
    "value", [b"close", b"Keep-Alive", b"keep-alive  ", b"Upgrade", b"close, TE, Trailer", b""]
)
@both_paths
def test_plain_connection_values_name_nothing(value: bytes, extra: bytes) -> None:
    fields = b"\r\nConnection: " + value + b"\r\nX-Kept: 1" + extra
    assert ResponseFields(fields).named is None
    assert rewrite(fields) == b"HTTP/1.1 200 OK\r\nX-Kept: 1\r\nX-Canary-Variant: canary\r\n\r\n"


@pytest.mark.parametrize(
    ("fields", "coding"),
    [
        (b"\r\nTransfer-Encoding: chunked", b"chunked"),
        (b"\r\nTransfer-Encoding: gzip, chunked", b"gzip, chunked"),
        (b"\r\ntransfer-encoding:Chunked   ", b"chunked"),
        (b"\r\nTransfer-Encoding: chunked\r\nX: y\r\nTRANSFER-ENCODING: GZIP \t", b"gzip"),
        (b"\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked", b"chunked"),
        (b"\r\nX-Transfer-Encoding: gzip", None),
        (b"\r\nDate: now", None),
    ],
)
def test_coding_is_the_last_transfer_encoding(fields: bytes, coding: bytes | None) -> None:
    assert ResponseFields(fields).coding == coding
    assert ResponseFields(fields + GENERAL).coding == coding


@pytest.mark.parametrize(
    ("fields", "has_length"),
    [
        (b"\r\nContent-Length: 12", True),
        (b"\r\nX: y\r\ncontent-LENGTH:0", True),
        (b"\r\nContent-Lengthy: 1", False),
        (b"\r\nX-Content-Length: 1", False),
        (b"", False),
    ],
)
@both_paths
def test_has_length(fields: bytes, has_length: bool, extra: bytes) -> None:
    assert ResponseFields(fields + extra).has_length is has_length


def test_chunked_drops_the_upstream_length_when_transfer_encoding_came_too() -> None:
    fields = b"\r\nContent-Length: 5\r\nX: y\r\nTransfer-Encoding: gzip"
    assert rewrite(fields, chunked=True) == (
        b"HTTP/1.1 200 OK\r\nX: y\r\nX-Canary-Variant: canary\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert rewrite(fields) == (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\nX-Canary-Variant: canary\r\n\r\n"
    )


@pytest.mark.parametrize(
    "fields",
    [b"\r\nContent-Length: 5\r\nX: y", b"\r\nConnection: close\r\nContent-Length: 5\r\nX: y"],
)
def test_chunked_drops_the_upstream_length_on_the_fast_path_too(fields: bytes) -> None:
    assert rewrite(fields, chunked=True) == (
        b"HTTP/1.1 200 OK\r\nX: y\r\nX-Canary-Variant: canary\r\nTransfer-Encoding: chunked\r\n\r\n"
    )


@both_paths
def test_bytes_beyond_ascii_and_trailing_spaces_pass_untouched(extra: bytes) -> None:
    fields = (
        b"\r\nX-Name: caf\xc3\xa9 \xff\x80  \r\nConnection: x-drop, X-Also  \r\nX-Drop: \xe9"
        b'\r\nx-also: 1 \r\nContent-Disposition: a; b="\xe4"\t' + extra
    )
    assert rewrite(fields) == (
        b"HTTP/1.1 200 OK\r\nX-Name: caf\xc3\xa9 \xff\x80  "
        b'\r\nContent-Disposition: a; b="\xe4"\t\r\nX-Canary-Variant: canary\r\n\r\n'
    )
    assert ResponseFields(fields).named == frozenset({b"x-drop", b"x-also"})


@both_paths
def test_interim_head_drops_hop_by_hop_fields_only(extra: bytes) -> None:
    fields = b"\r\nLink: </a.css>; rel=preload\r\nConnection: X-Hint\r\nX-Hint: 1" + extra
    scan = ResponseFields(fields)
    assert interim_head(b"HTTP/1.1 103 Early Hints", fields, scan) == (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
    )
    assert interim_head(b"HTTP/1.1 100 Continue", b"", ResponseFields(b"")) == (
        b"HTTP/1.1 100 Continue\r\n\r\n"
    )


# --- properties ----------------------------------------------------------------

TCHAR = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
# what httptools lets through in a value: HTAB, SP, VCHAR and obs-text (0x80-0xff)
VALUE_CHARS = "\t " + "".join(map(chr, range(0x21, 0x7F))) + "".join(map(chr, range(0x80, 0x100)))

INTERESTING = [
    b"connection",
    b"content-length",
    b"keep-alive",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"proxy-authenticate",
    b"proxy-connection",
    b"proxy-",
    b"x-canary-variant",
    # near misses
    b"tel",
    b"content-lengthy",
    b"connections",
    b"x-canary-variants",
    b"upgrade-insecure-requests",
    b"proxy",
    b"x-proxy-id",
    # ordinary ones, for Connection to list
    b"content-type",
    b"x-foo",
    b"x-bar",
    b"date",
]
COMMON = [b"connection", b"content-length", b"content-type", b"x-foo", b"x-bar", b"date", b"tel"]


@st.composite
def random_case(draw: st.DrawFn, name: bytes) -> bytes:
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return bytes(
        c ^ 0x20 if flip and chr(c).isalpha() else c for c, flip in zip(name, flips, strict=True)
    )


def names(pool: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.sampled_from(pool).flatmap(random_case),
        st.text(TCHAR, min_size=1, max_size=10).map(str.encode),
    )


def latin1(alphabet: str, **kwargs: int) -> st.SearchStrategy[bytes]:
    return st.text(alphabet, **kwargs).map(lambda s: s.encode("latin-1"))


ows = st.sampled_from([b"", b" ", b"  ", b"\t", b" \t "])


@st.composite
def connection_value(draw: st.DrawFn) -> bytes:
    pool = [*INTERESTING, b"close", b"keep-alive", b"upgrade"]
    tokens = draw(st.lists(names(pool), max_size=4))
    if draw(st.booleans()):
        tokens.append(b"")  # an empty list element
    parts = [draw(ows) + token + draw(ows) for token in tokens]
    return b",".join(parts)


def value_for(lower: bytes) -> st.SearchStrategy[bytes]:
    if lower == b"connection":
        return connection_value()
    if lower == b"transfer-encoding":
        codings = [b"chunked", b"gzip, chunked", b"gzip", b"identity", b"chunked, gzip"]
        return st.tuples(st.sampled_from(codings).flatmap(random_case), ows).map(b"".join)
    if lower == b"content-length":
        return st.integers(0, 10**6).map(lambda n: str(n).encode())
    return latin1(VALUE_CHARS, max_size=12)


@st.composite
def field_lists(draw: st.DrawFn, pool: list[bytes]) -> bytes:
    lines = []
    has_length = False
    for _ in range(draw(st.integers(0, 10))):
        name = draw(names(pool))
        if name.lower() == b"content-length":
            if has_length:
                continue  # httptools refuses a second Content-Length
            has_length = True
        lines.append(b"\r\n" + name + b":" + draw(ows) + draw(value_for(name.lower())))
    return b"".join(lines)


status_lines = st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found", b"HTTP/1.1 500 "])


def check_against_reference(
    fields: bytes, status_line: bytes, variant: bytes, chunked: bool, close: bool, alive: bool
) -> None:
    scan = ResponseFields(fields)
    assert scan.has_length is ref_has_length(fields)
    assert scan.coding == ref_coding(fields)
    assert scan.named == ref_named(fields)
    expected = ref_response_head(
        status_line, fields, variant=variant, chunked=chunked, close=close, keep_alive_1_0=alive
    )
    assert (
        response_head(
            status_line,
            fields,
            scan,
            variant=variant,
            chunked=chunked,
            close=close,
            keep_alive_1_0=alive,
        )
        == expected
    )
    interim = b"HTTP/1.1 103 Early Hints"
    assert interim_head(interim, fields, scan) == (
        interim + ref_kept(fields, chunked=False) + b"\r\n\r\n"
    )


@settings(max_examples=600, deadline=None)
@given(
    # COMMON: only Connection, Content-Length and ordinary fields, mostly the fast path
    st.one_of(field_lists(INTERESTING), field_lists(COMMON)),
    status_lines,
    st.sampled_from([b"canary", b"baseline"]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_any_head_is_rewritten_as_the_reference_does(
    fields: bytes, status_line: bytes, variant: bytes, chunked: bool, close: bool, alive: bool
) -> None:
    check_against_reference(fields, status_line, variant, chunked, close, alive)
