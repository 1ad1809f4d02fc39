"""Stopping background tasks for certain.

`task.cancel()` then `await task` hangs forever when the cancellation is lost below
us: client libraries have caught a `CancelledError` at the edge of one of their own
timeouts and carried on (redis-py's asyncio client did so under a Redis Cluster
failover), and a loop that carries on after it waits for its next event, which on
shutdown never comes. So a task that is still running a while after its
cancellation is cancelled again, until it ends; and one being stopped is never
abandoned, not even when whoever stops it is cancelled meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

log = logging.getLogger("canary.tasks")

# long enough for any task's own cleanup on cancellation (a flush, a close), short
# enough that a lost cancellation delays a shutdown by no more than this
CANCEL_AGAIN_AFTER_SEC: Final = 1.0


async def cancel_and_wait(
    *tasks: asyncio.Task[Any], again_after: float = CANCEL_AGAIN_AFTER_SEC
) -> None:
    """Cancel `tasks` (each once, together) and return once all have ended.

    A task still running `again_after` seconds later lost its cancellation: it is
    cancelled again, with a warning. Their CancelledErrors are absorbed; the first
    other exception one of them ended with is raised here, as `await task` would. If
    the caller is cancelled while it waits, it still waits for every task to end,
    then raises CancelledError: a task is never left running unowned."""
    for task in tasks:
        task.cancel()
    loop = asyncio.get_running_loop()
    running = {task for task in tasks if not task.done()}
    again_at = loop.time() + again_after
    interrupted = False
    while running:
        try:
            # up to the next re-cancel, however often the caller is interrupted
            await asyncio.wait(running, timeout=max(0.0, again_at - loop.time()))
        except asyncio.CancelledError:
            interrupted = True  # the caller is being stopped: the tasks are still ours
        running = {task for task in running if not task.done()}
        if running and loop.time() >= again_at:
            for task in running:
                log.warning(
                    "task %s still running %.1f s after its cancellation (lost below "
                    "it): cancelled again", task.get_name(), again_after,
                )  # fmt: skip
                task.cancel()
            again_at = loop.time() + again_after
    errors = [task.exception() for task in tasks if not task.cancelled()]
    if interrupted:
        raise asyncio.CancelledError
    for error in errors:
        if error is not None:
            raise error
