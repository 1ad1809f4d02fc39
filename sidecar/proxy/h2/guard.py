"""Client behaviour an HTTP/2 connection does not tolerate, counted per connection.

The `h2` state machine refuses malformed frames, oversized header lists and streams
beyond MAX_CONCURRENT_STREAMS by itself. What it cannot see is a well-formed flood:
streams opened and reset at once ("rapid reset", CVE-2023-44487) cost an upstream
stream each while never counting against the stream limit. `ResetBudget` bounds the
resets a client may send in a window; past it the connection is closed with
ENHANCE_YOUR_CALM.
"""

from __future__ import annotations


class ResetBudget:
    """At most `limit` client resets in any fixed window of `window` seconds."""

    __slots__ = ("_count", "_start", "limit", "window")

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._start = 0.0
        self._count = 0

    def spend(self, now: float) -> bool:
        """Count one reset at `now`; False once the window holds more than `limit`."""
        if now - self._start >= self.window:
            self._start = now
            self._count = 0
        self._count += 1
        return self._count <= self.limit
