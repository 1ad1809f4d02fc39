"""Stopping a background task for certain.

`task.cancel()` then `await task` hangs forever when the cancellation is lost below
us: client libraries have caught a `CancelledError` at the edge of one of their own
timeouts and carried on (redis-py's asyncio client did so under a Redis Cluster
failover), and a loop that carries on after it waits for its next event, which on
shutdown never comes. So a task that is still running a while after its
cancellation is cancelled again, until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

log = logging.getLogger("canary.tasks")

# long enough for any task's own cleanup on cancellation (a flush, a close), short
# enough that a lost cancellation delays a shutdown by no more than this
CANCEL_AGAIN_AFTER_SEC: Final = 1.0


async def cancel_and_wait(
    task: asyncio.Task[Any], *, again_after: float = CANCEL_AGAIN_AFTER_SEC
) -> None:
    """Cancel `task` and return once it has ended. Its CancelledError is absorbed;
    any other exception it ended with is raised here, as `await task` would."""
    task.cancel()
    lost = 0
    while True:
        done, _ = await asyncio.wait({task}, timeout=again_after)
        if done:
            break
        lost += 1
        log.warning(
            "task %s still running %.1f s after its cancellation (lost below it): "
            "cancelled again (%d)",
            task.get_name(), again_after, lost,
        )  # fmt: skip
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
