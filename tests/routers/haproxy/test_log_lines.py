"""HaproxyLineParser on lines captured from a real HAProxy 2.6 with the base config's
log format, and on what HAProxy (or anyone who can send a datagram) must not slip
through."""

from __future__ import annotations

import pytest

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, TIMEOUT
from routers.haproxy.log_lines import HaproxyLineParser
from routers.samples.token import LogToken
from sidecar.assignment import unit_hash

# captured from haproxy 2.6.12 (log … format raw; the %Tt field, 0, and cx3's token,
# TOKEN's, added by hand; no route, no token): no route; a header unit; a unit of any
# bytes ("café \x01;|"); no unit; a refused connection after 3 retries
TOKEN = LogToken("fixture-token_0123456789")
NO_ROUTE = b"cx3 - shop - - - 503 0 0 -1 -1 -1 0 1796565699.578 LR - .\n"
HEADER_UNIT = (
    b"cx3 fixture-token_0123456789 shop 42 s1 baseline 200 0 0 0 0 0 0 1796565699.583 -- "
    b"757365722D37 .\n"
)
ODD_UNIT = (
    b"cx3 fixture-token_0123456789 shop 42 s1 canary 200 0 0 0 0 0 0 1796565699.584 -- "
    b"636166E920013B7C .\n"
)
NO_UNIT = (
    b"cx3 fixture-token_0123456789 shop 42 s1 baseline 200 0 0 0 0 0 0 1796565699.584 -- - .\n"
)
REFUSED = (
    b"cx3 fixture-token_0123456789 shop exp-b s2 canary 503 3004 0 0 -1 -1 0 1796565699.588 SC "
    b"616263 .\n"
)


def test_captured_lines_become_samples() -> None:
    parser = HaproxyLineParser("shop", token=TOKEN)
    assert parser.parse(HEADER_UNIT) == (
        1796565699.583, "42", "baseline", 0, 200, unit_hash("s1", "user-7"), 0,
    )  # fmt: skip
    assert parser.parse(ODD_UNIT) == (
        1796565699.584, "42", "canary", 0, 200, unit_hash("s1", "caf\xe9 \x01;|"), 0,
    )  # fmt: skip
    assert parser.parse(NO_UNIT) == (1796565699.584, "42", "baseline", 0, 200, 0, 0)
    assert parser.parse(REFUSED) == (
        1796565699.588, "exp-b", "canary", 3_004_000, CONNECT_ERROR, unit_hash("s2", "abc"),
        3_004_000,
    )  # fmt: skip
    assert parser.parse(NO_ROUTE) is None
    assert parser.rejected == {"unattributed": 1}


def line(**fields: str) -> bytes:
    values = {
        "tag": "cx3", "experiment": "42", "salt": "s1", "variant": "canary", "status": "200",
        "ta": "12", "tr_req": "1", "tw": "0", "tc": "2", "tr": "7", "tt": "12",
        "accept": "1796565699.583", "termination": "--", "unit": "6162", "service": "shop",
        "token": TOKEN.value,
    }  # fmt: skip
    values.update(fields)
    v = values
    return (
        f"{v['tag']} {v['token']} {v['service']} {v['experiment']} {v['salt']} {v['variant']} "
        f"{v['status']} "
        f"{v['ta']} {v['tr_req']} {v['tw']} {v['tc']} {v['tr']} {v['tt']} {v['accept']} "
        f"{v['termination']} {v['unit']} .\n"
    ).encode("latin-1")


def test_times_are_microseconds_and_the_first_byte_is_the_response_head() -> None:
    sample = HaproxyLineParser("shop", token=TOKEN).parse(line())
    assert sample is not None
    _, _, _, rt_us, outcome, _, first_byte_us = sample
    assert (rt_us, outcome, first_byte_us) == (12_000, 200, 10_000)
    # HAProxy's ms timers can sum past the total: the first byte never does
    clipped = HaproxyLineParser("shop", token=TOKEN).parse(line(ta="3", tr="7"))
    assert clipped is not None and clipped[6] == clipped[3] == 3_000


@pytest.mark.parametrize(
    ("termination", "status", "outcome"),
    [("CH", "-1", ABORTED), ("cR", "408", ABORTED), ("sH", "504", TIMEOUT),
     ("sC", "503", TIMEOUT), ("SC", "503", CONNECT_ERROR), ("SH", "502", CONNECT_ERROR),
     ("PR", "403", 403)],
)  # fmt: skip
def test_no_response_head_is_an_outcome_of_who_ended_it(
    termination: str, status: str, outcome: int
) -> None:
    sample = HaproxyLineParser("shop", token=TOKEN).parse(
        line(tr="-1", tc="-1", termination=termination, status=status)
    )
    assert sample is not None
    assert (sample[4], sample[6]) == (outcome, sample[3])


@pytest.mark.parametrize(
    ("datagram", "reason"),
    [
        (line(service="cart"), "other_service"),
        (line(experiment="-"), "unattributed"),
        (line(experiment="-", token="-"), "unattributed"),
        (line(token="fixture-token_0123456788"), "forged"),
        (line(token="-"), "forged"),
        (line(token=""), "forged"),
        (line(token="A" * 24), "forged"),
        (line(token=TOKEN.value + "x"), "forged"),
        (line(token="fixture-token_012345678\xe9"), "malformed"),  # not even ASCII
        (line(token="-", service="cart"), "forged"),
        (line(token="guess", experiment="-"), "forged"),
        (line(token=TOKEN.value, tag="cx2"), "malformed"),
        (line()[:-3], "truncated"),
        (b"x" * 20_000, "too_long"),
        (b"<134>Dec  6 14:00:00 haproxy[1]: 127.0.0.1 GET /", "malformed"),
        (line(unit="616"), "malformed"),
        (line(unit="6g"), "malformed"),
        (line(unit="61 62"), "malformed"),
        (line(experiment="../x"), "malformed"),
        (line(variant="Canary"), "malformed"),
        (line(status="2000"), "malformed"),
        (line(status="-1"), "bad_outcome"),
        (line(tr="-1", status="-1", termination="--"), "bad_outcome"),
        (line(ta="-1"), "malformed"),
        (line(ta="99999999999"), "malformed"),
        (line(accept="1796565699"), "malformed"),
        (line(termination="-"), "malformed"),
        (line(salt="s\xe91"), "malformed"),
        (b"", "malformed"),
        (b"\xff\xfe", "malformed"),
    ],
)
def test_what_is_refused_is_counted(datagram: bytes, reason: str) -> None:
    parser = HaproxyLineParser("shop", token=TOKEN)
    assert parser.parse(datagram) is None
    assert parser.rejected == {reason: 1}


def test_a_sample_is_stamped_at_the_end_of_its_request() -> None:
    # a kept-alive connection idle for 9 s: the accept date is the previous request's
    # end, and %Tt counts from it, so the sample lands when this request ended
    sample = HaproxyLineParser("shop", token=TOKEN).parse(line(accept="1796565690.500", tt="9012"))
    assert sample is not None
    assert sample[0] == pytest.approx(1796565699.512)
    assert HaproxyLineParser("shop", token=TOKEN).parse(line(tt="-1")) is None
