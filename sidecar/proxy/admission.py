"""Who may open one more client connection: the global cap and the per-client cap.

A connection is counted from accept until it closes, a TLS handshake included, so
neither idle TCP connections nor half-open handshakes can hold descriptors beyond
the caps. One client is one IPv4 address, or one IPv6 network of a configurable
prefix (an IPv6 host often holds a whole /64); an IPv4 address mapped into IPv6 (a
dual-stack listener) counts as the IPv4 address.
"""

from __future__ import annotations

import ipaddress
from typing import Final

MAX_CONNECTIONS: Final = "max_connections"
PER_CLIENT: Final = "per_client"

_MAPPED: Final = b"::ffff:"


def client_key(ip: bytes, ipv6_prefix: int) -> bytes:
    """What `ip` (a peer address as text) is counted under."""
    if b":" not in ip:
        return ip
    if ip.startswith(_MAPPED) and b"." in ip:
        return ip[len(_MAPPED) :]
    if ipv6_prefix >= 128:
        return ip
    try:
        address = ipaddress.IPv6Address(ip.decode("ascii").partition("%")[0])
    except ValueError:
        return ip
    network = int(address) >> (128 - ipv6_prefix)
    return b"%x/%d" % (network, ipv6_prefix)


class Admission:
    """Connections open (or handshaking), in all and per client."""

    __slots__ = ("_ipv6_prefix", "_per_client", "client_limit", "limit")

    def __init__(self, limit: int, client_limit: int, ipv6_prefix: int) -> None:
        self.limit = limit
        self.client_limit = client_limit  # 0: no per-client cap
        self._ipv6_prefix = ipv6_prefix
        self._per_client: dict[bytes, int] = {}

    def refusal(self, ip: bytes, open_now: int) -> str | None:
        """Why one more connection from `ip` is refused (`open_now` are open in all),
        or None: it is admitted and counted until `release(ip)`."""
        if open_now >= self.limit:
            return MAX_CONNECTIONS
        if not self.client_limit:
            return None
        key = client_key(ip, self._ipv6_prefix)
        held = self._per_client.get(key, 0)
        if held >= self.client_limit:
            return PER_CLIENT
        self._per_client[key] = held + 1
        return None

    def release(self, ip: bytes) -> None:
        """A connection admitted for `ip` closed."""
        if not self.client_limit:
            return
        key = client_key(ip, self._ipv6_prefix)
        held = self._per_client.get(key, 0)
        if held <= 1:
            self._per_client.pop(key, None)
        else:
            self._per_client[key] = held - 1

    def held(self, ip: bytes) -> int:
        """Connections counted for the client `ip` belongs to."""
        return self._per_client.get(client_key(ip, self._ipv6_prefix), 0)
