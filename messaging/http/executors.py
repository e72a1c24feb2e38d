"""The threads of the HTTP room, one pool per role, each with a stated bound.

- **Reads**: at most :data:`READ_THREADS` threads (``messaging-read-N``) read topic files for
  the native reads and streams (``GET /messaging/messages``), count queries
  (``GET /messaging/topics/{id}?after=&count=``) and Durable Streams reads. More reads than
  threads queue; each reads at most one chunk (64 KiB for a stream, 1 MiB of data for a
  Durable Streams catch-up) before its thread is free again.
- **Validation**: at most :data:`VALIDATE_THREADS` threads (``messaging-validate-N``) check
  the frames of publish bodies too big to check on the loop (CRC-32C of every frame: CPU
  work, so more threads than cores would buy nothing).
- **Maintenance**: :data:`MAINTENANCE_THREADS` thread (``messaging-maintenance``) runs
  retention (on its timer and on ``POST /messaging/retention``; the broker lets one run at a
  time anyway) and reads the files of a snapshot a peer fetches, so that neither can take
  the threads reads need.

Both pools are created when the application starts (``on_startup``) and shut down when it is
cleaned up (``on_cleanup``), after the work in flight has finished: never left running. Work
handed to them before the start or after the cleanup is refused (503). Opening and closing
the broker, once each, happen outside the application's life, on the loop's default executor.
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
#: Threads for retention runs and snapshot files (see the module docstring).
MAINTENANCE_THREADS = 1

T = TypeVar("T")


class Executors:
    """The read, validation and maintenance pools of one application (see the module
    docstring)."""

    def __init__(self, read_threads: int = READ_THREADS,
                 validate_threads: int = VALIDATE_THREADS) -> None:
        if read_threads < 1 or validate_threads < 1:
            raise ValueError("each pool needs at least one thread")
        self.read_threads = read_threads
        self.validate_threads = validate_threads
        self._reads: ThreadPoolExecutor | None = None
        self._validation: ThreadPoolExecutor | None = None
        self._maintenance: ThreadPoolExecutor | None = None

    async def start(self, _app: web.Application) -> None:
        """Create the pools (an ``on_startup`` hook)."""
        self._reads = ThreadPoolExecutor(self.read_threads, thread_name_prefix="messaging-read")
        self._validation = ThreadPoolExecutor(self.validate_threads,
                                              thread_name_prefix="messaging-validate")
        self._maintenance = ThreadPoolExecutor(MAINTENANCE_THREADS,
                                               thread_name_prefix="messaging-maintenance")

    async def stop(self, _app: web.Application) -> None:
        """Refuse new work, wait for the work in flight, end the threads (``on_cleanup``)."""
        pools = [pool for pool in (self._reads, self._validation, self._maintenance)
                 if pool is not None]
        self._reads = self._validation = self._maintenance = None
        for pool in pools:
            # Joining threads blocks: do it off the loop.
            await asyncio.to_thread(pool.shutdown)

    def read(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run a blocking read of topic files on the read threads."""
        return self._run(self._reads, function, args)

    def validate(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run the validation of a publish body on the validation threads."""
        return self._run(self._validation, function, args)

    def maintain(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run a retention run or a snapshot file read on the maintenance thread."""
        return self._run(self._maintenance, function, args)

    @staticmethod
    def _run(pool: ThreadPoolExecutor | None, function: Callable[..., T],
             args: tuple[Any, ...]) -> asyncio.Future[T]:
        if pool is None:
            raise BrokerClosedError("the broker is not serving (starting or shutting down)")
        return asyncio.get_running_loop().run_in_executor(pool, function, *args)


#: Where an application keeps its pools (the server's retention timer uses them too).
EXECUTORS = web.AppKey("executors", Executors)
