"""Our sidecar as a TrafficRouter: the first implementation of the seam.

A sidecar keeps its own path — its `RouteWatcher` puts each route etcd delivers in
its `RouteTable`, on the request path, with no agent in between — so this adapter is
not how a sidecar runs. It is the sidecar's route table seen through the contract
every router keeps (architecture §9a): the same contract tests run on it and on the
NGINX and HAProxy routers.
"""

from __future__ import annotations

from controlplane.kernel.routes import Route
from routers.seam import InForce, RouterError
from sidecar.routing import RouteTable


class TableRouter:
    """Applies routes to a sidecar's RouteTable (what `RouteWatcher` does per value)."""

    def __init__(self, table: RouteTable) -> None:
        self.table = table

    @property
    def kind(self) -> str:
        return "sidecar"

    @property
    def min_interval(self) -> float:
        return 0.0  # a table swap is one assignment

    async def apply(self, route: Route | None) -> None:
        try:
            self.table.apply(route)
        except ValueError as exc:  # an upstream the proxy cannot parse: the last stays
            raise RouterError(f"the sidecar cannot proxy this route: {exc}") from None

    async def in_force(self) -> InForce:
        return InForce.of(self.table.route)

    async def close(self) -> None:
        pass


__all__ = ["TableRouter"]
