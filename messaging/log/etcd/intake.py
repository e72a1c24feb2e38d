"""The intake lane: a cluster's large publishes go to the object store once, and etcd carries
only a pointer to them.

With ``--object-store``, a publish whose command is at least ``--intake-min-size`` bytes
does not go through etcd. The node that receives it gathers such publishes, of any topic and
any of the logs it holds, for at most ``--intake-window`` or MAX_OBJECT_BYTES, and for each
etcd cluster those logs live in:

1. creates the object's *ticket*, the key ``/messaging/<cluster>/intake/<object>`` in that
   etcd (version 1: open);
2. writes one *intake object* ``intake/<node>-<sequence>-<CRC-32C>``: for each log, the
   plain body its inline entry would have had (each command after its length), one after
   the other. The upload is conditional and read back before it counts
   (:meth:`~messaging.objects.store.ObjectStore.put_if_absent`);
3. commits to each log a pointer entry (:mod:`messaging.log.etcd.pointer`: the object, that
   log's byte range, its checksum, its command count) in a put of its own, refused by etcd
   unless the ticket is still open (:meth:`~messaging.log.etcd.writer.LogWriter.
   submit_pointer`);
4. answers each publisher once this node has applied the pointer, exactly as an inline
   publish: the same indexes, answer and idempotence, since a holder applies the very same
   commands (:mod:`messaging.log.etcd.intake_reads` fetches them).

Both lanes share each log, so the order of its publishes is etcd's revision order. The lane is
used only once the cluster writes entry format 4 (every node reads pointers).

When the store (or etcd) fails, the publishes of the object are answered 503 with
``Retry-After``, naming the store, within ``--object-store-timeout``: nothing of them was
committed, so a retry is safe. The objects' lifetime is :mod:`messaging.log.etcd.intake_sweep`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from crc32c import crc32c

from messaging.broker.commands import ApplyResult
from messaging.clock import now_ms
from messaging.config import DEFAULT_INTAKE_MIN_SIZE, DEFAULT_INTAKE_WINDOW, BrokerConfig
from messaging.errors import (
    BrokerClosedError,
    ClusterUnavailableError,
    MessageTooLargeError,
    MessagingError,
)
from messaging.log.etcd.client import EtcdClient, describe
from messaging.log.etcd.entry import body_of
from messaging.log.etcd.entry_format import POINTER_VERSION
from messaging.log.etcd.intake_metrics import IntakeMetrics
from messaging.log.etcd.intake_reads import IntakeReads
from messaging.log.etcd.intake_sweep import INTAKE, IntakeSweep, ticket_key
from messaging.log.etcd.pointer import MAX_OBJECT_BYTES, Pointer
from messaging.log.etcd.writer import LogWriter
from messaging.objects.errors import (
    ObjectConflictError,
    ObjectNotFoundError,
    ObjectStoreError,
    StoreUnavailableError,
)
from messaging.objects.store import ObjectStore
from messaging.quiet_log import RECURRING_LOG_INTERVAL, QuietLog

log = logging.getLogger(__name__)

#: An object is written as soon as the publishes gathered for it reach this many bytes (or
#: before the one that would take it past them).
WINDOW_BYTES = 8 << 20
#: How long a node waits before asking an unanswering store for its marker again (s).
IDENTIFY_RETRY = 5.0
#: The object that tells stores apart (see :attr:`Intake.identity`).
MARKER = f"{INTAKE}store-id"
#: The largest publish the lane takes (it goes in an object of its own).
MAX_COMMAND_BYTES = MAX_OBJECT_BYTES - 1024


@dataclass(eq=False)
class IntakeLane:
    """What the intake needs of one log: its writer, its key, its etcd cluster's name (the
    tickets' place) and its figures."""

    writes: LogWriter
    key: str
    cluster: str
    metrics: IntakeMetrics
    #: Whether every live node of the log reads intake objects from this node's store.
    readers_ready: Callable[[], bool] = lambda: False

    @property
    def client(self) -> EtcdClient:
        """The etcd client of the log's etcd cluster."""
        return self.writes.client


@dataclass(slots=True)
class _Item:
    lane: IntakeLane
    command: bytes
    future: asyncio.Future[ApplyResult]


@dataclass
class _Window:
    items: list[_Item] = field(default_factory=list)
    size: int = 0
    timer: asyncio.TimerHandle | None = None


class Intake:
    """A node's intake lane, shared by every log it holds (see the module)."""

    def __init__(self, store: ObjectStore, *, min_size: int = DEFAULT_INTAKE_MIN_SIZE,
                 window: float = DEFAULT_INTAKE_WINDOW, timeout: float = 10.0,
                 grace: float = 600.0, node: str = "") -> None:
        self.store = store
        self.min_size = min_size
        self.window = window
        self.timeout = timeout
        self.node = node or os.urandom(6).hex()
        self._seq = 0
        self._windows: dict[int, _Window] = {}  # id(client) → what gathers for it
        self._flushes: dict[asyncio.Task[None], set[IntakeLane]] = {}  # objects being written
        self._closings: set[asyncio.Task[None]] = set()  # tickets waiting for their pointers
        self._lanes: list[IntakeLane] = []
        self.reads = IntakeReads(store, timeout=timeout, held=self._held)
        self.sweep = IntakeSweep(store, grace=grace)
        self._sweep_task: asyncio.Task[None] | None = None
        self._identify_task: asyncio.Task[None] | None = None
        self._quiet = QuietLog(log, RECURRING_LOG_INTERVAL)
        #: Which store this node reads intake objects from, as every node that shares it
        #: sees it (announced in its registrations): the store's URL and the contents of
        #: its marker object ``intake/store-id``, made by the first node (a directory of
        #: the same path on another machine has another). None until the store answered.
        self.identity: str | None = None
        #: Objects and bytes written since start, and the last failure (diagnostics).
        self.objects = 0
        self.bytes = 0
        self.error: str | None = None

    @classmethod
    def for_config(cls, config: BrokerConfig, store: ObjectStore | None) -> Intake | None:
        """The intake lane of a node with ``store`` (None: no object store). With
        ``--intake-min-size 0`` it writes nothing but still reads what other nodes wrote."""
        if store is None:
            return None
        return cls(store, min_size=config.intake_min_size, window=config.intake_window,
                   timeout=config.object_store_timeout, grace=config.object_sweep_grace)

    async def _identify(self) -> None:
        """Learn :attr:`identity` (in the background: the store may be down; tried again
        every IDENTIFY_RETRY seconds until it answers)."""
        while self.identity is None:
            try:
                async with asyncio.timeout(self.timeout):
                    marker = await self._marker()
            except (TimeoutError, ObjectStoreError) as err:
                self._quiet.log("identify", logging.WARNING, "cannot read the intake marker "
                                "of %s yet (this node writes no intake object until it "
                                "can): %s", self.store.url, describe(err))
                await asyncio.sleep(IDENTIFY_RETRY)
                continue
            self.identity = f"{self.store.url}#{marker}"

    async def _marker(self) -> str:
        try:
            size = await self.store.size(MARKER)
            return (await self.store.get_range(MARKER, 0, size)).decode(errors="replace")
        except ObjectNotFoundError:
            pass
        try:
            mine = os.urandom(16).hex()
            await self.store.put_new(MARKER, mine.encode())
            return mine
        except ObjectConflictError:  # another node made it first
            size = await self.store.size(MARKER)
            return (await self.store.get_range(MARKER, 0, size)).decode(errors="replace")

    # -- the logs that use it ----------------------------------------------------------------

    def join(self, lane: IntakeLane) -> None:
        """A log of this node uses the intake (on the loop); the first starts the sweep."""
        self._lanes.append(lane)
        self.sweep.watch(lane.cluster, lane.client)
        if self.identity is None and self._identify_task is None:
            self._identify_task = asyncio.create_task(self._identify(),
                                                      name="messaging-intake-identify")
        if self._sweep_task is None:
            self._sweep_task = asyncio.create_task(self.sweep.run(self.reads.expire),
                                                   name="messaging-intake-sweep")

    async def leave(self, lane: IntakeLane) -> None:
        """A log stops (before its writer does): what it gathered is refused, what is on
        its way finishes; the last one stops the sweep."""
        for window in self._windows.values():
            kept = [item for item in window.items if item.lane is not lane]
            for item in window.items:
                if item.lane is lane and not item.future.done():
                    item.future.set_exception(BrokerClosedError("the broker is shutting down"))
            window.items = kept
            window.size = sum(len(item.command) for item in kept)
        mine = [task for task, lanes in self._flushes.items() if lane in lanes]
        if mine:  # its objects on their way: their pointers go to its writer, still running
            await asyncio.wait(mine, timeout=self.timeout + 5)
        with contextlib.suppress(ValueError):
            self._lanes.remove(lane)
        self.sweep.forget(lane.cluster, lane.client, any(
            other.client is lane.client for other in self._lanes))
        if not self._lanes:
            for task in [self._sweep_task, self._identify_task, *self._closings]:
                if task is not None:  # a ticket left open is closed by a sweep later
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            self._sweep_task = self._identify_task = None
            self.reads.clear()

    def _held(self) -> set[str]:
        return {lane.key for lane in self._lanes}

    # -- the lane ----------------------------------------------------------------------------

    def takes(self, lane: IntakeLane, command: bytes) -> bool:
        """Whether ``command`` goes through the intake: large enough, the cluster writes
        pointer entries, and every live node of the log reads this node's store."""
        return 0 < self.min_size <= len(command) and self.open_for(lane)

    def open_for(self, lane: IntakeLane) -> bool:
        """Whether the lane writes pointers to ``lane``'s log now: it takes publishes, the
        cluster writes pointer entries, and every live node reads this node's store."""
        return (self.min_size > 0 and lane.writes.entry_version >= POINTER_VERSION
                and lane.readers_ready())

    def submit(self, lane: IntakeLane, command: bytes) -> asyncio.Future[ApplyResult]:
        """Gather ``command`` into the current window of its etcd cluster; the future gets
        its result once its pointer is applied here (or the error that stopped it)."""
        if len(command) > MAX_COMMAND_BYTES:
            raise MessageTooLargeError(
                f"a publish of {len(command)} bytes of frames is larger than an intake object "
                f"may be ({MAX_COMMAND_BYTES} bytes): split it into smaller batches")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ApplyResult] = loop.create_future()
        key = id(lane.client)
        window = self._windows.get(key)
        if window is not None and window.size + len(command) > WINDOW_BYTES:
            self._flush(key)  # this one would take the object past the window's bytes
            window = None
        if window is None:
            window = self._windows[key] = _Window()
        window.items.append(_Item(lane, command, future))
        window.size += len(command)
        if window.size >= WINDOW_BYTES:
            self._flush(key)
        elif window.timer is None:
            window.timer = loop.call_later(self.window, self._flush, key)
        return future

    def _flush(self, key: int) -> None:
        window = self._windows.pop(key, None)
        if window is None:
            return
        if window.timer is not None:
            window.timer.cancel()
        items = [item for item in window.items if not item.future.done()]
        if not items:
            return
        task = asyncio.create_task(self._write(items), name="messaging-intake-object")
        self._flushes[task] = {item.lane for item in items}
        task.add_done_callback(self._flush_done)

    def _flush_done(self, task: asyncio.Task[None]) -> None:
        self._flushes.pop(task, None)

    async def _write(self, items: list[_Item]) -> None:
        """Ticket, object, then one pointer per log; every item is answered, whatever
        happens."""
        try:
            await self._write_object(items)
        except BaseException as err:
            failure = err if isinstance(err, MessagingError) else MessagingError(
                f"the intake lane failed: {describe(err)}")
            for item in items:
                if not item.future.done():
                    item.future.set_exception(failure)
            if not isinstance(err, Exception):
                raise

    async def _write_object(self, items: list[_Item]) -> None:
        by_lane: dict[IntakeLane, list[_Item]] = {}
        for item in items:
            by_lane.setdefault(item.lane, []).append(item)
        bodies = [body_of([item.command for item in lane_items])
                  for lane_items in by_lane.values()]
        data = b"".join(bodies)
        self._seq += 1
        name = f"{INTAKE}{self.node}-{self._seq:012d}-{crc32c(data):08x}"
        first = next(iter(by_lane))
        ticket = ticket_key(first.cluster, name)
        stored_at = await self._store(first.client, ticket, name, data)
        self.objects += 1
        self.bytes += len(data)
        self.reads.seed(name, data, len(by_lane))
        logs = tuple(lane.key for lane in by_lane)
        offset = 0
        pending: list[list[asyncio.Future[ApplyResult]]] = []
        for (lane, lane_items), body in zip(by_lane.items(), bodies, strict=True):
            pointer = Pointer(name, offset, len(body), crc32c(body), len(data),
                              len(lane_items), logs)
            offset += len(body)
            lane.metrics.objects.inc()
            lane.metrics.bytes.inc(len(body))
            lane.metrics.fill.observe(len(data) / WINDOW_BYTES)
            futures = lane.writes.submit_pointer(
                pointer, [item.command for item in lane_items], ticket)
            for item, future in zip(lane_items, futures, strict=True):
                future.add_done_callback(_pass_on(item.future, lane.metrics, stored_at))
            pending.append(futures)
        closing = asyncio.create_task(self._close(first.client, ticket, name, len(data),
                                                  pending), name="messaging-intake-ticket")
        self._closings.add(closing)
        closing.add_done_callback(self._closings.discard)

    async def _close(self, client: EtcdClient, ticket: bytes, name: str, size: int,
                     pointers: list[list[asyncio.Future[ApplyResult]]]) -> None:
        """Once every pointer of an object is committed or refused, no other will ever be:
        close its ticket now (the sweep would after the grace), so the object goes once etcd
        is compacted past that; what this node kept of it for logs whose pointer failed is
        let go."""
        failed = 0
        for futures in pointers:
            await asyncio.gather(*futures, return_exceptions=True)
            failed += all(f.cancelled() or f.exception() is not None for f in futures)
        if failed:
            self.reads.release(name, size, failed)
        await self.sweep.close_ticket(client, ticket, name)

    async def _store(self, client: EtcdClient, ticket: bytes, name: str, data: bytes) -> float:
        """Open the ticket, then upload and verify the object, within the store's timeout;
        returns when it was stored (time.monotonic). Raises a 503 naming the store."""
        ticketed = False
        try:
            async with asyncio.timeout(self.timeout):
                await client.put(ticket, json.dumps({"node": self.node, "at": now_ms(),
                                                     "bytes": len(data)}).encode())
                ticketed = True
                await self.store.put_new(name, data)
        except TimeoutError:
            if not ticketed:
                raise self._no_ticket(name, f"no answer within {self.timeout:g}s") from None
            self.error = f"intake object {name} was not stored in {self.timeout:g}s"
            raise StoreUnavailableError(self.store.url, name, "it did not answer within "
                                        f"{self.timeout:g}s (--object-store-timeout): the "
                                        "publish was not committed") from None
        except ObjectStoreError as err:
            self.error = str(err)
            raise StoreUnavailableError(self.store.url, name, f"{err}; the publish was not "
                                        "committed") from err
        except (grpc.aio.AioRpcError, MessagingError) as err:
            raise self._no_ticket(name, describe(err)) from err
        self.error = None
        return time.monotonic()

    def _no_ticket(self, name: str, why: str) -> ClusterUnavailableError:
        """etcd did not take an object's ticket: nothing was committed, so a 503 (a ticket
        put that may have left only leaves a ticket the sweep removes)."""
        self.error = f"etcd did not take the ticket of intake object {name}: {why}"
        return ClusterUnavailableError(f"{self.error}; the publish was not committed")

    def describe(self) -> dict[str, Any]:
        """Diagnostics: the settings, what was written and fetched, the last failure."""
        gathering = sum(len(w.items) for w in self._windows.values())
        return {"store": self.identity, "min_size": self.min_size,
                "window_seconds": self.window,
                "objects_written": self.objects, "bytes_written": self.bytes,
                "gathering": gathering,
                "writing": len(self._flushes), "closing": len(self._closings),
                "error": self.error,
                "reads": self.reads.describe(), "sweep": self.sweep.describe()}


def _pass_on(target: asyncio.Future[ApplyResult], metrics: IntakeMetrics,
             stored_at: float) -> Any:
    """A done callback handing a pointer's outcome to its publisher's future."""
    def done(source: asyncio.Future[ApplyResult]) -> None:
        if target.done():
            return
        if source.cancelled():
            target.set_exception(BrokerClosedError("the broker is shutting down"))
        elif (err := source.exception()) is not None:
            target.set_exception(err)
        else:
            metrics.commit.observe(time.monotonic() - stored_at)
            target.set_result(source.result())
    return done

