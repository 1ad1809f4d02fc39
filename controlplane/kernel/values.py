"""Value types shared by every reader of a value: the API, the controller, the sidecars.

Each type is an Annotated pydantic type carrying its own bounds, so a value means the
same wherever it is parsed (an API body, a route or rule read back from etcd, a CLI
file). What the API accepts, a sidecar or the controller accepts too, and nothing the
API refuses can be written through it.

Principles:
- numbers are finite and bounded above, so arithmetic on them (a timestamp plus a
  cooldown, a window count) stays finite and inside datetime's range;
- numbers are strict: `true` is not 1 and `"5"` is not 5;
- names a human reads (experiment names, reasons) are printable: no control,
  format or terminal escape characters, bounded length;
- names that reach the wire (sticky header and cookie names) are RFC 9110 tokens;
- names that become etcd keys match a strict pattern;
- upstream URLs are http(s) with a host and nothing that a sidecar would refuse
  (userinfo, query, fragment, a port out of range, a host in any but its one canonical
  spelling: controlplane.kernel.hosts).
"""

from __future__ import annotations

import ipaddress
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Final
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field

from controlplane.kernel.hosts import Host, IPAddress, carried_ipv4, parse_host

# --- numbers -------------------------------------------------------------------------

# SQL offsets: the signed 64-bit range every supported database can compare against
# (SQLite's INTEGER, PostgreSQL's BIGINT); anything larger overflows the driver.
SQL_INT_MAX: Final = 2**63 - 1
# Row ids are PostgreSQL INTEGER columns (32-bit): a larger id names no row, and
# PostgreSQL refuses to even compare it with the column.
SQL_ID_MAX: Final = 2**31 - 1

# Route revisions are stored in experiments.route_revision, a 32-bit INTEGER on
# PostgreSQL: a revision the control plane could never write is refused everywhere.
# One publish a second would take 68 years to get there.
ROUTE_REVISION_MAX: Final = 2**31 - 1

DAY_SEC: Final = 24 * 3600
# The longest duration any rule or step may name (cooldowns, holds, timeouts). A year
# keeps `now + duration` far inside datetime's range (year 9999) and float precision.
MAX_DURATION_SEC: Final = 365 * DAY_SEC
MAX_THRESHOLD_MS: Final = 3_600_000.0  # an hour: beyond it, a latency bound means "off"
MAX_COUNT: Final = 1_000_000_000  # sample counts, trips: well within 64-bit sums


SqlId = Annotated[int, Field(strict=True, ge=1, le=SQL_ID_MAX)]
RouteRevision = Annotated[int, Field(strict=True, ge=0, le=ROUTE_REVISION_MAX)]


def in_sql_range(value: int) -> bool:
    """Whether a row id can be looked up at all (out of range is simply not there)."""
    return 1 <= value <= SQL_ID_MAX


# --- text ----------------------------------------------------------------------------


def unprintable(text: str) -> str | None:
    """The first character a terminal or log would not show as itself, if any.

    Unicode category C covers C0/C1 controls (CR, LF, ESC of terminal escapes, DEL),
    format characters (bidirectional overrides, zero-width joiners), surrogates,
    private-use and unassigned code points.
    """
    for char in text:
        if unicodedata.category(char).startswith("C"):
            return char
    return None


def _printable(value: str) -> str:
    bad = unprintable(value)
    if bad is not None:
        raise ValueError(f"must not contain control or format characters (found U+{ord(bad):04X})")
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def _printable_or_empty(value: str) -> str:
    return _printable(value) if value else value


DisplayName = Annotated[
    str,
    Field(min_length=1, max_length=128, examples=["payments v2 rollout"]),
    AfterValidator(_printable),
]
Reason = Annotated[
    str,
    Field(max_length=1000, description="recorded in the event; printable, one line"),
    AfterValidator(_printable_or_empty),
]

SERVICE_PATTERN: Final = r"^[a-z0-9][a-z0-9._-]{0,62}$"
ServiceName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=63,
        pattern=SERVICE_PATTERN,
        description="lower-case letters, digits, '.', '_' or '-', 1-63 characters",
        examples=["payment-api"],
    ),
]
VARIANT_PATTERN: Final = r"^[a-z0-9][a-z0-9._-]{0,63}$"
VariantName = Annotated[str, Field(min_length=1, max_length=64, pattern=VARIANT_PATTERN)]
# a release's label: a tag, a semantic version or a commit, as a team names its builds
VERSION_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$"
VersionLabel = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=VERSION_PATTERN,
        description="letters, digits, '.', '_', '+' or '-', 1-64 characters",
        examples=["v2.4.1"],
    ),
]

# RFC 9110 §5.6.2 token (also RFC 6265's cookie-name): no CR/LF, spaces, separators.
TOKEN_PATTERN: Final = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"
TOKEN_MAX: Final = 64
HttpToken = Annotated[
    str,
    Field(
        min_length=1,
        max_length=TOKEN_MAX,
        pattern=TOKEN_PATTERN,
        description="an RFC 9110 token, 1-64 characters",
    ),
]

SALT_PATTERN: Final = r"^[A-Za-z0-9._-]{1,64}$"
Salt = Annotated[str, Field(min_length=1, max_length=64, pattern=SALT_PATTERN)]
# A route names its experiment by SQL id, or by a hand-written name (bounded, printable).
# a route's experiment: the SQL id, or a name given by hand; either becomes a Redis key
# (the collectors check sample batches against this same pattern)
EXPERIMENT_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
RouteExperiment = (
    SqlId | Annotated[str, Field(min_length=1, max_length=64, pattern=EXPERIMENT_ID_PATTERN)]
)


# --- upstream URLs -------------------------------------------------------------------

URL_MAX: Final = 2048
# h2c: HTTP/2 in clear text with prior knowledge, h2: HTTP/2 over TLS (gRPC services
# are either); the upstream must speak HTTP/2, the sidecar does not fall back
_SCHEMES: Final = ("http", "https", "h2c", "h2")


@dataclass(frozen=True, slots=True)
class UpstreamParts:
    scheme: str
    host: Host
    port: int | None
    path: str


def split_upstream(
    url: str, *, what: str = "upstream", schemes: tuple[str, ...] = _SCHEMES
) -> UpstreamParts:
    """Check an upstream URL's shape; raises ValueError that never echoes the URL.

    The message must not repeat the value: a refused URL may carry a password.
    """
    if len(url) > URL_MAX:
        raise ValueError(f"{what} URL longer than {URL_MAX} characters")
    if unprintable(url) is not None or any(c.isspace() for c in url):
        raise ValueError(f"{what} URL must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(f"{what} URL is malformed (bad host or port)") from None
    prefixes = tuple(f"{scheme}://" for scheme in schemes)
    if parts.scheme.lower() not in schemes or not url.lower().startswith(prefixes):
        raise ValueError(f"{what} URL must start with {', '.join(prefixes[:-1])} or {prefixes[-1]}")
    if "@" in parts.netloc:
        raise ValueError(f"{what} URL must not carry credentials (user:password@)")
    if not parts.hostname:
        raise ValueError(f"{what} URL has no host")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError(f"{what} URL must not carry a query or fragment")
    if port is not None and port == 0:
        raise ValueError(f"{what} URL port must be 1-65535")
    try:
        host = parse_host(parts.hostname)
    except ValueError as exc:
        raise ValueError(f"{what} URL {exc}") from None
    return UpstreamParts(parts.scheme.lower(), host, port, parts.path)


def _upstream(value: str) -> str:
    split_upstream(value)
    return value  # kept exactly as written


UpstreamUrl = Annotated[
    str,
    Field(
        min_length=8,
        max_length=URL_MAX,
        description="http(s)://, h2c:// (HTTP/2 clear text) or h2:// (HTTP/2 over TLS) "
        "host[:port][/prefix], no credentials, query or fragment",
        examples=["http://payments-v2:8080"],
    ),
    AfterValidator(_upstream),
]


def split_webhook(url: str) -> UpstreamParts:
    """Check a webhook URL: an upstream URL's rules, over HTTP/1.1 only."""
    return split_upstream(url, what="webhook", schemes=("http", "https"))


def _webhook(value: str) -> str:
    split_webhook(value)
    return value  # kept exactly as written


WebhookUrl = Annotated[
    str,
    Field(
        min_length=8,
        max_length=URL_MAX,
        description="where to POST: http(s)://host[:port][/path], no credentials, query "
        "or fragment",
        examples=["https://hooks.example.com/canary"],
    ),
    AfterValidator(_webhook),
]


# --- which upstream hosts may be named ------------------------------------------------

# Cloud metadata services and link-local space: an upstream there turns the proxy
# into a way to read instance credentials. Refused unless explicitly allowed, whatever
# the spelling (controlplane.kernel.hosts) and, for webhooks, whatever a name
# resolves to when the request is sent (controlplane.notify.connect).
METADATA_HOSTS: Final = frozenset({"metadata.google.internal", "metadata"})
METADATA_NETWORKS: Final = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),
    ipaddress.ip_network("100.100.100.200/32"),  # Alibaba Cloud's metadata service
)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def is_metadata_address(address: IPAddress) -> bool:
    """Whether `address`, or an IPv4 address it carries, is link-local or metadata."""
    return any(
        candidate in net
        for candidate in (address, *carried_ipv4(address))
        for net in METADATA_NETWORKS
    )


@dataclass(frozen=True)
class UpstreamPolicy:
    """Which hosts an upstream may name: empty `hosts`/`networks` = any host, except
    link-local and metadata addresses, which only an explicit entry admits.

    `what` and `setting` name the URL and the allow-list in refusals (the same rules
    guard the webhooks notifications are sent to, under their own setting)."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()
    what: str = "upstream"
    setting: str = "CANARY_UPSTREAM_ALLOW"

    @classmethod
    def parse(
        cls, text: str, *, what: str = "upstream", setting: str = "CANARY_UPSTREAM_ALLOW"
    ) -> UpstreamPolicy:
        """`host,10.0.0.0/8,…` (CANARY_UPSTREAM_ALLOW); raises ValueError on a bad entry."""
        hosts: set[str] = set()
        networks: list[Network] = []
        for raw in text.split(","):
            entry = raw.strip().lower()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            try:
                host = parse_host(entry)
            except ValueError as exc:
                raise ValueError(f"{what} allow-list entry {entry!r}: {exc}") from None
            if host.address is not None:
                networks.append(ipaddress.ip_network(host.address))
            else:
                hosts.add(host.bare)
        return cls(frozenset(hosts), tuple(networks), what, setting)

    @property
    def restricted(self) -> bool:
        return bool(self.hosts or self.networks)

    def _listed(self, address: IPAddress) -> bool:
        return any(address in net for net in self.networks)

    def refusal(self, host: Host) -> str | None:
        """Why `host` may not be named, or None. Host names are not resolved here."""
        if host.bare in self.hosts or (host.address is not None and self._listed(host.address)):
            return None
        if host.bare in METADATA_HOSTS or (
            host.address is not None and is_metadata_address(host.address)
        ):
            return f"{self.what} host is a link-local or cloud metadata address"
        if self.restricted:
            return f"{self.what} host is not in the allowed hosts ({self.setting})"
        return None

    def address_refusal(self, host: Host, address: IPAddress) -> str | None:
        """Why a connection to `address`, which `host` resolved to, may not be made: the
        check at connect time, after `refusal` admitted the host itself."""
        if host.bare in self.hosts or self._listed(address):
            return None
        if is_metadata_address(address):
            return f"{self.what} host resolves to a link-local or cloud metadata address"
        return None

    def refusals(self, urls: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """(label, reason) for each (label, url) whose host is refused."""
        found = []
        for label, url in urls:
            reason = self.refusal(split_upstream(url).host)
            if reason is not None:
                found.append((label, reason))
        return found
