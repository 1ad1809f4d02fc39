"""The etcd endpoints setting (CANARY_ETCD / --etcd), parsed strictly in one place.

Forms, as etcdctl's ``--endpoints`` takes them:

- ``host:port`` — one member, or one DNS name that resolves to every member;
- ``h1:p1,h2:p2,h3:p3`` — the members of a cluster, by name or IP address;
- each may carry ``http://`` or ``https://`` (all https, or none).

Each member gets a gRPC channel of its own, and the store takes them in turn, so a
call refused by a lost member is made again on another (decision 0029). Kept free
of grpc (and of pydantic) so that the settings can check the value at start-up and
the CLI can show the forms cheaply.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from controlplane.kernel.errors import ConfigError

# the forms CANARY_ETCD / --etcd take, for the settings and the CLI's help
ENDPOINTS_HELP = (
    "etcd member(s): host:port, or h1:p1,h2:p2,… for a cluster's members, each "
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
    def targets(self) -> tuple[str, ...]:
        """A gRPC target per member, each through DNS (which takes IP literals too)."""
        return tuple(f"dns:///{_join(host, port)}" for host, port in self.members)


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
    return scheme, (_canonical_host(host, item), port)


def _canonical_host(host: str, item: str) -> str:
    """One spelling per host, so that a member listed twice is caught."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if not (0 < len(host) <= 253 and all(_LABEL.fullmatch(label) for label in labels)):
        raise ConfigError(f"etcd endpoint {item!r}: {host!r} is not a host name or IP address")
    name = host.lower().rstrip(".")
    return "127.0.0.1" if name == "localhost" else name


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
