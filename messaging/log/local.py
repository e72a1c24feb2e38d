"""LocalLog, the embedded single-node log with group commit.

LocalLog writes on one dedicated thread: while it writes and fsyncs one group of commands,
new ones queue up and become the next group, so concurrent publishes share one write and one
fsync. A request is answered once its group is durable (``fsync="always"``) and visible to
readers; the streams that follow its topics are written to first, then the publishers are
answered. The writer does not wait for either: it takes the next group as soon as the last
one's fsync returns.

Ownership: the queue of commands is appended to on the loop and taken from on the writer
thread (deque operations are atomic); whether the writer is asleep, and waking it, is
:class:`WriterWakeup`'s, behind its lock; everything the writer writes (the broker, the
deferred fsyncs) stays on the writer thread, and results go back to the loop with one
``call_soon_threadsafe`` per group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any

from messaging.broker.broker import Broker
from messaging.broker.commands import ApplyResult
from messaging.clock import now_ms
from messaging.config import FSYNC_MODES, FsyncMode
from messaging.errors import BrokerClosedError, MessagingError
from messaging.log.base import answer_callers

log = logging.getLogger(__name__)

FSYNC_INTERVAL = 0.1
#: Upper bound on the bytes of commands written as one group.
MAX_GROUP_BYTES = 64 << 20


class DeferredSync:
    """Topics written but not yet fsynced, for the modes that fsync every FSYNC_INTERVAL."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._topics: set[int] = set()
        self._lock = threading.Lock()
        #: The first fsync that failed (None: none did); set by the thread that flushed, read
        #: by any (a single reference store).
        self.failed: MessagingError | None = None

    def add(self, topics: Iterable[int]) -> None:
        """Remember topics to fsync at the next flush (any thread)."""
        with self._lock:
            self._topics.update(topics)

    @property
    def pending(self) -> bool:
        """Whether topics wait for a flush (any thread)."""
        with self._lock:
            return bool(self._topics)

    def flush(self) -> None:
        """fsync every remembered topic (blocking: run it on a thread).

        A failure is logged and stops the topic for writes (see :meth:`Topic.sync`); the
        periodic flush carries on for the others.
        """
        with self._lock:
            topics, self._topics = self._topics, set()
        if topics:
            try:
                self.broker.sync(topics)
            except MessagingError as err:
                log.error("periodic fsync failed: %s", err)
                if self.failed is None:
                    self.failed = err

    async def run(self, executor: Executor | None = None,
                  interval: float = FSYNC_INTERVAL) -> None:
        """Flush every ``interval`` seconds until cancelled; an idle tick hands nothing to
        the executor (waking a thread ten times a second per log is not free)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            if self.pending:
                await loop.run_in_executor(executor, self.flush)


class WriterWakeup:
    """Wakes the writer thread when a command is queued while it sleeps, and only then.

    The writer thread calls :meth:`sleep`; the event loop calls :meth:`ring` after queueing
    a command (or asking the writer to close). The flag that says the writer is asleep
    changes behind ``_lock``, which either side holds for a check and an assignment, never
    across I/O or the sleep itself. The writer sleeps by acquiring ``_signal``, a lock held
    while no ring is pending, and a ring releases it: both are one call into C, where a
    ``threading.Event`` is a Python condition with a lock of its own per wait (on this path
    once per publish). A busy writer is not woken (no ring is pending while it writes): it
    finds new commands when it takes its next group, so concurrent publishes still pile up
    into one group.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asleep = False
        self._signal = threading.Lock()
        self._signal.acquire()  # held: no ring pending

    def ring(self) -> None:
        """Something was queued for the writer (the loop): wake it if it sleeps."""
        with self._lock:
            if self._asleep:
                self._asleep = False
                self._signal.release()

    def sleep(self, has_work: Callable[[], bool], timeout: float | None) -> None:
        """Sleep until rung or ``timeout`` (None: no limit), unless ``has_work()`` (the writer
        thread). ``has_work`` is asked under the lock: whatever is queued before it is seen
        by it, whatever after rings a writer marked asleep."""
        with self._lock:
            if has_work():
                return
            self._asleep = True
        if self._signal.acquire(timeout=-1 if timeout is None else timeout):
            return  # rung (the ring cleared the flag)
        with self._lock:
            if self._asleep:
                self._asleep = False  # nobody rang
            else:
                self._signal.acquire()  # rung after the timeout: take the ring (at once)


class LocalLog:
    """The embedded single-node log: commands go straight to the broker, in groups.

    One writer thread owns every write. It takes whatever commands are queued as one group,
    writes and fsyncs it, hands the results to the event loop (one ``call_soon_threadsafe``
    per group) and at once takes the next group: the disk never waits for the loop to answer
    the last group's publishers.
    """

    def __init__(self, broker: Broker, url: str, fsync: FsyncMode = "always") -> None:
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_MODES)}")
        self.broker = broker
        self.url = url
        self.fsync = fsync
        # Appended on the loop, taken on the writer thread: deque operations are atomic.
        self._pending: deque[tuple[bytes, asyncio.Future[ApplyResult]]] = deque()
        self._wakeup = WriterWakeup()
        self._unsynced = DeferredSync(broker)
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self.groups = 0

    async def start(self) -> None:
        """Start the writer thread."""
        self._loop = asyncio.get_running_loop()
        self._stopped = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, name="messaging-writer", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Finish every queued command, fsync, and stop the writer."""
        self._closing = True
        self._wakeup.ring()
        if self._stopped is not None:
            await asyncio.shield(self._stopped)  # the writer drains the queue and returns
        if self._thread is not None:
            # Joining a thread blocks: do it on another thread, not on the loop.
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    async def apply(self, command: bytes) -> ApplyResult:
        """Queue a command and wait until it is applied (and durable in ``always`` mode)."""
        if self._closing or (self._stopped is not None and self._stopped.done()):
            raise BrokerClosedError("the broker is shutting down")
        future: asyncio.Future[ApplyResult] = asyncio.get_running_loop().create_future()
        self._pending.append((command, future))
        self._wakeup.ring()
        started = time.perf_counter()
        result = await future
        self.broker.metrics.publish_latency.observe(time.perf_counter() - started)
        return result

    def urls(self) -> list[str]:
        """Just this node."""
        return [self.url]

    def not_ready(self) -> str | None:
        """Why this node cannot take writes (None: it can)."""
        return "shutting down" if self._closing else None

    async def read_barrier(self) -> None:
        """Nothing to wait for: every acknowledged command was applied here before its
        answer."""

    def diagnostics(self, window: float = 60.0) -> dict[str, Any]:
        """Role and write-path figures (``window``: unused, nothing here is windowed)."""
        return {"role": "standalone", "leader": self.url, "peers": [], "fsync": self.fsync,
                "groups": self.groups, "pending": len(self._pending)}

    # -- the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        """The writer thread: groups until closed and drained, periodic fsyncs between.

        ``interval`` fsyncs every FSYNC_INTERVAL; ``never`` only when closing. Nothing that
        goes wrong here ends the thread: a failed group answers its own publishers, a failed
        flush is logged; if the thread ends anyway, every queued publish is answered.
        """
        assert self._loop is not None
        periodic = self.fsync == "interval"
        next_flush = time.monotonic() + FSYNC_INTERVAL
        try:
            while True:
                timeout = max(0.0, next_flush - time.monotonic()) if periodic else None
                self._wakeup.sleep(self._has_work, timeout)
                while self._pending:
                    group = self._take_group()
                    try:
                        results = self._write([command for command, _ in group])
                    except Exception as err:  # disk trouble: every waiter hears about it
                        log.exception("writing a group of %d commands failed", len(group))
                        results = [err] * len(group)
                    self._call(self._settle, group, results)
                if self.fsync != "always" and (
                        self._closing or (periodic and time.monotonic() >= next_flush)):
                    self._flush()
                    next_flush = time.monotonic() + FSYNC_INTERVAL
                if self._closing and not self._pending:
                    return
        except BaseException:
            log.exception("the writer stopped: publishes are refused from now on")
            raise
        finally:
            self._call(self._finished)

    def _has_work(self) -> bool:
        return bool(self._pending) or self._closing

    def _flush(self) -> None:
        """The deferred fsyncs; a failure is logged (and stops its topic), never raised."""
        try:
            self._unsynced.flush()
        except Exception:
            log.exception("periodic fsync failed")

    def _call(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback`` on the loop (from the writer thread); a closed loop is gone."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(callback, *args)

    def _take_group(self) -> list[tuple[bytes, asyncio.Future[ApplyResult]]]:
        group: list[tuple[bytes, asyncio.Future[ApplyResult]]] = []
        size = 0
        pending = self._pending
        while pending:
            command = pending[0][0]
            if group and size + len(command) > MAX_GROUP_BYTES:
                break
            size += len(command)
            group.append(pending.popleft())
        return group

    def _write(self, commands: list[bytes]) -> list[ApplyResult | BaseException]:
        """Apply a group on the writer thread: one write and one fsync, then visible. The
        writer forms the group, so its clock gives the group's commands their time."""
        durable = self.fsync == "always"
        results: list[ApplyResult | BaseException] = list(
            self.broker.write_group(commands, durable=durable, notify=False,
                                    times=[now_ms()] * len(commands)))
        if not durable:
            self._unsynced.add(topic for result in results if isinstance(result, ApplyResult)
                               for topic in result.topics)
        self.broker.metrics.group_commits.inc(len(commands))
        self.groups += 1
        return results

    # -- back on the loop -------------------------------------------------------------------

    def _settle(self, group: list[tuple[bytes, asyncio.Future[ApplyResult]]],
                results: list[ApplyResult | BaseException]) -> None:
        """Wake the followers of a written group's topics, then answer its publishers."""
        touched: set[int] = set()
        for result in results:
            if isinstance(result, ApplyResult):
                touched |= result.topics
        # Followers first: the fan-out's pass is queued ahead of the publishers' handlers, so
        # a message reaches the streams that wait for it without waiting for the answers to
        # be written (each a turn of a handler task through aiohttp). Whatever waking them
        # meets, the publishers are answered.
        try:
            self.broker.notify(touched)
        finally:
            answer_callers((future for _, future in group), results)

    def _finished(self) -> None:
        """The writer ended: whatever is still queued is answered, not left waiting."""
        while self._pending:
            _command, future = self._pending.popleft()
            if not future.done():
                future.set_exception(BrokerClosedError("the broker's writer stopped"))
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
