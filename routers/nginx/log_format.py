"""The access-log line nginx sends per request: one JSON object, one place.

The renderer writes it as a `log_format … escape=json` (render.py) and the parser
reads it back (log_lines.py); both take the field names from here. Constants (the
agent's log token, the service, experiment, salt) are written into the format as
text: they come from a LogToken or a validated route and are checked again to be
plain tokens, which JSON and nginx's script syntax both take as they are.
Variables are escaped by nginx (escape=json: `"`, `\\` and control bytes; other
bytes pass through raw).

    {"v":2,"token":"…","service":"…","experiment":"…","salt":"…","variant":"…",
     "status":200,"request_time":0.004,"upstream_header_time":"0.003",
     "msec":1765000000.123,"unit_header":"…","unit_cookie":"…",
     "connection":12,"connection_requests":3}

`upstream_header_time` is a string: nginx writes `-` when no upstream answered and
`a, b` (or `a : b`) when it tried several. Without a route every route field is "".

`token` is the agent's secret (routers/samples/token.py): the include is rendered
again on every apply, so a new agent's token is in force from its first apply;
until then nginx still writes the previous agent's (or, from the first include
`--print-config` writes, none), and those lines are refused as `forged`, counted.
`v` 1 had no token.
"""

from __future__ import annotations

import re
from typing import Final

VERSION: Final = 2
# numbers nginx writes itself (never empty, never quoted)
NUMERIC: Final = ("status", "request_time", "msec", "connection", "connection_requests")
# strings: the route's constants, then what nginx saw per request
TEXT: Final = (
    "token",
    "service",
    "experiment",
    "salt",
    "variant",
    "upstream_header_time",
    "unit_header",
    "unit_cookie",
)
KEYS: Final = frozenset(("v", *NUMERIC, *TEXT))

_CONSTANT = re.compile(r"[A-Za-z0-9._-]{0,64}")
_VARIABLE = re.compile(r"[a-z_][a-z0-9_]{0,250}")


def _constant(value: str) -> str:
    if not _CONSTANT.fullmatch(value):
        raise ValueError("a log field constant must be 0-64 letters, digits, '.', '_' or '-'")
    return f'"{value}"'


def _variable(name: str | None) -> str:
    if name is None:
        return '""'
    if not _VARIABLE.fullmatch(name):
        raise ValueError("an nginx variable name must be lower-case letters, digits and '_'")
    return f'"${{{name}}}"'


def log_format(
    *,
    token: str,
    service: str,
    experiment: str,
    salt: str,
    variant_var: str | None,
    header_var: str | None,
    cookie_var: str | None,
) -> str:
    """The format string (unquoted for nginx: the renderer quotes it)."""
    fields = (
        ("v", str(VERSION)),
        ("token", _constant(token)),
        ("service", _constant(service)),
        ("experiment", _constant(experiment)),
        ("salt", _constant(salt)),
        ("variant", _variable(variant_var)),
        ("status", "$status"),
        ("request_time", "$request_time"),
        ("upstream_header_time", '"$upstream_header_time"'),
        ("msec", "$msec"),
        ("unit_header", _variable(header_var)),
        ("unit_cookie", _variable(cookie_var)),
        ("connection", "$connection"),
        ("connection_requests", "$connection_requests"),
    )
    return "{" + ",".join(f'"{key}":{value}' for key, value in fields) + "}"


__all__ = ["KEYS", "NUMERIC", "TEXT", "VERSION", "log_format"]
