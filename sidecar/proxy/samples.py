"""Finished requests waiting for the next flush, column by column.

Each finished request appends its sample's fields to one list per column (native
appends when compiled: no tuple per request); a flush hands the lists over as they
are, to the metrics and as a `SampleColumns` to the recorder, and starts new ones.
"""

from __future__ import annotations

from controlplane.kernel.codec import SHED
from sidecar.choice import Choice, SampleColumns


class PendingSamples:
    """The samples since the last flush, and each request's proxy overhead."""

    def __init__(self) -> None:
        self.ts: list[float] = []
        self.experiments: list[str | None] = []
        self.variants: list[str] = []
        self.rt_us: list[int] = []
        self.outcomes: list[int] = []
        self.units: list[int] = []
        self.first_byte_us: list[int] = []
        # seconds from the head received to the head sent upstream; -1.0: never sent
        self.overheads: list[float] = []

    def __len__(self) -> int:
        return len(self.ts)

    def add(
        self,
        choice: Choice,
        ts: float,
        t0: float,
        t_sent: float | None,
        t_first: float | None,
        outcome: int,
        end: float,
    ) -> None:
        """One request: `ts` the wall clock at its head, the others monotonic times
        (`t_first` None: no response head of its own, the first byte is the end)."""
        total = int((end - t0) * 1e6)
        first = total if t_first is None else int((t_first - t0) * 1e6)
        self.ts.append(ts)
        self.experiments.append(choice.experiment)
        self.variants.append(choice.variant)
        self.rt_us.append(total)
        self.outcomes.append(outcome)
        self.units.append(choice.unit_hash)
        self.first_byte_us.append(first if first < total else total)
        self.overheads.append(-1.0 if t_sent is None else t_sent - t0)

    def add_shed(self, ts: float, experiment: str, variant: str, count: int) -> None:
        """A tally of requests shed (codec.SHED): its "latency" is the count. Not a
        request the metrics count: it has no overhead."""
        self.ts.append(ts)
        self.experiments.append(experiment)
        self.variants.append(variant)
        self.rt_us.append(count)
        self.outcomes.append(SHED)
        self.units.append(0)
        self.first_byte_us.append(0)

    def columns(self) -> SampleColumns:
        """The samples as the recorder takes them (the lists themselves, not copies)."""
        return SampleColumns(
            self.ts,
            self.experiments,
            self.variants,
            self.rt_us,
            self.outcomes,
            self.units,
            self.first_byte_us,
        )
