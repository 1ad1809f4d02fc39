"""The one map entry that carries a route to HAProxy, and how its fields are laid out.

The map (`render.py`) holds a single key, `route`, or nothing (no route: 503). Its
value is every field a request needs, `|`-separated, so that a request reads the
route with ONE map lookup: several lookups could straddle a `commit map` on another
thread and mix two routes. Fields (1-based, as HAProxy's `field()` counts):

    1 experiment   2 revision   3 salt
    4 sticky header in use (1/0)   5 sticky cookie in use (1/0)
    6 the agent's log token (routers/samples/token.py), logged with every line
    then for each of the n declared variants' slots i = 0..n-1, in BucketLayout order:
    7+2i  the slot's exclusive upper bucket (0: an unused slot, never matches)
    8+2i  the slot's variant (`-` when unused)
    then for each declared variant j: 7+2n+j  may it be forced (1: it is in the route)

The token lives here, not in the base config: that is printed once
(`--print-config`) and outlives agents, while every agent applies at start, so a
new agent's token is in force from its first apply (lines before it carry the
previous one and are refused as forged). Every value is of a charset without `|`,
spaces or `;` (salts, experiment ids, variant names are validated by the route
model, the token by LogToken), so the value is one CLI word.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from controlplane.kernel.routes import BASELINE, Route
from routers.samples.token import LogToken
from sidecar.assignment import BucketLayout

KEY: Final = "route"
SEP: Final = "|"
UNUSED: Final = "-"
TOKEN_FIELD: Final = 6
_FIXED = 6
# a value longer than this did not come from encode(): 16 variants of 64 characters
MAX_VALUE: Final = 4096


def slot_bound_field(i: int) -> int:
    return _FIXED + 1 + 2 * i


def slot_variant_field(i: int) -> int:
    return _FIXED + 2 + 2 * i


def force_field(j: int, declared: int) -> int:
    return _FIXED + 1 + 2 * declared + j


@dataclass(frozen=True, slots=True)
class DecodedRoute:
    """What a map value says is in force (read back from HAProxy)."""

    experiment: str
    revision: int
    value: str


def encode(
    route: Route, declared: Sequence[str], *, header: bool, cookie: bool, token: LogToken
) -> str:
    """The map value of a route whose variants are all among `declared`."""
    layout = BucketLayout.from_weights(
        [(v.name, v.weight) for v in route.variants], baseline=BASELINE
    )
    fields = [
        str(route.experiment), str(route.revision), route.salt, _flag(header), _flag(cookie),
        token.value,
    ]  # fmt: skip
    for i in range(len(declared)):
        if i < len(layout.names):
            fields += [str(layout.bounds[i]), layout.names[i]]
        else:
            fields += ["0", UNUSED]
    in_route = {v.name for v in route.variants}
    fields += [_flag(name in in_route) for name in declared]
    return SEP.join(fields)


def decode(value: str, declared: int) -> DecodedRoute:
    """Check a value read back from HAProxy; raises ValueError naming what is wrong."""
    if len(value) > MAX_VALUE:
        raise ValueError("route value too long")
    fields = value.split(SEP)
    if len(fields) != _FIXED + 3 * declared:
        raise ValueError(f"route value has {len(fields)} fields, not {_FIXED + 3 * declared}")
    revision = fields[1]
    if not revision.isdigit() or len(revision) > 10:
        raise ValueError("route value's revision is not a number")
    return DecodedRoute(fields[0], int(revision), value)


def _flag(on: bool) -> str:
    return "1" if on else "0"


__all__ = [
    "KEY",
    "MAX_VALUE",
    "SEP",
    "TOKEN_FIELD",
    "DecodedRoute",
    "decode",
    "encode",
    "force_field",
    "slot_bound_field",
    "slot_variant_field",
]
