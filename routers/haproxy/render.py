"""The HAProxy base config a service's router starts from (pure: options → text).

HAProxy reads it once at start; after that the router changes only the map and the
servers' addresses and states, through the stats socket, never by reload. Per
request, everything comes from the map's one value (`route_value.py`):

- the sticky unit: the route's header (its first occurrence, as the sidecar takes
  it) if the route uses it and it is non-empty, else its cookie (HAProxy's
  `req.cook` takes the LAST of a name sent twice, where the sidecar takes the
  first), else none; a unit longer than MAX_UNIT bytes counts as none;
- bucket = xxh32("<salt>:<unit>", seed 0) mod 10000 (HAProxy's `xxh32` converter;
  `split.py` is the same in Python), or `rand(10000)` for a request without a unit;
- the variant: `x-canary-force` when forcing is rendered in and the route has that
  variant, else the first layout slot whose upper bound exceeds the bucket;
- `use_backend v_<variant>`; the variant and experiment headers both ways; no route
  in the map → 503 answered by HAProxy itself;
- the agent's log token, copied from the route value into a variable the log
  format writes (log_format.py). The config itself holds no token: it is printed
  once and outlives the agent that printed it.

Header and cookie NAMES cannot come from a map, so they are rendered in: a route may
use the base config's names or leave one out (a flag in the map), and a route naming
another header or cookie is refused by the router with a message to render a new
base config. Re-rendering and reloading on the fly would make the router own
HAProxy's process life; a sticky name changes with a new experiment's design, rarely
enough for an operator's restart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from controlplane.kernel.routes import BASELINE, CANARY
from routers.haproxy import route_value as rv
from routers.haproxy.log_format import MAX_LINE, log_format
from routers.haproxy.vars import BUCKET, EXPERIMENT, ROUTE, SALT, TOKEN, UNIT, VARIANT
from routers.seam import EXPERIMENT_HEADER, FORCE_HEADER, VARIANT_HEADER

SERVER: Final = "up"  # the one server of each variant's backend
MAX_UNIT: Final = 4096  # bytes of a sticky unit; longer counts as no unit
# a placeholder until the router sets the server's address; the server starts in
# maintenance, so nothing is ever sent there
PLACEHOLDER: Final = "127.0.0.1:1"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
_ADDR = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]*):[0-9]{1,5}$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./-]{1,1024}$")
_DURATION = re.compile(r"^[0-9]{1,9}(us|ms|s|m|h|d)?$")
_TIMEOUTS = frozenset({"connect", "client", "server", "http-request", "http-keep-alive", "queue"})


def backend_of(variant: str) -> str:
    return f"v_{variant}"


@dataclass(frozen=True, slots=True)
class BaseConfig:
    """What an operator declares for one service's HAProxy."""

    service: str
    listen: str  # "host:port" the frontend binds
    stats_socket: str  # unix socket path (admin level, mode 600)
    map_path: str
    variants: tuple[str, ...] = (BASELINE, CANARY)
    sticky_header: str | None = "x-user-id"
    sticky_cookie: str | None = None
    allow_force: bool = False
    log_target: str | None = None  # "host:port" of the UDP log receiver
    retries: int = 3  # connection retries to a variant's server (HAProxy's default)
    timeouts: tuple[tuple[str, str], ...] = (
        ("connect", "5s"), ("client", "30s"), ("server", "30s"), ("http-request", "10s"),
    )  # fmt: skip

    def __post_init__(self) -> None:
        if not _NAME.match(self.service):
            raise ValueError("service must be a service name (lower-case, digits, ._-)")
        if not 1 <= len(self.variants) <= 16 or len(set(self.variants)) != len(self.variants):
            raise ValueError("declare 1-16 distinct variants")
        for name in self.variants:
            if not _NAME.match(name):
                raise ValueError(f"variant {name!r} is not a variant name")
        for what, token in (("sticky header", self.sticky_header), ("cookie", self.sticky_cookie)):
            if token is not None and not _TOKEN.match(token):
                raise ValueError(f"{what} must be an HTTP token of 1-64 characters")
        for name, value in self.timeouts:
            if name not in _TIMEOUTS or not _DURATION.match(value):
                raise ValueError(f"timeout {name!r} must be one of HAProxy's, e.g. 5s or 500ms")
        if not 0 <= self.retries <= 100:
            raise ValueError("retries must be 0-100")
        if self.sticky_header is None and self.sticky_cookie is None:
            raise ValueError("declare a sticky header or a sticky cookie")
        for what, addr in (("listen", self.listen), ("log target", self.log_target)):
            if addr is not None and not _ADDR.match(addr):
                raise ValueError(f"{what} must be host:port")
        for what, path in (("stats socket", self.stats_socket), ("map", self.map_path)):
            if not _SAFE_PATH.match(path):
                raise ValueError(f"{what} path must be letters, digits and ._/- only")

    @property
    def header(self) -> str | None:
        return self.sticky_header.lower() if self.sticky_header else None


def render_config(cfg: BaseConfig) -> str:
    """The haproxy.cfg text for `cfg`."""
    lines = [
        "global",
        f"    stats socket {cfg.stats_socket} mode 600 level admin",
        "    stats timeout 10s",
        "",
        "defaults",
        "    mode http",
        f"    retries {cfg.retries}",
        *(f"    timeout {name} {value}" for name, value in cfg.timeouts),
        "",
        f"frontend {cfg.service}",
        f"    bind {cfg.listen}",
    ]
    if cfg.log_target is not None:
        lines += [
            f"    log {cfg.log_target} len {MAX_LINE} format raw local0",
            f'    log-format "{log_format(cfg.service)}"',
        ]
    lines += [f"    {rule}" for rule in _request_rules(cfg)]
    lines += [
        f"    use_backend {backend_of(name)} if {{ var({VARIANT}) -m str {name} }}"
        for name in cfg.variants
    ]
    lines += ["    default_backend no_route", ""]
    for name in cfg.variants:
        lines += [
            f"backend {backend_of(name)}",
            f"    server {SERVER} {PLACEHOLDER} disabled",
            "",
        ]
    lines += [
        "backend no_route",
        '    http-request return status 503 content-type text/plain string "no route"',
        "",
    ]
    return "\n".join(lines)


def render_map() -> str:
    """The map file at first start: empty, so no route is in force (503)."""
    return ""


def _request_rules(cfg: BaseConfig) -> Sequence[str]:
    m = cfg.map_path
    n = len(cfg.variants)

    def fld(i: int) -> str:
        return f"var({ROUTE}),field({i},{rv.SEP})"

    no_unit = f"!{{ var({UNIT}) -m found }}"
    rules = [
        # a client must not choose what the upstream or the logs are told
        f"http-request del-header {VARIANT_HEADER}",
        f"http-request del-header {EXPERIMENT_HEADER}",
        f"http-request set-var({ROUTE}) str({rv.KEY}),map({m})",
        'http-request return status 503 content-type text/plain string "no route" '
        f"if !{{ var({ROUTE}) -m found }}",
        f"http-request set-var({EXPERIMENT}) {fld(1)}",
        f"http-request set-var({SALT}) {fld(3)}",
        f"http-request set-var({TOKEN}) {fld(rv.TOKEN_FIELD)}",
    ]
    if cfg.header is not None:
        h = cfg.header
        rules.append(
            f"http-request set-var({UNIT}) req.fhdr({h},1) "
            f"if {{ {fld(4)} -m str 1 }} {{ req.fhdr({h},1) -m len 1:{MAX_UNIT} }}"
        )
    if cfg.sticky_cookie is not None:
        c = cfg.sticky_cookie
        rules.append(
            f"http-request set-var({UNIT}) req.cook({c}) "
            f"if {no_unit} {{ {fld(5)} -m str 1 }} {{ req.cook({c}) -m len 1:{MAX_UNIT} }}"
        )
    rules += [
        f"http-request set-var({BUCKET}) var({SALT}),concat(:,{UNIT}),xxh32,mod(10000) "
        f"if {{ var({UNIT}) -m found }}",
        f"http-request set-var({BUCKET}) rand(10000) if {no_unit}",
    ]
    if cfg.allow_force:
        rules += [
            f"http-request set-var({VARIANT}) str({name}) "
            f"if {{ req.fhdr({FORCE_HEADER},1) -m str {name} }} "
            f"{{ {fld(rv.force_field(j, n))} -m str 1 }}"
            for j, name in enumerate(cfg.variants)
        ]
    rules += [
        # bound - bucket > 0 ⇔ bucket < bound: the first such slot owns the bucket
        f"http-request set-var({VARIANT}) {fld(rv.slot_variant_field(i))} "
        f"if !{{ var({VARIANT}) -m found }} "
        f"{{ {fld(rv.slot_bound_field(i))},sub({BUCKET}) gt 0 }}"
        for i in range(n)
    ]
    rules += [
        f"http-request set-header {VARIANT_HEADER} %[var({VARIANT})]",
        f"http-request set-header {EXPERIMENT_HEADER} %[var({EXPERIMENT})]",
        f"http-response set-header {VARIANT_HEADER} %[var({VARIANT})]",
        f"http-response set-header {EXPERIMENT_HEADER} %[var({EXPERIMENT})]",
    ]
    return rules


__all__ = ["MAX_UNIT", "SERVER", "BaseConfig", "backend_of", "render_config", "render_map"]
