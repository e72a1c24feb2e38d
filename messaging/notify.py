"""Wake-ups that cross threads: a writer thread resolves futures that asyncio readers await."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable


class Waiters:
    """Futures waiting for "something changed"; :meth:`wake_all` may run on any thread.

    The owner guards add/take with its own lock, so checking a condition and registering a
    waiter happen atomically with respect to the writer.
    """

    def __init__(self) -> None:
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def add(self) -> asyncio.Future[None]:
        """A new future on the running loop, resolved by the next :meth:`wake_all`."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiting.append((loop, future))
        return future

    def discard(self, future: asyncio.Future[None]) -> None:
        """Forget a future whose waiter gave up (cancelled or timed out)."""
        self._waiting = [(loop, f) for loop, f in self._waiting if f is not future]

    async def wait_unless(self, lock: threading.Lock, ready: Callable[[], bool]) -> None:
        """Return at once if ``ready()`` (checked under ``lock``), else at the next wake-up."""
        with lock:
            if ready():
                return
            future = self.add()
        try:
            await future
        finally:
            if not future.done():
                with lock:
                    self.discard(future)

    def take(self) -> list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]:
        """Remove and return every waiter (call under the owner's lock, wake outside it)."""
        waiting, self._waiting = self._waiting, []
        return waiting


def wake(waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    """Resolve futures taken from :meth:`Waiters.take`, each on its own loop."""
    for loop, future in waiting:
        # A closed loop raises RuntimeError: nobody is waiting there any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
