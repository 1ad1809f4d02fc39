"""A query's worker thread is never abandoned: a cancelled caller waits for it, so a
session is never rolled back, closed or disposed of under a query still running on
its connection (two threads in one SQLite connection can crash the process)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from controlplane.db.session import Transaction, in_thread


async def test_a_cancelled_caller_waits_for_its_thread_before_it_raises() -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def query(*, session: Any) -> None:
        started.set()
        release.wait(10)
        finished.append(True)

    task = asyncio.create_task(Transaction(session=None).run(query))  # type: ignore[arg-type]
    await asyncio.to_thread(started.wait, 10)
    task.cancel()
    for _ in range(20):  # however often the loop runs, the caller is still waiting
        await asyncio.sleep(0)
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == [True]


async def test_a_thread_that_fails_after_its_caller_was_cancelled_is_not_reported() -> None:
    started, release = threading.Event(), threading.Event()

    def failing() -> None:
        started.set()
        release.wait(10)
        raise RuntimeError("after the caller left")

    task = asyncio.create_task(in_thread(failing))
    await asyncio.to_thread(started.wait, 10)
    task.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):  # the cancellation, not the error
        await task


async def test_a_result_comes_back_as_before() -> None:
    assert await in_thread(lambda: 42) == 42
    with pytest.raises(ValueError, match="bad"):
        await in_thread(lambda: int("bad"))
