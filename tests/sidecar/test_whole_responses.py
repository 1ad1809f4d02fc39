"""Responses taken whole, without the parser (HeadCache.learn_whole and
UpstreamConnection._take_whole): a read holding exactly a head the parser has seen
complete a response before, and as many body bytes, is that response again.

Driven in-process, as the event loop would drive the proxy (no sockets), so that each
read is exactly the bytes a test chooses. Every case compares the client-visible bytes,
the samples and the upstream connection's fate with a proxy whose head cache keeps
nothing (`HeadCache(0)`), where every response goes through the parser."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.benchmarks.sidecar_python import NullTransport
from sidecar.choice import Choice, Upstream
from sidecar.proxy import ProxyServer
from sidecar.proxy.client import ClientConnection
from sidecar.proxy.head_cache import HeadCache
from sidecar.proxy.upstream import UpstreamConnection, UpstreamPool

GET = b"GET /a HTTP/1.1\r\nHost: svc\r\n\r\n"
HEAD_REQUEST = b"HEAD /a HTTP/1.1\r\nHost: svc\r\n\r\n"
KEEP = b"HTTP/1.1 200 OK\r\nServer: up\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\n"
CLOSE = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\n"
EMPTY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
ERROR = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\n"
BODIES = {KEEP: b"ok\n", CLOSE: b"bye", EMPTY: b"", ERROR: b"busy"}
# an interim head as long as KEEP: a 103 must never be learnt as a final response
_HINT = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload; x="
INTERIM = _HINT + b"y" * (len(KEEP) - len(_HINT) - 4) + b"\r\n\r\n"
assert len(INTERIM) == len(KEEP)


class _Transport(NullTransport):
    """Keeps what is written, and whether it was closed."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def writelines(self, parts: Sequence[bytes]) -> None:
        for part in parts:
            self.out += part

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _Recorder:
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, int]] = []

    def record(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the proxy records in bulk")

    def record_many(self, samples: Sequence[Any]) -> None:
        self.outcomes += [(s[2], s[4]) for s in samples]


class _Proxy:
    """One client connection and one pooled upstream connection, driven by hand."""

    def __init__(self, *, cache: bool) -> None:
        upstream = Upstream.parse("http://127.0.0.1:9")
        choice = Choice(experiment="exp", variant="canary", upstream=upstream, unit_hash=7)

        class Fixed:
            def choose(self, headers: Any) -> Choice:
                return choice

        self.recorder = _Recorder()
        self.server = ProxyServer(Fixed(), self.recorder)
        self.server._loop = asyncio.get_running_loop()
        self.pool: UpstreamPool = self.server.pool_for(upstream)
        if not cache:
            self.pool.heads = HeadCache(0)
        self.client_transport = _Transport()
        self.client = ClientConnection(self.server)
        self.client.connection_made(self.client_transport)  # type: ignore[arg-type]
        self.upstream_transport = _Transport()
        conn = UpstreamConnection(self.pool)
        conn.connection_made(self.upstream_transport)  # type: ignore[arg-type]
        self.pool.release(conn)

    def exchange(self, request: bytes, reads: Sequence[bytes]) -> None:
        """One request, answered by the upstream in `reads`."""
        self.client.data_received(request)
        current = self.client.current
        conn = None if current is None else current.upstream
        if conn is None or conn.closed:
            return
        for data in reads:
            if conn.closed:
                break
            conn.data_received(data)

    def seen(self) -> tuple[bytes, list[tuple[str, int]], bool, int]:
        self.server.flush_samples()
        return (
            bytes(self.client_transport.out),
            self.recorder.outcomes,
            self.upstream_transport.closed,
            self.pool.heads.whole_hits,
        )


async def _both(steps: Sequence[tuple[bytes, Sequence[bytes]]]) -> tuple[Any, Any]:
    cached, plain = _Proxy(cache=True), _Proxy(cache=False)
    for request, reads in steps:
        cached.exchange(request, reads)
        plain.exchange(request, reads)
    return cached.seen(), plain.seen()


async def test_a_repeated_response_is_taken_whole_with_the_same_result() -> None:
    steps = [(GET, [KEEP + b"ok\n"])] * 4
    cached, plain = await _both(steps)
    # the first is parsed, the second (a head seen before) teaches the cache, the
    # next two are taken whole
    assert cached[3] == 2
    assert cached[:3] == plain[:3]
    assert cached[0].count(b"HTTP/1.1 200 OK") == 4
    assert cached[1] == [("canary", 200)] * 4


async def test_bytes_after_the_response_are_never_taken_whole() -> None:
    # the same head and body, then bytes no request asked for: the parser decides
    steps = [(GET, [KEEP + b"ok\n"]), (GET, [KEEP + b"ok\nHTTP/1.1 200 OK\r\n"])]
    cached, plain = await _both(steps)
    assert cached[3] == 0
    assert cached[:3] == plain[:3]


async def test_a_response_in_two_reads_or_to_a_head_request_goes_through_the_parser() -> None:
    steps = [
        (GET, [KEEP + b"ok\n"]),
        (GET, [KEEP + b"ok\n"]),
        (GET, [KEEP, b"ok\n"]),  # the body in a later read
        (GET, [KEEP[:20], KEEP[20:] + b"ok\n"]),  # the head in two reads
        (HEAD_REQUEST, [KEEP]),  # a head that frames no body here
        (GET, [KEEP + b"ok\n"]),
    ]
    cached, plain = await _both(steps)
    assert cached[3] == 1  # only the last
    assert cached[:3] == plain[:3]


async def test_a_response_that_closes_the_connection_closes_it_when_taken_whole() -> None:
    cached = _Proxy(cache=True)
    cached.exchange(GET, [CLOSE + b"bye"])  # parsed; the connection closes
    assert cached.upstream_transport.closed
    # new connections to the same pool meet the same response: learnt, then taken whole
    transports = [_Transport(), _Transport()]
    for transport in transports:
        conn = UpstreamConnection(cached.pool)
        conn.connection_made(transport)  # type: ignore[arg-type]
        cached.pool.release(conn)
        cached.exchange(GET, [CLOSE + b"bye"])
        assert transport.closed
    assert cached.pool.heads.whole_hits == 1
    assert cached.seen()[1] == [("canary", 200)] * 3


_responses = st.sampled_from([KEEP, KEEP, KEEP, EMPTY, ERROR, CLOSE])  # mostly kept alive


@st.composite
def _step(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    head = draw(_responses)
    request = draw(st.sampled_from([GET, GET, GET, HEAD_REQUEST]))
    message = head if request == HEAD_REQUEST else head + BODIES[head]
    message += draw(st.sampled_from([b""] * 6 + [b"x", b"HTTP/1.1 200 OK\r\n"]))
    # an interim response first, in a read of its own, or followed by the body alone
    interim = draw(st.sampled_from([[], [], [], [INTERIM], [INTERIM + BODIES[KEEP]]]))
    if not draw(st.booleans()):
        return request, [*interim, message]
    cut = draw(st.integers(1, max(1, len(message) - 1)))
    return request, [*interim, message[:cut], message[cut:]]


# half the steps are the plain repeated response, so that heads get learnt and taken
_CLEAN = st.just((GET, [KEEP + BODIES[KEEP]]))


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.one_of(_CLEAN, _step()), min_size=1, max_size=12))
def test_any_sequence_of_responses_reads_the_same_with_and_without_taking_whole(
    steps: list[tuple[bytes, list[bytes]]],
) -> None:
    cached, plain = asyncio.run(_both(steps))
    assert cached[:3] == plain[:3]


async def test_bytes_after_a_response_close_the_connection_instead_of_pooling_it() -> None:
    for extra in (b"x", b"HTTP/1.1 200 OK\r\n", KEEP + b"ok\n"):
        proxy = _Proxy(cache=True)
        proxy.exchange(GET, [KEEP + b"ok\n" + extra])
        body, outcomes, upstream_closed, _ = proxy.seen()
        assert body.count(b"HTTP/1.1 200 OK") == 1 and body.endswith(b"ok\n")
        assert outcomes == [("canary", 200)]  # the response owed went out whole
        assert upstream_closed and proxy.pool.acquire() is None  # never handed out again
        assert proxy.server.metrics.upstream_unsolicited == 1


async def test_an_interim_head_is_never_learnt_as_the_final_response_after_it() -> None:
    # the 103 seen twice, then a final head seen for the first time, in a read of the
    # 103's length: what is learnt must be the final head, never the interim one
    steps = [
        (GET, [INTERIM, ERROR + BODIES[ERROR]]),
        (GET, [INTERIM, KEEP + BODIES[KEEP]]),
        (GET, [INTERIM + BODIES[KEEP]]),  # not a response: the parser refuses it
    ]
    cached, plain = await _both(steps)
    assert cached[3] == 0
    assert cached[:3] == plain[:3]


# --- bytes an upstream was never asked for -------------------------------------------


async def _head_then_get(reads: Sequence[bytes]) -> _Proxy:
    """A HEAD and a GET pipelined in one read; the upstream answers the HEAD in `reads`."""
    proxy = _Proxy(cache=True)
    proxy.client.data_received(HEAD_REQUEST + GET)
    current = proxy.client.current
    assert current is not None and current.upstream is not None
    conn = current.upstream
    for data in reads:
        if conn.closed:
            break
        conn.data_received(data)
    return proxy


async def test_a_body_behind_a_head_response_never_reaches_the_client() -> None:
    # the parser reads it as the HEAD response's body (it cannot know the method); once
    # the pipelined GET held the connection, it went to the client ahead of any head
    for stray in (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL",
    ):
        proxy = await _head_then_get([stray])
        out = bytes(proxy.client_transport.out)
        assert b"EVIL" not in out
        assert out.startswith(b"HTTP/1.1 200 OK\r\n") and out.count(b"HTTP/1.1") == 1
        assert proxy.upstream_transport.closed
        assert proxy.server.metrics.upstream_unsolicited == 1


async def test_bytes_behind_a_chunked_response_are_never_read_as_its_trailers() -> None:
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
    stray = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nSet-Cookie: sid=evil\r\n\r\n"
    )
    proxy = _Proxy(cache=True)
    proxy.exchange(GET, [response + stray])
    out = bytes(proxy.client_transport.out)
    assert b"evil" not in out and out.endswith(b"hi\r\n0\r\n\r\n")
    assert proxy.upstream_transport.closed
    assert proxy.server.metrics.upstream_unsolicited == 1


async def test_a_pooled_connection_keeps_no_long_response_head() -> None:
    head = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 60_000 + b"\r\nContent-Length: 3\r\n\r\n"
    proxy = _Proxy(cache=True)
    proxy.exchange(GET, [head + b"ok\n"])
    conn = proxy.pool.acquire()
    assert conn is not None  # pooled, and holding nothing of that head
    assert conn._head_seen is None and conn._head_parsed is None
