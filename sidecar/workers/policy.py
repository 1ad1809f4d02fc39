"""How many workers, and what to do when one exits: pure decisions, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.kernel.backoff import BackoffPolicy

WORKERS_PER_CPU_MAX = 4
WORKERS_MAX = 256  # whatever the CPU count: each worker holds its own pools and sockets


def max_workers(cpus: int) -> int:
    return min(WORKERS_MAX, max(1, cpus) * WORKERS_PER_CPU_MAX)


def workers_error(workers: int, cpus: int) -> str | None:
    """Why `--workers` is refused, or None when it is within 1..max_workers(cpus)."""
    limit = max_workers(cpus)
    if 1 <= workers <= limit:
        return None
    return (
        f"--workers must be between 1 and {limit} ({WORKERS_PER_CPU_MAX} per CPU available, "
        f"{cpus} here, at most {WORKERS_MAX}), got {workers}"
    )


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """A worker that exits unasked is restarted after the shared backoff, counting the
    exits in the last `window` seconds; the `max_exits`-th exit within it gives up."""

    initial_delay: float = 0.5
    max_delay: float = 30.0
    window: float = 60.0
    max_exits: int = 5
    jitter: float = 0.5

    @property
    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(initial=self.initial_delay, maximum=self.max_delay, jitter=self.jitter)


@dataclass(frozen=True, slots=True)
class Restart:
    delay: float
    recent: tuple[float, ...]  # exit times within the window, this one included


@dataclass(frozen=True, slots=True)
class GiveUp:
    reason: str


def after_exit(
    policy: RestartPolicy, recent: tuple[float, ...], now: float, *, draw: float
) -> Restart | GiveUp:
    """What to do about a worker that exited at `now` (monotonic seconds), given the
    times of its earlier exits; `draw` (uniform in [0, 1)) sets the jitter."""
    kept = (*(t for t in recent if now - t < policy.window), now)
    if len(kept) >= policy.max_exits:
        return GiveUp(f"{len(kept)} exits within {policy.window:g} s")
    return Restart(policy.backoff.delay(len(kept), draw), kept)
