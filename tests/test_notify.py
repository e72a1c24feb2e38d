"""Notifier: waiters on the loop woken from another thread, cancelled waiters leave nothing
behind, and listeners run before the waiters."""

from __future__ import annotations

import asyncio
import threading

import pytest

from messaging.notify import Notifier


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
