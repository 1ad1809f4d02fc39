"""A route → the text of one nginx include for the `http {}` context (pure).

One file per service holds everything nginx needs for it:

- an `upstream` block per variant (`keepalive` connections to it);
- `map`s choosing the sticky unit: the sticky header, else the sticky cookie, else
  `$request_id`, so that requests without a unit spread at random;
- a `split_clients` on `"<salt>:<unit>"` laid out like the sidecar's BucketLayout
  (sidecar/assignment.py): the variants other than the baseline first, in route
  order, the baseline last, zero-weight variants left out, each part's percentage
  with two decimals (exactly its basis points) and the last part written `*`;
  nginx hashes with MurmurHash2, not the sidecar's blake2b, so a unit's variant
  behind nginx is predicted by split.py, not assignment.py;
- the forced variant (`x-canary-force`), only when allowed and only for the route's
  own variant names (matched exactly: nginx's plain map keys ignore case);
- a `server` on the service's address proxying to the chosen variant, tagging the
  request and the response with `X-Canary-Variant` / `X-Canary-Experiment`, and
  sending its access log as JSON datagrams (log_format.py) to the log receiver;
- a `server` on a loopback port answering `GET /.canary/in-force` with the route in
  force (`{"service","experiment","revision"}`), so the router reads what nginx has
  loaded, not what it last wrote.

Without a route the service's server answers 503. Every value comes from a validated
Route; it is checked again here and quoted (`"`, `\\`) wherever it is written, and a
value that nginx would read as a variable (`$`) or a keyword is refused or escaped.
A route nginx cannot serve (an HTTP/2 upstream, a sticky header nginx cannot read)
raises ValueError naming the problem.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Final

from controlplane.kernel.hosts import parse_host
from controlplane.kernel.routes import BASELINE, Route
from controlplane.kernel.values import split_upstream
from routers.nginx.log_format import log_format
from routers.samples.token import LogToken
from routers.seam import EXPERIMENT_HEADER, FORCE_HEADER, VARIANT_HEADER

STATUS_PATH: Final = "/.canary/in-force"
SYSLOG_TAG: Final = "canary"
DEFAULT_CA: Final = "/etc/ssl/certs/ca-certificates.crt"

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_TOKEN = re.compile(r"[A-Za-z0-9._-]{1,64}")
# nginx keeps only headers of letters, digits and '-' (ignore_invalid_headers), and
# `$http_<name>` can spell no other character
_HEADER = re.compile(r"[A-Za-z0-9-]{1,64}")
# cookie names are RFC 9110 tokens; every character but letters and digits is
# escaped in the regex
_COOKIE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
_VARIABLE_MAX: Final = 46
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,250}")
_LONGEST_SUFFIX: Final = "unit_cookie"
_PORT = re.compile(r"[0-9]{1,5}")
_IDENT_CHARS: Final = {".": "_d", "-": "_h", "_": "_u"}
_PORTS: Final = {"http": 80, "https": 443}


def _canonical(header: str) -> str:
    return "-".join(part.capitalize() for part in header.split("-"))


_VARIANT_HEADER: Final = _canonical(VARIANT_HEADER)  # X-Canary-Variant
_EXPERIMENT_HEADER: Final = _canonical(EXPERIMENT_HEADER)


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """Where and how nginx serves one service.

    `listen` and `status_listen` are `host:port` (`[v6]:port`); the status server must
    be on a loopback address. `log_target` is the UDP `host:port` of the log
    receiver (None: no access log); `log_token` the agent's secret every line carries
    (None: the lines carry none, and its parser refuses them as forged).
    `keepalive` is the idle connections each worker keeps per variant (0: none).
    """

    service: str
    listen: str
    status_listen: str
    log_target: str | None = None
    allow_force: bool = False
    # idle upstream connections each worker keeps per variant: above this many
    # requests in flight nginx opens and closes one per request (at 16 and 50 in
    # flight: 29,300 requests/s against 50,500 at 128, a TIME-WAIT socket each)
    keepalive: int = 128
    trusted_ca: str = DEFAULT_CA
    # served while no route is in force, as a sidecar's --default-upstream (http only)
    default_upstream: str | None = None
    log_token: LogToken | None = None


def ident(name: str) -> str:
    """A service or variant name as an nginx identifier (`[a-zA-Z0-9_]`), one-to-one:
    `.`, `-` and `_` become `_d`, `_h` and `_u`, so `__` never occurs inside one."""
    if not _NAME.fullmatch(name):
        raise ValueError("a service or variant name must match [a-z0-9][a-z0-9._-]{0,63}")
    return "".join(_IDENT_CHARS.get(char, char) for char in name)


def variable_prefix(service: str) -> str:
    """The prefix of the service's nginx variables, one per service.

    nginx hashes variable names into buckets of 64 bytes (variables_hash_bucket_size,
    an http-wide setting this file must not own), which holds names of at most 46
    characters. A short service keeps its readable ident (`canary_pay_hapi__`); a
    long one is named by a 64-bit digest after a second `_` (`canary__3f…__`), which
    no ident starts with, so the two forms never meet.
    """
    readable = f"canary_{ident(service)}__"
    if len(readable) + len(_LONGEST_SUFFIX) <= _VARIABLE_MAX:
        return readable
    return f"canary__{hashlib.blake2b(service.encode(), digest_size=8).hexdigest()}__"


def quote(text: str) -> str:
    """A double-quoted nginx string of printable ASCII and newlines (`"`, `\\` and
    the newline escaped)."""
    if not all(" " <= char <= "~" or char == "\n" for char in text):
        raise ValueError("nginx config values must be printable ASCII")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def literal(text: str) -> str:
    """A quoted string in a place nginx expands variables in: `$` is refused."""
    if "$" in text:
        raise ValueError("a value written where nginx expands variables must not contain '$'")
    return quote(text)


@dataclass(frozen=True, slots=True)
class Var:
    """An nginx variable placed in a `script` string."""

    name: str


def script(*pieces: str | Var) -> str:
    """A quoted string nginx expands: text pieces as `literal` (no `$`), variables as
    `${name}`."""
    out: list[str] = []
    for piece in pieces:
        if isinstance(piece, Var):
            if not _VARIABLE_NAME.fullmatch(piece.name):
                raise ValueError("an nginx variable name must be letters, digits and '_'")
            out.append("${" + piece.name + "}")
        else:
            out.append(literal(piece)[1:-1])
    return '"' + "".join(out) + '"'


def map_key(text: str) -> str:
    """A plain map key; the leading `\\` keeps `default`, `include`, `hostnames` or
    `volatile` from being read as the map's own parameters."""
    return quote("\\" + text)


def exact_regex(text: str) -> str:
    """A case-sensitive regex map key matching exactly `text`."""
    return quote("~^" + _regex_escape(text) + "$")


def _regex_escape(text: str) -> str:
    return "".join(char if char.isalnum() else "\\" + char for char in text)


def _token(text: str, what: str) -> str:
    if not _TOKEN.fullmatch(text):
        raise ValueError(f"{what} must be 1-64 letters, digits, '.', '_' or '-'")
    return text


def address(text: str, *, what: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` → (host for nginx, port); a name or an address."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{what} must be HOST:PORT with a port 1-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    parsed = parse_host(host)
    name = f"[{parsed.name}]" if ":" in parsed.name else parsed.name
    return name, int(port_text)


@dataclass(frozen=True, slots=True)
class _Target:
    """One variant's upstream as nginx proxies to it."""

    scheme: str
    server: str  # host:port for the upstream block
    authority: str  # the Host header
    sni: str  # the TLS server name (https)
    prefix: str  # "" or /path without the trailing slash


def _target(url: str) -> _Target:
    parts = split_upstream(url)
    if parts.scheme in ("h2c", "h2"):
        raise ValueError(
            f"nginx cannot proxy to an HTTP/2 upstream ({parts.scheme}://): "
            "its proxy speaks HTTP/1.x to upstreams"
        )
    host = f"[{parts.host.name}]" if ":" in parts.host.name else parts.host.name
    port = parts.port if parts.port is not None else _PORTS[parts.scheme]
    authority = host if port == _PORTS[parts.scheme] else f"{host}:{port}"
    return _Target(
        parts.scheme, f"{host}:{port}", authority, parts.host.bare, parts.path.rstrip("/")
    )


def _loopback(text: str) -> str:
    host, port = address(text, what="the status address")
    try:
        if not ipaddress.ip_address(host.strip("[]")).is_loopback:
            raise ValueError
    except ValueError:
        raise ValueError("the status address must be a loopback IP address") from None
    return f"{host}:{port}"


def _pct(bp: int) -> str:
    return f"{bp // 100}.{bp % 100:02d}%"


def split_parts(route: Route) -> list[tuple[str, int]]:
    """(variant, basis points) in split_clients order: BucketLayout's order (every
    variant but the baseline in route order, then the baseline, by name or else the
    first), zero weights left out."""
    names = [v.name for v in route.variants]
    base = names.index(BASELINE) if BASELINE in names else 0
    ordered = [v for i, v in enumerate(route.variants) if i != base]
    ordered.append(route.variants[base])
    return [(v.name, v.weight) for v in ordered if v.weight > 0]


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str = "", depth: int = 0) -> None:
        self.lines.append("    " * depth + text if text else "")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(route: Route | None, options: RenderOptions) -> str:
    """The include file for one service; raises ValueError if nginx cannot serve it."""
    svc = ident(options.service)
    var = variable_prefix(options.service)
    listen_host, listen_port = address(options.listen, what="the listen address")
    status = _loopback(options.status_listen)
    if not 0 <= options.keepalive <= 10_000:
        raise ValueError("keepalive must be 0-10000 connections")
    out = _Writer()
    out.line(f"# canary route for service {options.service}: generated, do not edit")
    experiment = "" if route is None else _token(str(route.experiment), "the experiment")
    header_var = cookie_var = variant_var = None
    if route is not None:
        header_var, cookie_var, variant_var = _route_maps(out, route, options, var, svc)
    fmt = log_format(
        token="" if options.log_token is None else options.log_token.value,
        service=options.service,
        experiment=experiment,
        salt="" if route is None else _token(route.salt, "the salt"),
        variant_var=variant_var,
        header_var=header_var,
        cookie_var=cookie_var,
    )
    out.line(f"log_format {var}log escape=json {quote(fmt)};")
    out.line()
    out.line("server {")
    out.line(f"listen {listen_host}:{listen_port};", 1)
    if options.log_target is not None:
        log_host, log_port = address(options.log_target, what="the log target")
        sink = f"syslog:server={log_host}:{log_port},nohostname,tag={SYSLOG_TAG}"
        out.line(f"access_log {quote(sink)} {var}log;", 1)
    else:
        out.line("access_log off;", 1)
    out.line("location / {", 1)
    if route is None and options.default_upstream is not None:
        _proxy_default(out, options.default_upstream)
    elif route is None:
        out.line("default_type text/plain;", 2)
        body = f"no canary route for service {options.service}\n"
        out.line(f"return 503 {literal(body)};", 2)
    else:
        _proxy(out, route, options, var)
    out.line("}", 1)
    out.line("}")
    out.line()
    _status_server(out, options.service, status, route)
    return out.text()


def _status_server(out: _Writer, service: str, listen: str, route: Route | None) -> None:
    """`GET /.canary/in-force` on a loopback port: the route nginx has loaded, and
    the worker's pid, which tells the router which master answered (workers.py)."""
    experiment = "null" if route is None else f'"{_token(str(route.experiment), "experiment")}"'
    revision = "null" if route is None else str(route.revision)
    answer = f'{{"service":"{service}","experiment":{experiment},"revision":{revision},"worker":'
    out.line("server {")
    out.line(f"listen {listen};", 1)
    out.line("access_log off;", 1)
    out.line(f"location = {STATUS_PATH} {{", 1)
    out.line("default_type application/json;", 2)
    body = script(answer, Var("pid"), "}\n")
    out.line(f"return 200 {body};", 2)
    out.line("}", 1)
    out.line("location / {", 1)
    out.line("return 404;", 2)
    out.line("}", 1)
    out.line("}")


def _route_maps(
    out: _Writer, route: Route, options: RenderOptions, var: str, svc: str
) -> tuple[str | None, str | None, str]:
    """Upstreams and the maps that choose a variant; returns the variable names of
    the raw sticky header, the sticky cookie and the chosen variant."""
    targets = {v.name: _target(v.upstream) for v in route.variants}
    out.line(f"# experiment {route.experiment}, revision {route.revision}")
    for variant in route.variants:
        out.line()
        out.line(f"upstream canary_{svc}__{ident(variant.name)} {{")
        out.line(f"server {quote(targets[variant.name].server)};", 1)
        if options.keepalive:
            out.line(f"keepalive {options.keepalive};", 1)
        out.line("}")
    out.line()
    header_var = cookie_var = None
    sticky = route.sticky
    if sticky.header is not None:
        if not _HEADER.fullmatch(sticky.header):
            raise ValueError("nginx reads only sticky header names of letters, digits and '-'")
        header_var = "http_" + sticky.header.lower().replace("-", "_")
    if sticky.cookie is not None:
        if not _COOKIE.fullmatch(sticky.cookie):
            raise ValueError("the sticky cookie name must be an HTTP token")
        cookie_var = f"{var}cookie"
        # the first pair of that name, as sidecar/routing.py's cookie_value reads it:
        # spaces around the name and the value dropped, one pair of quotes removed
        pattern = (
            "~(?:^|;)\\s*" + _regex_escape(sticky.cookie) + '\\s*=\\s*("?)([^;]*?)\\1\\s*(?:;|$)'
        )
        out.line(f"map $http_cookie ${cookie_var} {{")
        out.line(f"{quote(pattern)} $2;", 1)
        out.line('default "";', 1)
        out.line("}")
    fallback = "request_id"
    if cookie_var is not None:
        out.line(f"map ${cookie_var} ${var}unit_cookie {{")
        out.line(f'"" ${fallback};', 1)
        out.line(f"default ${cookie_var};", 1)
        out.line("}")
        fallback = f"{var}unit_cookie"
    unit_var = fallback
    if header_var is not None:
        unit_var = f"{var}unit"
        out.line(f"map ${header_var} ${unit_var} {{")
        out.line(f'"" ${fallback};', 1)
        out.line(f"default ${header_var};", 1)
        out.line("}")
    salt = _token(route.salt, "the salt")
    # Maps and the split choose a slot, the variant's index in the route: short
    # keys, since nginx hashes a map's plain keys into buckets of 64 bytes by
    # default (map_hash_bucket_size, an http-wide setting this file must not own)
    # and a variant name may be 64 characters long.
    slot = {v.name: str(i) for i, v in enumerate(route.variants)}
    parts = split_parts(route)
    key = script(f"{salt}:", Var(unit_var))
    out.line(f"split_clients {key} ${var}split {{")
    for index, (name, bp) in enumerate(parts):
        share = "*" if index == len(parts) - 1 else _pct(bp)
        out.line(f"{share} {quote(slot[name])};  # {name}", 1)
    out.line("}")
    out.line(f"map $http_{FORCE_HEADER.replace('-', '_')} ${var}forced {{")
    out.line('default "";', 1)
    if options.allow_force:
        for variant in route.variants:
            out.line(f"{exact_regex(variant.name)} {quote(slot[variant.name])};", 1)
    out.line("}")
    out.line(f"map ${var}forced ${var}slot {{")
    out.line(f'"" ${var}split;', 1)
    out.line(f"default ${var}forced;", 1)
    out.line("}")
    # per variant: its name, where to proxy (the upstream block by name, then the
    # path prefix), the Host header (the upstream's authority, as the sidecar
    # sends it) and the TLS server name
    per_variant = {
        "variant": {n: n for n in targets},
        "target": {
            n: f"{t.scheme}://canary_{svc}__{ident(n)}{t.prefix}" for n, t in targets.items()
        },
        "host": {n: t.authority for n, t in targets.items()},
        "sni": {n: t.sni for n, t in targets.items()},
    }
    for suffix, values in per_variant.items():
        out.line(f"map ${var}slot ${var}{suffix} {{")
        for name, value in values.items():
            out.line(f"{map_key(slot[name])} {literal(value)};", 1)
        out.line("}")
    variant_var = f"{var}variant"
    return header_var, cookie_var, variant_var


def _proxy_default(out: _Writer, upstream: str) -> None:
    """No route: every request to the default upstream, tagged `default` as a
    sidecar tags it; its log lines carry no experiment (unattributed)."""
    target = _target(upstream)
    if target.scheme != "http" or "$" in target.prefix:
        raise ValueError("the default upstream must be an http:// URL without '$'")
    out.line(f"proxy_pass http://{target.server}{target.prefix}$request_uri;", 2)
    out.line("proxy_http_version 1.1;", 2)
    out.line(f"proxy_set_header Host {literal(target.authority)};", 2)
    out.line('proxy_set_header Connection "";', 2)
    out.line(f"proxy_set_header {_VARIANT_HEADER} default;", 2)
    out.line(f"proxy_hide_header {_VARIANT_HEADER};", 2)
    out.line(f"add_header {_VARIANT_HEADER} default always;", 2)


def _proxy(out: _Writer, route: Route, options: RenderOptions, var: str) -> None:
    experiment = literal(str(route.experiment))
    out.line(f"proxy_pass ${var}target$request_uri;", 2)
    out.line("proxy_http_version 1.1;", 2)
    out.line(f"proxy_set_header Host ${var}host;", 2)
    out.line('proxy_set_header Connection "";', 2)
    out.line("proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;", 2)
    out.line("proxy_set_header X-Forwarded-Proto $scheme;", 2)
    out.line(f"proxy_set_header {_VARIANT_HEADER} ${var}variant;", 2)
    out.line(f"proxy_set_header {_EXPERIMENT_HEADER} {experiment};", 2)
    # the upstream's own tags would repeat ours on the response
    out.line(f"proxy_hide_header {_VARIANT_HEADER};", 2)
    out.line(f"proxy_hide_header {_EXPERIMENT_HEADER};", 2)
    out.line(f"add_header {_VARIANT_HEADER} ${var}variant always;", 2)
    out.line(f"add_header {_EXPERIMENT_HEADER} {experiment} always;", 2)
    if any(split_upstream(v.upstream).scheme == "https" for v in route.variants):
        out.line("proxy_ssl_server_name on;", 2)
        out.line(f"proxy_ssl_name ${var}sni;", 2)
        out.line("proxy_ssl_verify on;", 2)
        out.line(f"proxy_ssl_trusted_certificate {literal(options.trusted_ca)};", 2)


__all__ = [
    "STATUS_PATH",
    "RenderOptions",
    "address",
    "ident",
    "literal",
    "quote",
    "render",
    "split_parts",
]
