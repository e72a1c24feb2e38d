"""Loop helpers. Notifier: waiters on the loop woken from another thread, cancelled waiters
leave nothing behind, and listeners run before the waiters. Owned tasks: cancelling one is
awaited, and never eats the owner's own cancellation."""

from __future__ import annotations

import asyncio
import threading

import pytest

from messaging.aio import Notifier, cancel_and_wait


async def test_a_waiter_is_woken_from_another_thread() -> None:
    notifier = Notifier()
    changed = threading.Event()
    waiter = asyncio.ensure_future(notifier.wait_until(changed.is_set))
    await asyncio.sleep(0)
    assert not waiter.done() and notifier.waiting == 1

    def writer() -> None:  # a writer thread: change, then notify once
        changed.set()
        notifier.notify()

    thread = threading.Thread(target=writer)
    thread.start()
    await asyncio.wait_for(waiter, 5)
    thread.join(5)
    assert notifier.waiting == 0


async def test_a_notification_without_a_change_keeps_waiting() -> None:
    notifier = Notifier()
    ready = False
    waiter = asyncio.ensure_future(notifier.wait_until(lambda: ready))
    await asyncio.sleep(0)
    await asyncio.to_thread(notifier.notify)
    await asyncio.sleep(0.01)
    assert not waiter.done() and notifier.waiting == 1  # woken, checked, waiting again
    ready = True
    await asyncio.to_thread(notifier.notify)
    await asyncio.wait_for(waiter, 5)
    assert notifier.waiting == 0


async def test_cancelled_and_timed_out_waiters_leave_nothing_behind() -> None:
    notifier = Notifier()
    for _ in range(1000):
        waiter = asyncio.ensure_future(notifier.wait())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert notifier.waiting == 0
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(notifier.wait(), 0.01)
    assert notifier.waiting == 0
    await asyncio.to_thread(notifier.notify)  # nobody left to wake: nothing happens


async def test_listeners_run_on_the_loop_before_the_waiters() -> None:
    notifier = Notifier()
    loop_thread = threading.get_ident()
    events: list[str] = []

    def listener() -> None:
        assert threading.get_ident() == loop_thread
        events.append("listener")

    notifier.listen(listener)

    async def wait() -> None:
        await notifier.wait()
        events.append("waiter")

    waiter = asyncio.ensure_future(wait())
    await asyncio.sleep(0)
    await asyncio.to_thread(notifier.notify)
    await asyncio.wait_for(waiter, 5)
    assert events == ["listener", "waiter"]
    notifier.unlisten(listener)
    notifier.unlisten(listener)  # a second time is harmless
    waiter = asyncio.ensure_future(wait())
    await asyncio.sleep(0)
    await asyncio.to_thread(notifier.notify)
    await asyncio.wait_for(waiter, 5)
    assert events == ["listener", "waiter", "waiter"]


# -- owned tasks ---------------------------------------------------------------------------


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
