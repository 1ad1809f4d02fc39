"""The one retry delay: capped exponential backoff with jitter, as a pure function.

Every loop that retries a backend after a failure (the informer's relist, the etcd
adapter's watch resume, the collector's round, the sidecar's sample sends, a worker's
restart, a webhook delivery) waits out `BackoffPolicy.delay`: the n-th failure in a
row waits `min(maximum, initial * multiplier**(n-1))`, less a random share of up to
`jitter` of it. The share is taken off the capped delay, so many clients that lost
the same backend stay spread even once at the cap. `Backoff` holds one loop's count
of failures in a row; the random draw is injected, and the clock stays with the
caller (it tells `after_session` how long the session was up). See
docs/decisions/0044-one-backoff-policy.md (and 0015 for why not a retry library).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

# 2**64 times any sane initial delay is past any sane maximum: no need to go higher,
# and float powers beyond ~1024 overflow.
_MAX_EXPONENT = 64


@dataclass(frozen=True)
class BackoffPolicy:
    """Exponential backoff with jitter, capped: the delay after the n-th failure in a row.

    A session that stayed up `reset_after` seconds starts the sequence again from
    `initial` (`Backoff.after_session`).
    """

    initial: float = 0.1
    maximum: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5
    reset_after: float = 30.0

    def __post_init__(self) -> None:
        finite = (self.initial, self.maximum, self.multiplier, self.jitter, self.reset_after)
        if not all(math.isfinite(x) for x in finite):
            raise ValueError("backoff parameters must be finite numbers")
        if self.initial <= 0 or self.maximum < self.initial:
            raise ValueError("backoff needs 0 < initial <= maximum")
        if self.multiplier < 1:
            raise ValueError("backoff multiplier must be at least 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("backoff jitter must be in [0, 1)")
        if self.reset_after < 0:
            raise ValueError("backoff reset_after must not be negative")

    def ceiling(self, failures: int) -> float:
        """The delay after `failures` failures in a row (≥ 1) before jitter."""
        exponent = min(max(failures, 1) - 1, _MAX_EXPONENT)
        return min(self.maximum, self.initial * self.multiplier**exponent)

    def delay(self, failures: int, draw: float) -> float:
        """The wait after `failures` failures in a row (≥ 1); `draw` is uniform in [0, 1)."""
        # out of range is clamped, and NaN (no comparison holds) counts as 0
        draw = 1.0 if draw > 1.0 else draw if draw >= 0.0 else 0.0
        return self.ceiling(failures) * (1.0 - self.jitter * draw)


class Backoff:
    """The failures-in-a-row counter of one loop, and the delay it earns."""

    def __init__(self, policy: BackoffPolicy, *, draw: Callable[[], float] = random.random):
        self.policy = policy
        self._draw = draw
        self.failures = 0

    def next_delay(self) -> float:
        """Count one more failure in a row; the wait it earns."""
        self.failures += 1
        return self.policy.delay(self.failures, self._draw())

    def reset(self) -> None:
        """A success: the next failure is the first of a new sequence."""
        self.failures = 0

    def after_session(self, up_for: float | None) -> float:
        """The delay after a session that was up for `up_for` seconds.

        None: it never got that far. A session up `reset_after` or longer was healthy,
        so its end is the first failure of a new sequence.
        """
        if up_for is not None and up_for >= self.policy.reset_after:
            self.reset()
        return self.next_delay()
