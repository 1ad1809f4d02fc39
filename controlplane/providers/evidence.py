"""What a metric provider hands the decision core: plain values per variant.

The decision core stays pure (architecture §8): providers are read at the edge, on
the controller's leader, in the background (`providers/board.py`), and a round takes
the latest `MetricEvidence` of each of an experiment's metrics as values. A round
never waits on a provider.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Reading:
    """One variant's value of one metric over the window.

    `value` is the metric (a ratio's bad/total, a gauge, a quantile); `bad` and
    `total` are a ratio's counts (None for other kinds); `no_data` says the provider
    gave nothing usable, `reason` why.
    """

    value: float | None
    bad: float | None = None
    total: float | None = None
    no_data: bool = False
    reason: str | None = None

    @classmethod
    def missing(cls, reason: str) -> Reading:
        return cls(None, no_data=True, reason=reason)

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "bad": self.bad, "total": self.total,
                "no_data": self.no_data, "reason": self.reason}  # fmt: skip


@dataclass(frozen=True, slots=True)
class MetricEvidence:
    """One metric of one experiment, as last read: each variant's reading, when it
    was read (the provider's clock, epoch seconds), and the query as sent (for the
    events: what was asked, with the variant substituted)."""

    name: str
    canary: Reading
    baseline: Reading
    read_at: float
    queries: tuple[str, ...] = ()

    @property
    def no_data(self) -> bool:
        return self.canary.no_data or self.baseline.no_data

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "canary": self.canary.to_dict(),
                "baseline": self.baseline.to_dict(), "read_at": self.read_at,
                "queries": list(self.queries)}  # fmt: skip


__all__ = ["MetricEvidence", "Reading"]
