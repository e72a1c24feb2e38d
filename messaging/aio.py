"""Loop helpers: wake-ups that cross threads, and owned background tasks.

Wake-ups, the aiohttp ``streams.py`` way.

A writer thread calls :meth:`Notifier.notify` once per change; it schedules one callback per
event loop that ever waited (``call_soon_threadsafe``), and that callback resolves the loop's
waiting futures on the loop itself. Waiters live only on their loop: a reader checks its
condition and registers its future without yielding, so a change made before the check is
seen by the check and a change made after it schedules a wake-up that comes after the
registration; no lock is shared between the loop and the writer. A waiter removes its future
in ``finally``, whether it was woken, cancelled or timed out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any


class Notifier:
    """"Something changed" for asyncio waiters, announced from any thread."""

    def __init__(self) -> None:
        # loop -> its waiting futures; the set is only touched on its own loop.
        self._waiting: dict[asyncio.AbstractEventLoop, set[asyncio.Future[None]]] = {}
        # loop -> callbacks run on that loop at every notification, before the futures.
        self._listeners: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}

    def listen(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the running loop at every notification (until :meth:`unlisten`).

        Listeners run before waiting futures are resolved, in one pass: a fan-out writes to
        many sockets without waking a task per socket.
        """
        loop = asyncio.get_running_loop()
        self._listeners.setdefault(loop, []).append(callback)
        self._waiting.setdefault(loop, set())  # so that notify() calls this loop

    def unlisten(self, callback: Callable[[], None]) -> None:
        """Stop running a callback given to :meth:`listen` (on the same loop)."""
        listeners = self._listeners.get(asyncio.get_running_loop(), [])
        if callback in listeners:
            listeners.remove(callback)

    @property
    def waiting(self) -> int:
        """How many futures wait right now (on every loop)."""
        return sum(len(futures) for futures in list(self._waiting.values()))

    async def wait_until(self, ready: Callable[[], bool]) -> None:
        """Return once ``ready()`` is true, checked now and after every notification.

        ``ready`` runs on the loop and must not block (read plain attributes, take no lock).
        """
        while not ready():
            await self.wait()

    async def wait(self) -> None:
        """Wait for the next :meth:`notify` (or :meth:`notify` from this loop's thread)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        futures = self._waiting.setdefault(loop, set())
        futures.add(future)
        try:
            await future
        finally:
            futures.discard(future)

    def notify(self) -> None:
        """Wake every waiter (any thread): one callback per loop, not one per waiter.

        From a loop's own thread the callback is queued with ``call_soon``: no self-pipe
        write, no extra turn of the selector before the waiters run.
        """
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop in list(self._waiting):
            if loop.is_closed():
                self._waiting.pop(loop, None)
                continue
            if loop is running:
                loop.call_soon(self._wake, loop)
                continue
            # A loop closing right now raises RuntimeError: nobody waits there any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake, loop)

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        for callback in list(self._listeners.get(loop, ())):
            callback()
        for future in self._waiting.get(loop, ()):
            if not future.done():
                future.set_result(None)


# -- owned tasks: cancel, await, and never swallow the caller's own cancellation -----------


async def wait_finished(task: asyncio.Future[Any]) -> None:
    """Await a task that is ending (or was cancelled by its owner), ignoring its cancellation.

    If the *caller* is being cancelled meanwhile, that cancellation is re-raised, not eaten.
    """
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel a task this object owns and wait until it has finished."""
    if task is None:
        return
    task.cancel()
    await wait_finished(task)
