"""Response heads parsed once per distinct head (sidecar.proxy.head_cache): a cached
head and its rewrites are exactly what parsing it afresh gives, and the cache stays
bounded whatever the upstream sends."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.proxy.head_cache import MAX_CACHED_HEAD, HeadCache
from sidecar.proxy.headers import ResponseFields, response_head, split_response_head

HEAD = (
    b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Wed, 02 Dec 2026 08:00:00 GMT"
    b"\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: keep-alive, x-hop"
)


def fresh(head: bytes, variant: bytes, flags: tuple[bool, bool, bool]) -> bytes:
    status_line, fields = split_response_head(head)
    chunked, close, keep_alive_1_0 = flags
    return response_head(
        status_line,
        fields,
        ResponseFields(fields),
        variant=variant,
        chunked=chunked,
        close=close,
        keep_alive_1_0=keep_alive_1_0,
    )


def cached(cache: HeadCache, head: bytes, variant: bytes, flags: tuple[bool, bool, bool]) -> bytes:
    status_line, fields, scan = cache.parse(head)
    chunked, close, keep_alive_1_0 = flags
    return response_head(
        status_line,
        fields,
        scan,
        variant=variant,
        chunked=chunked,
        close=close,
        keep_alive_1_0=keep_alive_1_0,
    )


FLAGS = list(itertools.product([False, True], repeat=3))


def test_a_repeated_head_is_parsed_once() -> None:
    cache = HeadCache()
    first = cache.parse(HEAD)
    again = cache.parse(bytes(bytearray(HEAD)))  # equal bytes, another object
    # the same scan, not a new one (compiled, the tuple around it is built per call)
    assert again[2] is first[2] and again == first
    assert len(cache) == 1


def test_rewrites_of_a_cached_head_equal_fresh_ones_for_every_variant_and_framing() -> None:
    cache = HeadCache()
    for _ in range(2):  # the second pass reads the kept rewrites
        for variant in (b"baseline", b"canary"):
            for flags in FLAGS:
                assert cached(cache, HEAD, variant, flags) == fresh(HEAD, variant, flags)
    _, _, scan = cache.parse(HEAD)
    # only the keep-alive HTTP/1.1 form is kept, once per variant
    assert scan.rewrites is not None and set(scan.rewrites) == {b"baseline", b"canary"}


def test_a_head_parsed_without_the_cache_keeps_no_rewrites() -> None:
    status_line, fields = split_response_head(HEAD)
    scan = ResponseFields(fields)
    response_head(
        status_line, fields, scan, variant=b"v", chunked=False, close=False, keep_alive_1_0=False
    )
    assert scan.rewrites is None


def test_long_heads_are_parsed_but_not_kept() -> None:
    cache = HeadCache()
    long_head = HEAD + b"\r\nX-Pad: " + b"a" * MAX_CACHED_HEAD
    first = cache.parse(long_head)
    assert cache.parse(long_head) is not first
    assert len(cache) == 0
    assert first[2].rewrites is None


def test_the_cache_starts_afresh_at_its_limit() -> None:
    cache = HeadCache(limit=4)
    for n in range(10):
        cache.parse(HEAD + b"\r\nX-N: %d" % n)
        assert 1 <= len(cache) <= 4
    assert len(cache) == 2  # 8 and 9: cleared when the ninth head came


def test_rewrites_kept_per_head_are_bounded() -> None:
    cache = HeadCache()
    for n in range(100):
        variant = b"v%d" % n
        assert cached(cache, HEAD, variant, FLAGS[0]) == fresh(HEAD, variant, FLAGS[0])
    _, _, scan = cache.parse(HEAD)
    assert scan.rewrites is not None and len(scan.rewrites) == 16


_name = st.sampled_from(
    [b"Connection", b"Content-Length", b"Transfer-Encoding", b"Keep-Alive", b"X-A", b"Te"]
)
_value = st.sampled_from([b"keep-alive", b"close", b"x-a", b"chunked", b"5", b"a, te"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_name, _value), max_size=6), st.sampled_from(FLAGS))
def test_any_head_rewritten_from_the_cache_equals_a_fresh_rewrite(
    fields: list[tuple[bytes, bytes]], flags: tuple[bool, bool, bool]
) -> None:
    head = b"HTTP/1.1 200 OK" + b"".join(b"\r\n%s: %s" % field for field in fields)
    cache = HeadCache()
    for _ in range(2):
        assert cached(cache, head, b"canary", flags) == fresh(head, b"canary", flags)
