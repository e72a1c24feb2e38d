"""LocalLog, the embedded single-node log with group commit.

LocalLog writes on one dedicated thread: while it writes and fsyncs one group of commands,
new ones queue up and become the next group, so concurrent publishes share one write and one
fsync. A request is answered once its group is durable (``fsync="always"``) and visible to
readers; readers are woken after the publishers are answered.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from messaging.broker import ApplyResult, Broker, heartbeat_command
from messaging.config import FSYNC_MODES, FsyncMode
from messaging.errors import BrokerClosedError, MessagingError
from messaging.tasks import cancel_and_wait, wait_finished

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

    def add(self, topics: Iterable[int]) -> None:
        """Remember topics to fsync at the next flush (any thread)."""
        with self._lock:
            self._topics.update(topics)

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

    async def run(self, executor: Executor | None = None) -> None:
        """Flush every FSYNC_INTERVAL until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(FSYNC_INTERVAL)
            await loop.run_in_executor(executor, self.flush)


class LocalLog:
    """The embedded single-node log: commands go straight to the broker, in groups."""

    def __init__(self, broker: Broker, url: str, fsync: FsyncMode = "always") -> None:
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_MODES)}")
        self.broker = broker
        self.url = url
        self.fsync = fsync
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="messaging-writer")
        self._pending: list[tuple[bytes, asyncio.Future[ApplyResult]]] = []
        self._wakeup = asyncio.Event()
        self._unsynced = DeferredSync(broker)
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.groups = 0

    async def start(self) -> None:
        """Start the writer (and, in interval mode, the periodic fsync)."""
        self._tasks.append(asyncio.create_task(self._write_loop(), name="messaging-writer"))
        if self.fsync == "interval":
            self._tasks.append(asyncio.create_task(self._unsynced.run(self._writer),
                                                   name="messaging-fsync"))

    async def close(self) -> None:
        """Finish every queued command, fsync, and stop the writer."""
        self._closing = True
        self._wakeup.set()
        for task in self._tasks[:1]:
            await wait_finished(task)  # the writer drains the queue and returns
        for task in self._tasks[1:]:
            await cancel_and_wait(task)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self._unsynced.flush)
        # Joining the writer thread blocks: do it on another thread, not on the loop.
        await loop.run_in_executor(None, self._writer.shutdown)

    async def apply(self, command: bytes) -> ApplyResult:
        """Queue a command and wait until it is applied (and durable in ``always`` mode)."""
        if self._closing:
            raise BrokerClosedError("the broker is shutting down")
        future: asyncio.Future[ApplyResult] = asyncio.get_running_loop().create_future()
        self._pending.append((command, future))
        self._wakeup.set()
        started = time.perf_counter()
        result = await future
        self.broker.metrics.publish_latency.observe(time.perf_counter() - started)
        return result

    async def heartbeat(self, topic: int, index: int, url: str) -> None:
        """Record subscriber progress through the group commit, as durable as a publish."""
        await self.apply(heartbeat_command(topic, index, url))

    def is_leader(self) -> bool:
        """A single node always leads."""
        return True

    def leader_url(self) -> str | None:
        """This node's URL."""
        return self.url

    def urls(self) -> list[str]:
        """Just this node."""
        return [self.url]

    def not_ready(self) -> str | None:
        """Why this node cannot take writes (None: it can)."""
        return "shutting down" if self._closing else None

    def diagnostics(self) -> dict[str, Any]:
        """Role and write-path figures."""
        return {"role": "standalone", "leader": self.url, "peers": [], "fsync": self.fsync,
                "groups": self.groups, "pending": len(self._pending)}

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                group = self._take_group()
                commands = [command for command, _ in group]
                try:
                    results = await loop.run_in_executor(self._writer, self._write, commands)
                except Exception as err:  # disk trouble: every waiter hears about it
                    log.exception("writing a group of %d commands failed", len(group))
                    results = [err] * len(group)
                touched: set[int] = set()
                for (_, future), result in zip(group, results, strict=True):
                    if isinstance(result, ApplyResult):
                        touched |= result.topics
                    if future.done():
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
                # Publishers first, then followers: their wake-ups queue behind the answers.
                self.broker.notify(touched)
            if self._closing:
                return

    def _take_group(self) -> list[tuple[bytes, asyncio.Future[ApplyResult]]]:
        size = 0
        count = 0
        for command, _ in self._pending:
            if count and size + len(command) > MAX_GROUP_BYTES:
                break
            size += len(command)
            count += 1
        group, self._pending = self._pending[:count], self._pending[count:]
        return group

    def _write(self, commands: list[bytes]) -> list[ApplyResult | BaseException]:
        """Apply a group on the writer thread: one write and one fsync, then visible."""
        durable = self.fsync == "always"
        results: list[ApplyResult | BaseException] = list(
            self.broker.write_group(commands, durable=durable, notify=False))
        if not durable:
            self._unsynced.add(topic for result in results if isinstance(result, ApplyResult)
                               for topic in result.topics)
        self.broker.metrics.group_commits.inc(len(commands))
        self.groups += 1
        return results
