"""The traffic-router seam (architecture §9a): what a data plane must do for a route.

A router puts a route in force in a proxy and reports what is in force there. It is
the last step of the one path every route takes: SQL (the desired route) → the
leader's reconciler → etcd `<prefix>/routes/<service>` → a router. A router never
writes SQL or etcd and never decides: it applies what etcd holds, fail-static.

    apply(route)   put a route in force (None: the key was deleted: no canary).
                   Raises RouterError when the proxy refused or could not be
                   reached; the route in force before the call stays in force.
    in_force()     what the proxy itself says is in force (not what was last sent).
    min_interval   how often applying is worth it: the agent coalesces route changes
                   that come faster (an NGINX reload is not free; HAProxy's runtime
                   API is).

Every router tags each request with its variant (`X-Canary-Variant` towards the
upstream and on the response, `X-Canary-Experiment` beside it) and makes every
request a sample of the batch format (architecture §5): the sidecar itself, the
other routers through their access logs (`routers/samples/`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from controlplane.kernel.routes import Route

VARIANT_HEADER = "x-canary-variant"
EXPERIMENT_HEADER = "x-canary-experiment"
FORCE_HEADER = "x-canary-force"


class RouterError(Exception):
    """The proxy refused a route or could not be reached; the last one stays in force."""


@dataclass(frozen=True, slots=True)
class InForce:
    """What a proxy holds: the route's experiment and revision (None: no route)."""

    experiment: str | None
    revision: int | None

    @classmethod
    def of(cls, route: Route | None) -> InForce:
        if route is None:
            return cls(None, None)
        return cls(str(route.experiment), route.revision)


class TrafficRouter(Protocol):
    """A data plane a route can be put in force in (one service per router)."""

    @property
    def kind(self) -> str:
        """`sidecar`, `nginx`, `haproxy`: the label of its metrics and status."""
        ...

    @property
    def min_interval(self) -> float:
        """Seconds between two applies; changes in between are coalesced to the last."""
        ...

    async def apply(self, route: Route | None) -> None: ...

    async def in_force(self) -> InForce: ...

    async def close(self) -> None: ...


__all__ = [
    "EXPERIMENT_HEADER",
    "FORCE_HEADER",
    "VARIANT_HEADER",
    "InForce",
    "RouterError",
    "TrafficRouter",
]
