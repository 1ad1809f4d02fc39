"""The metric board as one of the API process's background services (controlplane.runtime).

Every `canary serve` replica runs a board; only the controller's leader tells it what
to read (`Controller.metric_board`), so a follower's board reads nothing. It starts
before the controller and stops after it, and its counters join the API's /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.registry import Collector

from controlplane.providers.board import MetricBoard

if TYPE_CHECKING:
    from controlplane.runtime import Backends


@dataclass
class MetricBoardService:
    board: MetricBoard

    async def start(self, backends: Backends) -> None:
        await self.board.start()

    async def stop(self) -> None:
        await self.board.stop()

    def metrics_collector(self) -> Collector:
        return self.board.metrics_collector()


__all__ = ["MetricBoardService"]
