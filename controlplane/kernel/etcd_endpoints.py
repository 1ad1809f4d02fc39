"""The etcd endpoints setting (CANARY_ETCD / --etcd), parsed strictly in one place.

Forms, as etcdctl's ``--endpoints`` takes them:

- ``host:port`` — one member, or one DNS name that resolves to every member;
- ``h1:p1,h2:p2,h3:p3`` — the members of a cluster, as IP addresses;
- each may carry ``http://`` or ``https://`` (all https, or none).

Several members become one gRPC target ``ipv4:h1:p1,h2:p2,…`` balanced round-robin,
so a call refused by a lost member is retried on another (decision 0029). gRPC's
static multi-address target takes IP literals only, hence that rule. Kept free of
grpc (and of pydantic) so that the settings can check the value at start-up and the
CLI can show the forms cheaply.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from controlplane.kernel.errors import ConfigError

# the forms CANARY_ETCD / --etcd take, for the settings and the CLI's help
ENDPOINTS_HELP = (
    "etcd member(s): host:port, or h1:p1,h2:p2,… (IP addresses) for a cluster, each "
    "optionally http:// or https://; or memory:// in-process"
)
# etcd clusters have 3, 5 or 7 voting members; a longer list is a mistake.
MAX_ENDPOINTS = 16
_SCHEMES = ("http://", "https://")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class EtcdEndpoints:
    members: tuple[tuple[str, int], ...]
    tls: bool

    @property
    def target(self) -> str:
        """The gRPC target: one name goes through DNS, several IPs are balanced."""
        if len(self.members) == 1:
            host, port = self.members[0]
            return f"dns:///{_join(host, port)}"
        scheme = "ipv6" if ":" in self.members[0][0] else "ipv4"
        return f"{scheme}:" + ",".join(_join(host, port) for host, port in self.members)


def parse_endpoints(text: str) -> EtcdEndpoints:
    """Parse the setting; a ConfigError names the first thing wrong with it."""
    items = text.split(",")
    if len(items) > MAX_ENDPOINTS:
        raise ConfigError(f"{len(items)} etcd endpoints: at most {MAX_ENDPOINTS}")
    members: list[tuple[str, int]] = []
    schemes: set[str] = set()
    for raw in items:
        scheme, member = _parse_one(raw.strip())
        if member in members:
            raise ConfigError(f"etcd endpoint {raw.strip()!r} is listed twice")
        schemes.add(scheme)
        members.append(member)
    if "https://" in schemes and len(schemes) > 1:
        raise ConfigError("etcd endpoints mix https:// and plain ones")
    if len(members) > 1:
        _check_cluster_addresses(members)
    return EtcdEndpoints(members=tuple(members), tls=schemes == {"https://"})


def _parse_one(item: str) -> tuple[str, tuple[str, int]]:
    if not item:
        raise ConfigError("empty etcd endpoint (a stray comma?)")
    scheme = ""
    for known in _SCHEMES:
        if item.lower().startswith(known):
            scheme, item = known, item[len(known):]
            if item.endswith("/"):
                item = item[:-1]
            break
    else:
        if "://" in item:
            raise ConfigError(f"etcd endpoint {item!r}: expected host:port, http:// or https://")
    if any(mark in item for mark in "/?#@ "):
        raise ConfigError(f"etcd endpoint {item!r}: expected host:port, with no path or user")
    host, sep, port_text = item.rpartition(":")
    if not sep or not port_text.isdigit() or len(port_text) > 5:
        raise ConfigError(f"etcd endpoint {item!r}: expected host:port")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ConfigError(f"etcd endpoint {item!r}: port must be 1-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise ConfigError(f"etcd endpoint {item!r}: brackets are for IPv6 addresses")
    elif ":" in host:
        raise ConfigError(f"etcd endpoint {item!r}: write an IPv6 address as [address]:port")
    if not _is_host(host):
        raise ConfigError(f"etcd endpoint {item!r}: {host!r} is not a host name or IP address")
    return scheme, ("127.0.0.1" if host.lower() == "localhost" else host, port)


def _is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    return 0 < len(host) <= 253 and all(_LABEL.fullmatch(label) for label in labels)


def _check_cluster_addresses(members: list[tuple[str, int]]) -> None:
    versions = set()
    for host, _ in members:
        try:
            versions.add(ipaddress.ip_address(host).version)
        except ValueError:
            raise ConfigError(
                f"several etcd endpoints must be IP addresses, got {host!r}: "
                "give one DNS name that resolves to every member instead"
            ) from None
    if len(versions) > 1:
        raise ConfigError("etcd endpoints mix IPv4 and IPv6 addresses")


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
