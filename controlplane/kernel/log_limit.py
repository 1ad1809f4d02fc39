"""At most one log line per key per interval: a fault that recurs at every round is
logged once a minute, not four times a second."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class EveryInterval:
    interval: float = 60.0
    # more keys than this and the oldest are forgotten (logged again when next due)
    max_keys: int = 1024
    _last: dict[Hashable, float] = field(default_factory=dict)

    def due(self, key: Hashable, now: float) -> bool:
        """True when `key` was not logged within the interval before `now`, and
        records it as logged now."""
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            return False
        self._last.pop(key, None)
        if len(self._last) >= self.max_keys:
            del self._last[next(iter(self._last))]
        self._last[key] = now
        return True
