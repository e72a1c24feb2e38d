"""Owned background tasks: cancelling one is awaited, and never eats the owner's own
cancellation."""

from __future__ import annotations

import asyncio

import pytest

from messaging.tasks import cancel_and_wait


async def test_cancel_and_wait_cancels_and_awaits_the_task() -> None:
    finished = asyncio.Event()

    async def background() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # cleanup that takes a turn of the loop
            finished.set()

    task = asyncio.ensure_future(background())
    await asyncio.sleep(0)
    await cancel_and_wait(task)  # the task's cancellation is not the caller's: swallowed
    assert task.cancelled() and finished.is_set()
    await cancel_and_wait(task)  # already finished
    await cancel_and_wait(None)


async def test_cancel_and_wait_reraises_the_callers_own_cancellation() -> None:
    stopping = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopping.set()
            await asyncio.sleep(3600)  # cleanup that takes long (until cancelled again)
            raise

    task = asyncio.ensure_future(slow_to_stop())
    await asyncio.sleep(0)
    owner = asyncio.ensure_future(cancel_and_wait(task))
    await asyncio.wait_for(stopping.wait(), 5)
    assert not owner.done()  # waiting for the task to stop
    owner.cancel()  # the owner is itself cancelled (its own close, a timeout) meanwhile
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(owner, 5)
    assert owner.cancelled()
    assert task.cancelled()


async def test_cancel_and_wait_passes_on_a_failure_while_stopping() -> None:
    async def fails_to_stop() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = asyncio.ensure_future(fails_to_stop())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)
