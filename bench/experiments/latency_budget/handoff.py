"""LocalLog's hand-off to its writer thread, without the broker behind it: what the latency
budget measures alone, and what the floor server's ``thread`` mode runs."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")


class Handoff(Generic[Item]):
    """LocalLog's hand-off to its writer thread, without the broker behind it.

    The loop appends ``(record, item)`` to a deque and sets a ``threading.Event`` only while
    the writer sleeps; the writer takes everything queued as one group, calls ``write`` with
    the group's records (the disk work, or nothing), and hands the group's items back with one
    ``loop.call_soon_threadsafe(settle, items, error)``, then at once takes the next group.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, write: Callable[[list[bytes]], None],
                 settle: Callable[[list[Item], BaseException | None], None]) -> None:
        self.loop = loop
        self.write = write
        self.settle = settle
        self.groups = 0
        # Appended on the loop, taken on the writer thread: deque operations are atomic.
        self._pending: deque[tuple[bytes, Item]] = deque()
        self._work = threading.Event()
        self._sleeping = False  # as LocalLog: re-checked after it is set, so no wake-up is lost
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="handoff-writer", daemon=True)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def submit(self, record: bytes, item: Item) -> None:
        """Queue ``record``; ``item`` comes back through ``settle`` once it is written."""
        self._pending.append((record, item))
        if self._sleeping:  # a busy writer finds it anyway
            self._work.set()

    async def close(self) -> None:
        """Let the writer finish what is queued, then join it (on a thread, not the loop)."""
        self._closing = True
        self._work.set()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, 30.0)

    def _run(self) -> None:
        while True:
            self._sleeping = True
            if not self._pending and not self._closing:
                self._work.wait()
            self._sleeping = False
            self._work.clear()
            while self._pending:
                group = [self._pending.popleft() for _ in range(len(self._pending))]
                error: BaseException | None = None
                try:
                    self.write([record for record, _ in group])
                except Exception as err:  # the group's waiters hear about it
                    error = err
                self.groups += 1
                with contextlib.suppress(RuntimeError):  # a closed loop is gone
                    self.loop.call_soon_threadsafe(self.settle, [item for _, item in group],
                                                   error)
            if self._closing and not self._pending:
                return
