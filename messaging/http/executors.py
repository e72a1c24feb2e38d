"""The threads of the HTTP room, one pool per role, each with a stated bound.

- **Reads**: at most :data:`READ_THREADS` threads (``messaging-read-N``) read topic files for
  the native reads and streams (``GET /messaging/messages``), count queries
  (``GET /messaging/topics/{id}?after=&count=``) and Durable Streams reads. More reads than
  threads queue; each reads at most one chunk (64 KiB for a stream, 1 MiB of data for a
  Durable Streams catch-up) before its thread is free again.
- **Validation**: at most :data:`VALIDATE_THREADS` threads (``messaging-validate-N``) check
  the frames of publish bodies too big to check on the loop (CRC-32C of every frame: CPU
  work, so more threads than cores would buy nothing).

Both pools are created when the application starts (``on_startup``) and shut down when it is
cleaned up (``on_cleanup``), after the work in flight has finished: never left running. Work
handed to them before the start or after the cleanup is refused (503). Other blocking work
(retention runs, snapshot files) stays on the loop's default executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from messaging.errors import BrokerClosedError

#: Threads that read topic files for HTTP reads (see the module docstring).
READ_THREADS = 8
#: Threads that validate big publish bodies (see the module docstring).
VALIDATE_THREADS = 2

T = TypeVar("T")


class Executors:
    """The read and validation pools of one application (see the module docstring)."""

    def __init__(self, read_threads: int = READ_THREADS,
                 validate_threads: int = VALIDATE_THREADS) -> None:
        if read_threads < 1 or validate_threads < 1:
            raise ValueError("each pool needs at least one thread")
        self.read_threads = read_threads
        self.validate_threads = validate_threads
        self._reads: ThreadPoolExecutor | None = None
        self._validation: ThreadPoolExecutor | None = None

    async def start(self, _app: web.Application) -> None:
        """Create the pools (an ``on_startup`` hook)."""
        self._reads = ThreadPoolExecutor(self.read_threads, thread_name_prefix="messaging-read")
        self._validation = ThreadPoolExecutor(self.validate_threads,
                                              thread_name_prefix="messaging-validate")

    async def stop(self, _app: web.Application) -> None:
        """Refuse new work, wait for the work in flight, end the threads (``on_cleanup``)."""
        pools = [pool for pool in (self._reads, self._validation) if pool is not None]
        self._reads = self._validation = None
        for pool in pools:
            # Joining threads blocks: do it off the loop.
            await asyncio.to_thread(pool.shutdown)

    def read(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run a blocking read of topic files on the read threads."""
        return self._run(self._reads, function, args)

    def validate(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run the validation of a publish body on the validation threads."""
        return self._run(self._validation, function, args)

    @staticmethod
    def _run(pool: ThreadPoolExecutor | None, function: Callable[..., T],
             args: tuple[Any, ...]) -> asyncio.Future[T]:
        if pool is None:
            raise BrokerClosedError("the broker is not serving (starting or shutting down)")
        return asyncio.get_running_loop().run_in_executor(pool, function, *args)
