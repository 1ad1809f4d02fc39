"""What HAProxy must hold for a route (pure): the map value and each server's state.

`targets` checks that the base config can carry the route and names the upstream
hosts to resolve; `plan` takes the resolved addresses and says, in order, what the
router does through the stats socket:

1. `ready`: each of the route's variants gets its server's address and is made
   ready, before the map names it, so no request is routed to a server in
   maintenance;
2. the map: `value` under `route_value.KEY` (None: an empty map, no route, 503),
   committed as one version;
3. `maint`: the declared variants the route does not have go to maintenance, after
   the map stopped routing to them.

A variant whose upstream changes address while it carries traffic is re-addressed
in step 1: its requests go to the new address under the old map for that moment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.kernel.routes import Route
from routers.haproxy import route_value
from routers.haproxy.render import SERVER, BaseConfig, backend_of
from routers.samples.token import LogToken
from sidecar.choice import Upstream


class PlanError(ValueError):
    """The base config cannot carry the route (a one-line reason)."""


@dataclass(frozen=True, slots=True)
class Target:
    variant: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class ServerStep:
    backend: str
    server: str
    address: tuple[str, int] | None  # (ip, port) to set first; None: leave as is
    state: str  # "ready" | "maint"


@dataclass(frozen=True, slots=True)
class Plan:
    ready: tuple[ServerStep, ...]
    value: str | None
    maint: tuple[ServerStep, ...]


def targets(route: Route | None, cfg: BaseConfig) -> tuple[Target, ...]:
    """The upstreams to resolve; raises PlanError when the base config cannot carry
    the route."""
    if route is None:
        return ()
    undeclared = [v.name for v in route.variants if v.name not in cfg.variants]
    if undeclared:
        raise PlanError(
            f"route variant(s) {', '.join(undeclared)} have no backend in the haproxy "
            f"base config (declared: {', '.join(cfg.variants)})"
        )
    header = route.sticky.header.lower() if route.sticky.header else None
    if header is not None and header != cfg.header:
        raise PlanError(
            f"route's sticky header {header} is not the base config's "
            f"({cfg.header or 'none'}): render a new base config with it and restart haproxy"
        )
    if route.sticky.cookie is not None and route.sticky.cookie != cfg.sticky_cookie:
        raise PlanError(
            f"route's sticky cookie {route.sticky.cookie} is not the base config's "
            f"({cfg.sticky_cookie or 'none'}): render a new base config with it and "
            "restart haproxy"
        )
    found = []
    for variant in route.variants:
        try:
            upstream = Upstream.parse(variant.upstream)
        except ValueError as exc:
            raise PlanError(f"variant {variant.name}: {exc}") from None
        if upstream.http2 or upstream.scheme != "http":
            raise PlanError(
                f"variant {variant.name}'s upstream is {str(upstream).partition(':')[0]}://: "
                "the haproxy base config carries plain http:// (HTTP/1.1) only"
            )
        if upstream.base_path:
            raise PlanError(
                f"variant {variant.name}'s upstream has a path prefix, which the haproxy "
                "base config does not carry"
            )
        found.append(Target(variant.name, upstream.host, upstream.port))
    return tuple(found)


def plan(
    route: Route | None,
    cfg: BaseConfig,
    addresses: Mapping[str, tuple[str, int]],
    token: LogToken,
) -> Plan:
    """The steps for `route`, given each target variant's resolved (ip, port); the
    map value carries the agent's log `token`."""
    in_route = {v.name for v in route.variants} if route is not None else set()
    ready = tuple(
        ServerStep(backend_of(name), SERVER, addresses[name], "ready")
        for name in cfg.variants
        if name in in_route
    )
    maint = tuple(
        ServerStep(backend_of(name), SERVER, None, "maint")
        for name in cfg.variants
        if name not in in_route
    )
    value = (
        None
        if route is None
        else route_value.encode(
            route,
            cfg.variants,
            header=route.sticky.header is not None,
            cookie=route.sticky.cookie is not None,
            token=token,
        )
    )
    return Plan(ready, value, maint)


__all__ = ["Plan", "PlanError", "ServerStep", "Target", "plan", "targets"]
