"""cancel_and_wait: a task is stopped even when its first cancellation is lost."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.kernel.tasks import cancel_and_wait


class LosesCancellations:
    """A task body that carries on after its first `lost` cancellations, as a library
    that caught them at a timeout's edge does; the next one ends it."""

    def __init__(self, lost: int) -> None:
        self.lost = lost
        self.received = 0

    async def run(self) -> None:
        never = asyncio.Event()
        while True:
            try:
                await never.wait()
            except asyncio.CancelledError:
                self.received += 1
                if self.received > self.lost:
                    raise


async def test_a_task_that_loses_its_cancellation_is_cancelled_again() -> None:
    body = LosesCancellations(lost=2)
    task = asyncio.create_task(body.run())
    await asyncio.sleep(0)
    await cancel_and_wait(task, again_after=0.01)
    assert task.cancelled()
    assert body.received == 3


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
    body = LosesCancellations(lost=1)
    task = asyncio.create_task(body.run())
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait(task, again_after=0.05))
    for _ in range(40):  # the stopper itself is cancelled, over and over, meanwhile
        await asyncio.sleep(0.005)
        stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert task.cancelled()  # never abandoned
    assert body.received == 2
