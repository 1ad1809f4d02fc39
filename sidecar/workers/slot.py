"""One worker position of a supervisor: the process in it now, its exits, its metrics."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from sidecar.workers import aggregate


@dataclass
class WorkerSlot:
    index: int
    admin_socket: str
    process: asyncio.subprocess.Process | None = None
    exits: tuple[float, ...] = ()  # monotonic times of recent unasked exits
    restarts: int = 0
    scrape_errors: int = 0
    # what the last successful scrape of the running process read, and its pid
    current: list[Metric] = field(default_factory=list)
    current_pid: int | None = None
    # counters and histograms of the processes this slot ran before
    retired: list[Metric] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def scraped(self, pid: int, families: list[Metric]) -> None:
        """A scrape of process `pid` came back; kept only if it still runs here."""
        if pid == self.pid and self.running:
            self.current, self.current_pid = families, pid

    def retire(self) -> None:
        """The process exited: keep what its counters last said, drop its gauges."""
        if self.current:
            self.retired = aggregate.merge([self.retired, aggregate.lasting(self.current)])
        self.current, self.current_pid = [], None

    def families(self) -> list[list[Metric]]:
        """Everything this slot contributes to the sums."""
        return [self.retired, self.current]
