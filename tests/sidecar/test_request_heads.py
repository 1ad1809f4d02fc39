"""Request heads as the proxy sends them upstream (sidecar.proxy.headers.request_head),
checked against a plain reference built field by field. The usual tail (the fields the
proxy adds) is kept per connection and choice, and must read the same as one built
for the request."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.proxy.headers import Header, request_head, request_tail
from tests.sidecar.proxy_harness import EXPERIMENT, harness

_DROPPED = {
    b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade",
    b"host", b"x-forwarded-proto", b"x-canary-variant", b"x-canary-experiment",
    b"x-canary-degrade",
}  # fmt: skip


def _reference(
    headers_in: list[Header],
    *,
    client_ip: bytes,
    variant: bytes,
    experiment: bytes | None,
    chunked: bool,
) -> bytes:
    out = b"GET /p HTTP/1.1\r\nHost: up:8080\r\n"
    forwarded: list[bytes] = []
    for lower, raw, value in headers_in:
        if lower == b"x-forwarded-for":
            forwarded.append(value)
        elif lower in _DROPPED or lower.startswith(b"proxy-"):
            continue
        elif not (chunked and lower == b"content-length"):
            out += raw + b": " + value + b"\r\n"
    out += b"X-Forwarded-For: " + b", ".join([*forwarded, client_ip]) + b"\r\n"
    out += b"X-Forwarded-Proto: http\r\nX-Canary-Variant: " + variant + b"\r\n"
    if experiment is not None:
        out += b"X-Canary-Experiment: " + experiment + b"\r\n"
    return out + (b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"\r\n")


def _head(headers_in: list[Header], **kwargs: Any) -> bytes:
    return request_head(
        b"GET", b"/p", headers_in, host=b"up:8080", proto=b"http", named=None, **kwargs
    )


_names = st.sampled_from(
    [b"Accept", b"X-Forwarded-For", b"Content-Length", b"Proxy-Authorization", b"Connection",
     b"X-Canary-Variant", b"Cookie", b"Host"]
)  # fmt: skip
_values = st.binary(min_size=1, max_size=12).map(
    lambda v: v.replace(b"\r", b"").replace(b"\n", b"") or b"v"
)
_fields = st.lists(
    st.tuples(_names, _values).map(lambda nv: (nv[0].lower(), nv[0], nv[1])), max_size=6
)


@settings(max_examples=300)
@given(
    headers_in=_fields,
    client_ip=st.sampled_from([b"127.0.0.1", b"10.0.0.7", b"::1"]),
    variant=st.sampled_from([b"baseline", b"canary"]),
    experiment=st.sampled_from([None, b"exp-1", b"exp-2"]),
    chunked=st.booleans(),
)
def test_a_request_head_reads_as_the_field_by_field_reference(
    headers_in: list[Header],
    client_ip: bytes,
    variant: bytes,
    experiment: bytes | None,
    chunked: bool,
) -> None:
    kwargs: dict[str, Any] = {"client_ip": client_ip, "variant": variant, "experiment": experiment}
    expected = _reference(headers_in, chunked=chunked, **kwargs)
    assert _head(headers_in, chunked=chunked, **kwargs) == expected
    # with the tail a connection keeps for its address and choice: the same bytes
    tail = request_tail(client_ip, b"http", variant, experiment)
    assert _head(headers_in, chunked=chunked, tail=tail, **kwargs) == expected


async def test_one_connection_sends_each_request_with_its_own_choice_tags() -> None:
    """A keep-alive connection keeps its tags per variant: requests that move between
    variants (and one with its own X-Forwarded-For) must each carry their own."""
    async with harness() as h:
        asked = ["baseline", "baseline", "canary", "baseline", "canary", "canary"]
        for index, variant in enumerate(asked):
            extra = {"x-forwarded-for": "192.0.2.1"} if index == 4 else {}
            response = await h.client.get("/echo", headers={"x-test-variant": variant, **extra})
            seen = dict((k.lower(), v) for k, v in response.json()["headers"])
            assert seen["x-canary-variant"] == variant
            assert seen["x-canary-experiment"] == EXPERIMENT
            forwarded = seen["x-forwarded-for"]
            assert forwarded == ("192.0.2.1, 127.0.0.1" if index == 4 else "127.0.0.1")
        assert h.proxy.metrics.connections == 1  # all of them over one connection
