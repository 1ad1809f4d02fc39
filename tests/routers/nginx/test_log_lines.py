"""The nginx access-log parser, on lines captured from nginx 1.22 running the
rendered config (tests/routers/nginx/rig.py), and on lines nginx never writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, TIMEOUT
from routers.nginx.log_lines import NginxLineParser, last_upstream_time
from routers.samples.lines import MAX_LINE, LineParser
from routers.samples.token import LogToken
from sidecar.assignment import unit_hash
from sidecar.choice import Sample

# one datagram a line, after its name: as nginx 1.22 sent them (the no-route 503, a
# header unit, a cookie unit, no unit, a unit sent as the bytes q"u\o<TAB>t\xe9\xff,
# a client that went away, an upstream that refused the connection); format v2's
# token field, a constant of the rendered log_format, set to TOKEN's by hand
TOKEN = LogToken("fixture-token_0123456789")
_CAPTURED = (Path(__file__).parent / "nginx-1.22-access.log").read_bytes().splitlines()
LINES = {name: line for name, _, line in (entry.partition(b" ") for entry in _CAPTURED)}
NO_ROUTE = LINES[b"NO_ROUTE"]
HEADER = LINES[b"HEADER"]
COOKIE = LINES[b"COOKIE"]
NO_UNIT = LINES[b"NO_UNIT"]
ODD_UNIT = LINES[b"ODD_UNIT"]
CLIENT_GONE = LINES[b"CLIENT_GONE"]
REFUSED = LINES[b"REFUSED"]


def parse(
    line: bytes, service: str = "pay-api", token: LogToken = TOKEN
) -> tuple[Sample | None, LineParser]:
    parser: LineParser = NginxLineParser(service, token=token)  # the seam, checked by mypy
    return parser.parse(line), parser


def test_a_header_unit() -> None:
    sample, _ = parse(HEADER)
    assert sample == (1796565781.649, "exp-7", "baseline", 0, 200, unit_hash("s1", "alice"), 0)


def test_a_cookie_unit_and_no_unit() -> None:
    sample, _ = parse(COOKIE)
    assert sample is not None and sample[5] == unit_hash("s1", "bob")
    sample, _ = parse(NO_UNIT)
    assert sample == (1796565781.651, "exp-7", "canary", 1_000, 200, 0, 0)


def test_an_escaped_unit_hashes_as_the_sidecar_reads_it() -> None:
    sample, _ = parse(ODD_UNIT)
    # the sidecar decodes header bytes as latin-1
    unit = b'q"u\\o\tt\xe9\xff'.decode("latin-1")
    assert sample is not None and sample[5] == unit_hash("s1", unit)


def test_outcomes_nginx_gave_itself() -> None:
    sample, _ = parse(CLIENT_GONE)
    assert sample == (
        1796565781.988,
        "42",
        "baseline",
        201_000,
        ABORTED,
        unit_hash("s1", "carol"),
        201_000,
    )
    sample, _ = parse(REFUSED)
    assert sample is not None and sample[4] == CONNECT_ERROR
    # nginx's own 504 has no upstream head; an upstream's own 504 has one
    timed_out = REFUSED.replace(b'"status":502', b'"status":504')
    sample, _ = parse(timed_out)
    assert sample is not None and sample[4] == TIMEOUT
    upstream_504 = HEADER.replace(b'"status":200', b'"status":504')
    sample, _ = parse(upstream_504)
    assert sample is not None and sample[4] == 504


def test_retries_take_the_last_upstream_and_first_byte_is_at_most_the_total() -> None:
    line = HEADER.replace(b'"request_time":0.000', b'"request_time":0.040').replace(
        b'"upstream_header_time":"0.000"', b'"upstream_header_time":"0.010, 0.025 : 0.300"'
    )
    sample, _ = parse(line)
    assert sample is not None and (sample[3], sample[6]) == (40_000, 40_000)
    assert last_upstream_time("0.010, 0.025") == 0.025
    assert last_upstream_time("0.010, -") is None


def test_no_route_is_unattributed_and_another_service_counted() -> None:
    sample, parser = parse(NO_ROUTE)
    assert sample is None and parser.rejected == {"unattributed": 1}
    sample, parser = parse(HEADER, service="orders")
    assert sample is None and parser.rejected == {"other_service": 1}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (HEADER.replace(b"<190>Dec  6", b"<190>2026-12-06"), "bad_prefix"),
        (HEADER.replace(b"canary: ", b"haproxy: "), "bad_prefix"),
        (HEADER[:-1], "malformed"),
        (HEADER.replace(b'"connection":9', b'"connection":9,"status":200'), "malformed"),
        (HEADER.replace(b'"msec":1796565781.649', b'"msec":NaN'), "malformed"),
        (HEADER.replace(b',"unit_cookie":""', b""), "malformed"),
        (HEADER.replace(b'"v":2', b'"v":1'), "bad_version"),
        (HEADER.replace(b'"v":2', b'"v":true'), "bad_version"),
        (
            HEADER.replace(b'"upstream_header_time":"0.000"', b'"upstream_header_time":""'),
            "not_proxied",
        ),
        (HEADER.replace(b'"status":200', b'"status":true'), "bad_status"),
        (HEADER.replace(b'"status":200', b'"status":0'), "bad_status"),
        (HEADER.replace(b'"status":200', b'"status":"200"'), "bad_status"),
        (HEADER.replace(b'"request_time":0.000', b'"request_time":-1'), "bad_field"),
        (HEADER.replace(b'"request_time":0.000', b'"request_time":1e300'), "bad_time"),
        (
            HEADER.replace(b'"upstream_header_time":"0.000"', b'"upstream_header_time":"soon"'),
            "bad_time",
        ),
        (HEADER.replace(b'"variant":"baseline"', b'"variant":"Base line"'), "bad_field"),
        (HEADER.replace(b'"variant":"baseline"', b'"variant":""'), "bad_field"),
        (HEADER.replace(b'"unit_header":"alice"', b'"unit_header":7'), "bad_field"),
        (
            HEADER.replace(
                b'"unit_header":"alice"', b'"unit_header":"' + b"a" * (MAX_LINE + 1) + b'"'
            ),
            "too_long",
        ),
        (b"\xff\xfe" * 10, "bad_prefix"),
        (b"", "bad_prefix"),
        (HEADER.replace(b'"v":2', b'"v":[' * 50_000), "too_long"),
        (HEADER.split(b": ", 1)[0] + b": " + b"[" * 10_000, "malformed"),
    ],
)
def test_lines_nginx_never_writes_are_counted_not_raised(line: bytes, reason: str) -> None:
    sample, parser = parse(line)
    assert sample is None
    assert parser.rejected == {reason: 1}


FORGED = [
    HEADER.replace(TOKEN.value.encode(), b"fixture-token_0123456788"),  # one character off
    HEADER.replace(TOKEN.value.encode(), b""),
    HEADER.replace(b'"token":"' + TOKEN.value.encode() + b'",', b""),  # no token field
    HEADER.replace(b'"token":"' + TOKEN.value.encode() + b'"', b'"token":null'),
    HEADER.replace(TOKEN.value.encode(), TOKEN.value.encode() + b"x"),
    HEADER.replace(TOKEN.value.encode(), "fixture-token_012345678\u00e9".encode()),
    # a forger who knows the format, and nothing else, on any route or none
    NO_ROUTE.replace(TOKEN.value.encode(), b"guess"),
    REFUSED.replace(TOKEN.value.encode(), b"A" * 24),
]


@pytest.mark.parametrize("line", FORGED)
def test_a_line_without_the_agents_token_is_forged(line: bytes) -> None:
    sample, parser = parse(line)
    assert sample is None
    assert parser.rejected == {"forged": 1}


def test_another_agents_token_is_forged_too() -> None:
    # a line nginx wrote from the previous agent's include, before this one's apply
    sample, parser = parse(HEADER, token=LogToken("another-agents-token-xyz"))
    assert sample is None and parser.rejected == {"forged": 1}


def test_the_fast_path_decides_as_the_json_path_does(monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from routers.nginx import log_lines

    lines = [*LINES.values(), *FORGED, HEADER.replace(b'"status":200', b'"status":499')]
    fast = NginxLineParser("pay-api", token=TOKEN)
    taken = [log_lines._FAST.fullmatch(line, line.index(b": ") + 2) is not None for line in lines]
    assert sum(taken) >= len(LINES) - 1, "ordinary lines must take the fast path"
    fast_results = [fast.parse(line) for line in lines]
    monkeypatch.setattr(log_lines, "_FAST", re.compile(rb"(?!)"))  # never matches
    slow = NginxLineParser("pay-api", token=TOKEN)
    assert [slow.parse(line) for line in lines] == fast_results
    assert slow.rejected == fast.rejected
