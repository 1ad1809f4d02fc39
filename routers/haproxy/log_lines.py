"""HAProxy's access-log datagrams (`log_format.py`) → samples (routers/samples/lines.py).

Strict and bounded: a line is exactly the format's fields, each checked against its
charset and range, or it is refused and counted under a reason:

    too_long        over MAX_LINE bytes, refused unread
    malformed       not our format (tag, field count, charset, a number out of range)
    truncated       no end mark: HAProxy cut the line
    forged          the token is not this agent's (routers/samples/token.py): any
                    local process can send to the log port; only HAProxy, from the
                    map value this agent wrote, logs the token
    other_service   a line of another service's frontend
    bad_outcome     a status no sample can carry and no termination state explains
    unattributed    no experiment: the request met no route (HAProxy's own 503)

HAProxy logs no token for a request that met no route (the map holds none, so
there is no token to copy): a line with neither token nor experiment is
`unattributed`, as it would be anyway, and is never a sample. After a new agent
starts, lines carry the previous agent's token until its first apply (every agent
applies at start) and are refused as `forged`, counted.

Lines of any experiment are kept, each sample under its own experiment: a request
that began under the previous route is that route's sample.

Times: HAProxy's timers are milliseconds; a sample's are microseconds, so both are
multiples of 1000. `rt_us` is `%Ta` (the request's active time); `first_byte_us` is
`%TR + %Tw + %Tc + %Tr`, the time to the server's response head, never above rt_us.
`%Tr` -1 (no response head) makes the outcome the codec's CONNECT_ERROR, TIMEOUT or
ABORTED by the termination state, and first byte = rt_us. The sticky unit arrives
hex-encoded; it is decoded (latin-1, as the sidecar reads header bytes) and hashed
with `sidecar.assignment.unit_hash` at once, so a unit has the sidecar's id, and the
raw value goes no further.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Final

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, TIMEOUT
from routers.haproxy.log_format import END, FIELDS, MAX_LINE, TAG
from routers.haproxy.render import MAX_UNIT
from routers.samples.token import LogToken
from sidecar.assignment import unit_hash
from sidecar.choice import Sample

_NONE = "-"
_U32_MAX = 0xFFFF_FFFF
_EXPERIMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SALT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_VARIANT = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_ACCEPT = re.compile(r"^([0-9]{1,12})\.([0-9]{3})$")
_TERMINATION = re.compile(r"^[A-Za-z-]{2}$")
_HEX = re.compile(rf"^([0-9A-F]{{2}}){{1,{MAX_UNIT}}}$")
# who ended an exchange that got no response head (first character of %ts)
_NO_HEAD: Final = {"C": ABORTED, "c": ABORTED, "s": TIMEOUT, "S": CONNECT_ERROR}
# A route's identity fields repeat on every line it serves: checked once, then looked
# up (at most this many kept; a flood of forged identities only refills the cache)
_KNOWN_MAX: Final = 4096
# units hashed once per (salt, unit): users repeat, blake2b per line is the next cost
_UNITS_MAX: Final = 65_536


def _timer(text: str) -> int | None:
    """A timer field: -1 or 0..9999999999 ms; None when it is neither."""
    if text.isdigit() and len(text) <= 10 and text.isascii():
        return int(text)
    return -1 if text == "-1" else None


class HaproxyLineParser:
    """Parses the datagrams of one service's HAProxy frontend."""

    def __init__(self, service: str, *, token: LogToken) -> None:
        self.service = service
        self._token = token
        self._rejected: Counter[str] = Counter()
        # (token, service, experiment, salt, variant) found valid, and hashed units
        self._known: set[tuple[str, str, str, str, str]] = set()
        self._units: dict[tuple[str, str], int] = {}

    @property
    def rejected(self) -> Counter[str]:
        return self._rejected

    def parse(self, datagram: bytes) -> Sample | None:
        if len(datagram) > MAX_LINE:
            return self._refuse("too_long")
        try:
            line = datagram.decode("ascii")
        except UnicodeDecodeError:
            return self._refuse("malformed")
        fields = line.rstrip("\n").split(" ")
        if fields[0] != TAG:
            return self._refuse("malformed")
        if fields[-1] != END:
            return self._refuse("truncated")
        if len(fields) != len(FIELDS):
            return self._refuse("malformed")
        (_, token, service, experiment, salt, variant, status_s, ta, tr_req, tw, tc, tr, tt,
         accept, termination, unit_hex, _) = fields  # fmt: skip
        identity = (token, service, experiment, salt, variant)
        if identity not in self._known:
            refused = self._identity_problem(identity)
            if refused is not None:
                return self._refuse(refused)
            if len(self._known) >= _KNOWN_MAX:
                self._known.clear()
            self._known.add(identity)
        total, request, queue, connect, response, since_accept = (
            _timer(ta), _timer(tr_req), _timer(tw), _timer(tc), _timer(tr), _timer(tt)
        )
        when = _ACCEPT.match(accept)
        status = _timer(status_s)
        if (
            total is None or request is None or queue is None or connect is None
            or response is None or since_accept is None or status is None or when is None
            or len(status_s) > 3 or total < 0 or since_accept < 0
            or not _TERMINATION.match(termination)
        ):  # fmt: skip
            return self._refuse("malformed")
        rt_us = min(total * 1000, _U32_MAX)
        if response >= 0:
            if not 100 <= status <= 599:
                return self._refuse("bad_outcome")
            outcome = status
            head = max(request, 0) + max(queue, 0) + max(connect, 0) + response
            first_byte_us = min(head * 1000, rt_us)
        else:
            no_head = _NO_HEAD.get(termination[0])
            if no_head is not None:
                outcome = no_head
            elif 100 <= status <= 599:
                outcome = status  # HAProxy answered for the server (e.g. a 503)
            else:
                return self._refuse("bad_outcome")
            first_byte_us = rt_us
        ts = int(when.group(1)) + (int(when.group(2)) + since_accept) / 1000
        if unit_hex == _NONE:
            unit = 0
        else:
            key = (salt, unit_hex)
            cached = self._units.get(key)
            if cached is None:
                if not _HEX.match(unit_hex):
                    return self._refuse("malformed")
                cached = unit_hash(salt, bytes.fromhex(unit_hex).decode("latin-1"))
                if len(self._units) >= _UNITS_MAX:
                    self._units.clear()
                self._units[key] = cached
            unit = cached
        return (ts, experiment, variant, rt_us, outcome, unit, first_byte_us)

    def _identity_problem(self, identity: tuple[str, str, str, str, str]) -> str | None:
        """Why a line's route fields are refused (checked once per route), or None."""
        token, service, experiment, salt, variant = identity
        if token == _NONE and experiment == _NONE:
            return "unattributed"
        if not self._token.matches(token):
            return "forged"
        if service != self.service:
            return "other_service" if _VARIANT.match(service) else "malformed"
        if experiment == _NONE:
            return "unattributed"
        if not (_EXPERIMENT.match(experiment) and _SALT.match(salt) and _VARIANT.match(variant)):
            return "malformed"
        return None

    def _refuse(self, reason: str) -> Sample | None:
        self._rejected[reason] += 1
        return None


__all__ = ["HaproxyLineParser"]
