"""Protocol upgrades (RFC 9110 §7.8): which requests become tunnels, which 101s count.

A request asks to upgrade when its `Connection` lists `upgrade` and it carries an
`Upgrade` field; httptools then stops parsing after its head (the bytes that follow
belong to the new protocol, or to the next request if the upstream says no). The
decisions here are pure: what to do with such a request, and whether an upstream's
`101 Switching Protocols` answers what was asked.

- `Upgrade: h2c` is not tunnelled: HTTP/2 is spoken by the proxy itself or not at
  all, never relayed blind. Such a request goes upstream as a plain one, without
  its Upgrade, and the connection ends after it (as for any HTTP/1.0 upgrade, which
  RFC 9110 says to ignore).
- A request asking to upgrade must not carry a body: httptools does not parse one
  (it reports the upgrade right after the head), so the body's bytes would be read
  as the tunnel's or as the next request's. Refused, 400.
"""

from __future__ import annotations

import enum
import re
from typing import Final

from sidecar.proxy.conformance import Rejected

# the upgrade tokens a request may list; more is not a client, and not a tunnel
MAX_PROTOCOLS: Final = 8
MAX_UPGRADE_VALUE: Final = 256
_H2C: Final = b"h2c"
# RFC 9110 §7.8: protocol-name ["/" protocol-version], both tokens
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_PROTOCOL: Final = re.compile(_TOKEN + rb"(?:/" + _TOKEN + rb")?")


class UpgradeMode(enum.Enum):
    """What the proxy does with a request that asks to upgrade."""

    TUNNEL = "tunnel"  # forwarded with its Upgrade; a 101 splices both connections
    PLAIN = "plain"  # forwarded without its Upgrade; the connection ends after it


def protocols(values: list[bytes]) -> tuple[bytes, ...]:
    """The protocols `Upgrade` fields list, lower-cased, in order; raises Rejected on a
    value that is not a list of protocol tokens or names too many."""
    found: list[bytes] = []
    for value in values:
        if len(value) > MAX_UPGRADE_VALUE:
            raise Rejected(400, "upgrade", f"Upgrade longer than {MAX_UPGRADE_VALUE} bytes")
        for item in value.split(b","):
            token = item.strip(b" \t")
            if not token:
                continue  # RFC 9110 §5.6.1: empty list elements are ignored
            if _PROTOCOL.fullmatch(token) is None:
                raise Rejected(400, "upgrade", "Upgrade must list protocol tokens")
            found.append(token.lower())
    if not found:
        raise Rejected(400, "upgrade", "Upgrade names no protocol")
    if len(found) > MAX_PROTOCOLS:
        raise Rejected(400, "upgrade", f"Upgrade names more than {MAX_PROTOCOLS} protocols")
    return tuple(found)


def mode(*, http_1_0: bool, asked: tuple[bytes, ...], has_body: bool) -> UpgradeMode:
    """The mode for a request whose Connection lists `upgrade` and whose Upgrade
    fields list `asked`; raises Rejected for one with a body."""
    if has_body:
        raise Rejected(400, "upgrade", "a request asking to upgrade must not carry a body")
    if http_1_0 or any(p == _H2C or p.startswith(_H2C + b"/") for p in asked):
        return UpgradeMode.PLAIN
    return UpgradeMode.TUNNEL


def connection_lists_upgrade(value: bytes) -> bool:
    """Does a Connection value list the `upgrade` option?"""
    return any(t.strip(b" \t").lower() == b"upgrade" for t in value.split(b","))


def field_values(fields: bytes, name: bytes) -> list[bytes]:
    """The values of the fields called `name` (lower-case) in a head's fields, as the
    upstream sent them ("\\r\\nName: value" each, already checked by httptools)."""
    values = []
    for line in fields.split(b"\r\n"):
        field, sep, value = line.partition(b":")
        if sep and field.lower() == name:
            values.append(value.strip(b" \t"))
    return values


def check_switch(asked: tuple[bytes, ...] | None, fields: bytes) -> str | None:
    """Why a 101 in answer to a request that asked for `asked` (None: it asked for
    nothing) cannot be accepted, or None when it can: the 101 must list `upgrade`
    in Connection and switch to protocols the request named (RFC 9110 §15.2.2)."""
    if asked is None:
        return "101 Switching Protocols to a request that did not ask to upgrade"
    if not any(connection_lists_upgrade(v) for v in field_values(fields, b"connection")):
        return "101 Switching Protocols without Connection: upgrade"
    try:
        chosen = protocols(field_values(fields, b"upgrade"))
    except Rejected:
        return "101 Switching Protocols without a valid Upgrade field"
    if any(p not in asked for p in chosen):
        return "101 Switching Protocols to a protocol the request did not ask for"
    return None
