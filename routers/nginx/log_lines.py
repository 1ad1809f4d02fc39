"""nginx's access-log datagrams → samples (the `LineParser` of routers/samples/lines.py).

nginx sends one syslog datagram per request (render.py: `nohostname`, tag `canary`):

    <190>Dec  6 13:59:51 canary: {"v":2,"token":"…","service":"pay-api",…}

and the JSON object is the one log_format.py defines. Parsing is strict: the prefix
must be exactly that shape, the JSON an object with exactly the format's keys, no
duplicate keys, no NaN, every field of its type and within its bounds.

- unit: the sticky header's value, else the cookie's (as sidecar/routing.py takes
  it), hashed at once with `sidecar.assignment.unit_hash` (0 when there is none).
  The datagram is read as latin-1, as the sidecar reads header values, so a unit's
  bytes hash the same behind either.
- times are in microseconds but come from nginx with millisecond resolution
  (`$request_time`, `$upstream_header_time`): a sample's rt and first byte are
  multiples of 1,000 µs, and a fast request can show 0.
- first byte: the last of `$upstream_header_time`'s values (nginx lists one per
  upstream it tried, `a, b`, or `a : b` across internal redirects), at most the
  total; `-` (no upstream answered) makes it the total.
- outcome: the status, except 499 (the client went away) → ABORTED, and nginx's own
  504 or 502 without an upstream response head → TIMEOUT or CONNECT_ERROR.

A line whose `token` is missing or is not this agent's (routers/samples/token.py)
is counted `forged`, whatever else it says: any local process can send to the log
port, and only nginx, from the include this agent rendered, writes the token. Lines
nginx sends before the agent's first apply carry the previous include's token and
are `forged` too (counted, never samples): a new agent's first apply ends that.
A line of another service is counted `other_service`; a line with no experiment (no
route was in force) `unattributed`; a request nginx answered without trying an
upstream (an empty `$upstream_header_time`: a malformed request, a 400 or 414 of its
own) `not_proxied`, since it says nothing of the variant it was assigned. Nothing
in a datagram raises out of `parse`.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Any, Final

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, TIMEOUT
from routers.nginx import log_format
from routers.nginx.render import SYSLOG_TAG
from routers.samples.lines import MAX_LINE
from routers.samples.token import LogToken
from sidecar.assignment import unit_hash
from sidecar.choice import Sample

_PREFIX: Final = re.compile(
    rb"<([0-9]{1,3})>[A-Z][a-z]{2} [ 123][0-9] [0-2][0-9]:[0-5][0-9]:[0-6][0-9] "
    rb"([A-Za-z0-9_]{1,32}): "
)
_EXPERIMENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SALT: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
_VARIANT: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_SECONDS: Final = re.compile(r"[0-9]{1,9}\.[0-9]{3}")
_UPSTREAM_TIMES_MAX: Final = 512
_UNIT_MAX: Final = 8_192
_U32: Final = 0xFFFF_FFFF
# beyond a day a request time is not one nginx measured
_SECONDS_MAX: Final = 86_400.0
# The line exactly as log_format.py has nginx write it, every string free of escapes:
# read by one regex instead of the JSON decoder (a fifth of the cost per line). A
# line it does not match — an escaped byte in a unit, a key out of order, anything
# odd — takes the strict JSON path, which decides as this one would.
_FAST: Final = re.compile(
    rb'\{"v":' + str(log_format.VERSION).encode() + rb',"token":"([A-Za-z0-9_-]{0,64})",'
    rb'"service":"([a-z0-9._-]{1,64})","experiment":"([A-Za-z0-9._-]{0,64})",'
    rb'"salt":"([A-Za-z0-9._-]{0,64})","variant":"([a-z0-9._-]{0,64})",'
    rb'"status":([1-9][0-9]{2}),"request_time":([0-9]{1,9}\.[0-9]{3}),'
    rb'"upstream_header_time":"([0-9.,: -]{0,512})","msec":([0-9]{1,12}\.[0-9]{3}),'
    rb'"unit_header":"([^"\\\x00-\x1f]{0,8192})","unit_cookie":"([^"\\\x00-\x1f]{0,8192})",'
    rb'"connection":[0-9]{1,20},"connection_requests":[0-9]{1,20}\}\n?'
)
# a route's identity fields checked once, then looked up; units hashed once
_KNOWN_MAX: Final = 4096
_UNITS_MAX: Final = 65_536


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _Refused("malformed")
    return found


def _no_constant(_: str) -> Any:
    raise _Refused("malformed")


def _text(record: dict[str, Any], key: str, limit: int = 64) -> str:
    value = record[key]
    if not isinstance(value, str) or len(value) > limit:
        raise _Refused("bad_field")
    return value


def _number(record: dict[str, Any], key: str) -> float:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Refused("bad_field")
    if not math.isfinite(value) or value < 0:
        raise _Refused("bad_field")
    return float(value)


def _us(seconds: float) -> int:
    if seconds > _SECONDS_MAX:
        raise _Refused("bad_time")
    return min(round(seconds * 1_000_000), _U32)


def last_upstream_time(text: str) -> float | None:
    """The last value of `$upstream_header_time` in seconds; None for `-`, or for ""
    (nginx answered without trying an upstream)."""
    if len(text) > _UPSTREAM_TIMES_MAX:
        raise _Refused("bad_time")
    # several tries (`a, b`, `a : b`): the last one's; one try, without a regex
    several = "," in text or ":" in text
    last = (re.split(r"[,:]", text)[-1] if several else text).strip()
    if last in ("-", ""):
        return None
    if not _SECONDS.fullmatch(last):
        raise _Refused("bad_time")
    return float(last)


def outcome_of(status: int, upstream_answered: bool) -> int:
    """The codec's outcome for nginx's status (controlplane/kernel/codec.py)."""
    if status == 499:
        return ABORTED
    if not upstream_answered and status == 504:
        return TIMEOUT
    if not upstream_answered and status == 502:
        return CONNECT_ERROR
    return status


class NginxLineParser:
    """Parses the access-log datagrams of one service's nginx."""

    def __init__(self, service: str, *, token: LogToken, tag: str = SYSLOG_TAG) -> None:
        self.service = service
        self._token = token
        self._tag = tag.encode()
        self.rejected: Counter[str] = Counter()
        self.parsed = 0
        self._known: set[tuple[bytes, ...]] = set()
        self._units: dict[tuple[str, str], int] = {}

    def parse(self, datagram: bytes) -> Sample | None:
        if len(datagram) > MAX_LINE:
            self.rejected["too_long"] += 1
            return None
        try:
            sample = self._parse(datagram)
        except _Refused as refused:
            self.rejected[refused.reason] += 1
            return None
        except (ValueError, RecursionError):  # JSON nginx did not write
            self.rejected["malformed"] += 1
            return None
        if sample is not None:
            self.parsed += 1
        return sample

    def _parse(self, datagram: bytes) -> Sample | None:
        prefix = _PREFIX.match(datagram)
        if prefix is None or prefix.group(2) != self._tag:
            raise _Refused("bad_prefix")
        fast = _FAST.fullmatch(datagram, prefix.end())
        if fast is not None:
            return self._fast(fast)
        body = datagram[prefix.end() :].rstrip(b"\n").decode("latin-1")
        record = json.loads(body, object_pairs_hook=_pairs, parse_constant=_no_constant)
        if not isinstance(record, dict):
            raise _Refused("malformed")
        token = record.get("token")
        if not isinstance(token, str) or not self._token.matches(token):
            raise _Refused("forged")
        if record.keys() != log_format.KEYS:
            raise _Refused("malformed")
        if record["v"] != log_format.VERSION or isinstance(record["v"], bool):
            raise _Refused("bad_version")
        if _text(record, "service") != self.service:
            raise _Refused("other_service")
        experiment = _text(record, "experiment")
        if not experiment:
            raise _Refused("unattributed")
        salt = _text(record, "salt")
        variant = _text(record, "variant")
        if not (
            _EXPERIMENT.fullmatch(experiment)
            and _SALT.fullmatch(salt)
            and _VARIANT.fullmatch(variant)
        ):
            raise _Refused("bad_field")
        status = record["status"]
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 999:
            raise _Refused("bad_status")
        for key in ("connection", "connection_requests"):
            if not isinstance(record[key], int) or isinstance(record[key], bool):
                raise _Refused("bad_field")
        ts = _number(record, "msec")
        rt_us = _us(_number(record, "request_time"))
        upstream_times = _text(record, "upstream_header_time", _UPSTREAM_TIMES_MAX)
        if not upstream_times:
            raise _Refused("not_proxied")
        header_time = last_upstream_time(upstream_times)
        first_byte_us = rt_us if header_time is None else min(_us(header_time), rt_us)
        unit = _text(record, "unit_header", _UNIT_MAX) or _text(record, "unit_cookie", _UNIT_MAX)
        hashed = unit_hash(salt, unit) if unit else 0
        outcome = outcome_of(status, header_time is not None)
        return (ts, experiment, variant, rt_us, outcome, hashed, first_byte_us)

    def _fast(self, m: re.Match[bytes]) -> Sample:
        """The JSON path's decisions, on a line the fast regex matched."""
        identity = m.group(1, 2, 3, 4, 5)
        token, service, experiment_b, salt_b, variant_b = identity
        if identity not in self._known:
            if not self._token.matches(token.decode("ascii")):
                raise _Refused("forged")
            if service.decode("ascii") != self.service:
                raise _Refused("other_service")
            if not experiment_b:
                raise _Refused("unattributed")
            if not (
                _EXPERIMENT.fullmatch(experiment_b.decode("ascii"))
                and _SALT.fullmatch(salt_b.decode("ascii"))
                and _VARIANT.fullmatch(variant_b.decode("ascii"))
            ):
                raise _Refused("bad_field")
            if len(self._known) >= _KNOWN_MAX:
                self._known.clear()
            self._known.add(identity)
        experiment = experiment_b.decode("ascii")
        salt = salt_b.decode("ascii")
        status = int(m.group(6))
        ts = float(m.group(9))
        rt_us = _us(float(m.group(7)))
        upstream_times = m.group(8).decode("ascii")
        if not upstream_times:
            raise _Refused("not_proxied")
        header_time = last_upstream_time(upstream_times)
        first_byte_us = rt_us if header_time is None else min(_us(header_time), rt_us)
        unit = (m.group(10) or m.group(11)).decode("latin-1")
        hashed = 0
        if unit:
            key = (salt, unit)
            cached = self._units.get(key)
            if cached is None:
                cached = unit_hash(salt, unit)
                if len(self._units) >= _UNITS_MAX:
                    self._units.clear()
                self._units[key] = cached
            hashed = cached
        outcome = outcome_of(status, header_time is not None)
        return (ts, experiment, variant_b.decode("ascii"), rt_us, outcome, hashed, first_byte_us)


__all__ = ["NginxLineParser", "last_upstream_time", "outcome_of"]
