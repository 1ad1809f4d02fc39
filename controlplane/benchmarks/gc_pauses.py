"""The cyclic garbage collector's pauses while a benchmark measures: per generation,
how many collections, their total and the longest (decision 0071)."""

from __future__ import annotations

import gc
import time
from types import TracebackType
from typing import Any


class GcPauses:
    """Times every collection made between `start()` and `stop()` (or inside
    `with GcPauses() as pauses:`)."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._by_generation: dict[int, list[float]] = {0: [], 1: [], 2: []}

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._by_generation[int(info["generation"])].append(
                time.perf_counter() - self._started
            )
            self._started = None

    def start(self) -> None:
        gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def __enter__(self) -> GcPauses:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def figures(self) -> dict[str, dict[str, float]]:
        return {
            f"generation_{generation}": {
                "collections": len(pauses),
                "total_ms": round(sum(pauses) * 1000, 1),
                "longest_ms": round(max(pauses, default=0.0) * 1000, 1),
            }
            for generation, pauses in self._by_generation.items()
        }
