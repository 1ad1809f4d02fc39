"""A URL's host, parsed once the way resolvers and HTTP clients read it.

An address has many spellings: `inet_aton` (and so `getaddrinfo`, which the sidecar
and the webhook sender connect through) reads `2852039166`, `0xa9fea9fe`,
`169.254.43518` and `0251.0376.0251.0376` as 169.254.169.254, and an IPv6 literal
can carry an IPv4 address (`::ffff:169.254.169.254`). A guard that compares the text
misses them all. So a host is one of:

- a canonical IPv4 dotted quad (`169.254.169.254`);
- an IPv6 literal (`[2001:db8::1]`), never one that only spells an IPv4 address
  (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`);
- a name: ASCII letters, digits, `-` and `_` in dot-separated labels, at most one
  trailing dot, whose last label is not a number (WHATWG's rule: a host ending in a
  number is an IPv4 address or nothing).

Any other numeric spelling is refused, naming the canonical address to write
instead; so are percent-encoded hosts, IPv6 zone ids and non-ASCII names (write an
internationalised name as its `xn--` A-label: IDNA 2003 and 2008 map some names
differently, and IDNA 2003 maps full-width digits to an IPv4 address).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL: Final = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_NAME_MAX: Final = 253
_HEX_PART: Final = re.compile(r"0x[0-9a-f]*")
# IPv6 ranges whose last 32 bits are an IPv4 address a translator delivers to: NAT64's
# well-known prefix, its local-use prefix in the usual /96 layout, SIIT's IPv4-translated
_TRANSLATED: Final = (
    ipaddress.ip_network("64:ff9b::/96"),
    ipaddress.ip_network("64:ff9b:1::/48"),
    ipaddress.ip_network("::ffff:0:0:0/96"),
)
_COMPATIBLE: Final = ipaddress.ip_network("::/96")


@dataclass(frozen=True)
class Host:
    """`name` is the lower-case name (a trailing dot kept: it tells the resolver not to
    try its search domains) or the address's text; `address` is set for an IP literal."""

    name: str
    address: IPAddress | None = None

    @property
    def bare(self) -> str:
        """The name without its trailing dot: what allow-lists and guards compare."""
        return self.name.removesuffix(".")


def _ends_in_number(labels: list[str]) -> bool:
    last = labels[-1]
    return last.isdigit() or _HEX_PART.fullmatch(last) is not None


def _number(part: str) -> int | None:
    """One part of an inet_aton address: 0x hex, 0-led octal, or decimal."""
    if _HEX_PART.fullmatch(part):
        return int(part[2:] or "0", 16)
    if not part.isdigit():
        return None
    if len(part) > 1 and part.startswith("0"):
        return int(part, 8) if all(c in "01234567" for c in part) else None
    return int(part)


def inet_aton(labels: list[str]) -> ipaddress.IPv4Address | None:
    """The address `inet_aton` reads from 1-4 dot-separated parts (the last fills the
    remaining bytes: `169.254.43518`, `2852039166`), or None."""
    if not 1 <= len(labels) <= 4:
        return None
    numbers = [_number(label) for label in labels]
    value = 0
    for index, number in enumerate(numbers):
        if number is None:
            return None
        room = 256 if index < len(numbers) - 1 else 256 ** (5 - len(numbers))
        if number >= room:
            return None
        value = value * 256 + number if index < len(numbers) - 1 else value * room + number
    return ipaddress.IPv4Address(value)


def _spelled_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped or IPv4-compatible IPv6 address only spells."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _COMPATIBLE and int(address) > 1:  # not :: or ::1
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _ipv6(text: str) -> Host:
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        raise ValueError("host is not a valid IPv6 address") from None
    spelled = _spelled_ipv4(address)
    if spelled is not None:
        raise ValueError(
            f"host is the IPv4 address {spelled} written as IPv6; write it as {spelled}"
        )
    return Host(str(address), address)


def parse_host(text: str) -> Host:
    """Parse a URL's host (IPv6 without its brackets, as urlsplit gives it); raises
    ValueError naming the problem, and the canonical address for another spelling."""
    if "%" in text:
        raise ValueError("host must not be percent-encoded or carry an IPv6 zone id")
    if not text.isascii():
        raise ValueError("host must be ASCII: write an internationalised name as its xn-- form")
    lowered = text.lower()
    if ":" in lowered:
        return _ipv6(lowered)
    labels = lowered.split(".")
    trailing_dot = len(labels) > 1 and labels[-1] == ""
    if trailing_dot:
        labels.pop()
    if _ends_in_number(labels):
        address = inet_aton(labels)
        if address is None:
            raise ValueError("host ends in a number but is not an IPv4 address")
        if trailing_dot or ".".join(labels) != str(address):
            raise ValueError(f"host is {address} written in another form; write it as {address}")
        return Host(str(address), address)
    name = ".".join(labels)
    if len(name) > _NAME_MAX or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(
            "host is not a valid name (letters, digits, '-' and '_' in labels of 1-63)"
        )
    return Host(name + "." if trailing_dot else name)


def carried_ipv4(address: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """IPv4 addresses an IPv6 address stands for (IPv4-mapped or -compatible) or
    reaches through a translator or tunnel (NAT64, SIIT, 6to4, Teredo's client): a
    guard judges them too."""
    if isinstance(address, ipaddress.IPv4Address):
        return ()
    carried = []
    spelled = _spelled_ipv4(address)
    if spelled is not None:
        carried.append(spelled)
    if any(address in net for net in _TRANSLATED):
        carried.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        carried.append(address.sixtofour)
    if address.teredo is not None:
        carried.append(address.teredo[1])
    return tuple(carried)
