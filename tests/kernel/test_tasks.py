"""cancel_and_wait: a task is stopped even when its first cancellation is lost."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.kernel.tasks import cancel_and_wait


async def test_a_task_that_loses_its_cancellation_is_cancelled_again() -> None:
    never = asyncio.Event()
    swallowed = 0

    async def loses_cancellations() -> None:
        nonlocal swallowed
        while True:
            try:
                await never.wait()
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 3:
                    raise
                # carries on, as a library that caught it at a timeout's edge does

    task = asyncio.create_task(loses_cancellations())
    await asyncio.sleep(0)
    await cancel_and_wait(task, again_after=0.01)
    assert task.cancelled()
    assert swallowed == 3


async def test_a_task_that_ends_at_once_is_waited_for_and_its_cancellation_absorbed() -> None:
    cleaned = asyncio.Event()

    async def cleans_up() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    task = asyncio.create_task(cleans_up())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled() and cleaned.is_set()


async def test_an_error_the_task_ends_with_is_raised() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ValueError("cleanup failed") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="cleanup failed"):
        await cancel_and_wait(task)


async def test_a_finished_task_is_left_as_it_ended() -> None:
    async def returns() -> int:
        return 7

    task = asyncio.create_task(returns())
    await task
    await cancel_and_wait(task)
    assert task.result() == 7


async def test_several_tasks_are_cancelled_once_each_and_all_waited_for() -> None:
    cancels = [0, 0]
    never = asyncio.Event()

    async def counts(i: int) -> None:
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancels[i] += 1
            await asyncio.sleep(0)  # a cleanup that awaits: a second cancel would cut it
            raise

    tasks = [asyncio.create_task(counts(i)) for i in range(2)]
    await asyncio.sleep(0)
    await cancel_and_wait(*tasks)
    assert cancels == [1, 1] and all(task.cancelled() for task in tasks)


async def test_a_stopper_cancelled_meanwhile_still_ends_its_task_before_it_raises() -> None:
    never = asyncio.Event()
    swallowed = 0

    async def loses_one() -> None:
        nonlocal swallowed
        while True:
            try:
                await never.wait()
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 2:
                    raise

    task = asyncio.create_task(loses_one())
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait(task, again_after=0.05))
    for _ in range(40):  # the stopper itself is cancelled, over and over, meanwhile
        await asyncio.sleep(0.005)
        stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert task.cancelled()  # never abandoned
    assert swallowed == 2
