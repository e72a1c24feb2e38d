"""Fetching what pointer entries name: one GET per intake object per node, shared by the logs
it serves here.

A holder meets a pointer entry (:mod:`messaging.log.etcd.pointer`) when the watch delivers it:
the fetch starts then, on the loop (:meth:`LogReads.prefetch`), while the revisions before it
are applied. The writer thread, when it comes to the entry, waits for the bytes
(:meth:`LogReads.fetch`). A node that applies every log an object serves fetches the object
once, whole, and each of its logs takes its range from that; a node that applies only some
fetches just its ranges; the node that wrote the object fetches nothing (it keeps what it
wrote until its logs have applied it). A fetched object is dropped once every log here has
read it (or after KEEP seconds).

A fetch that fails (the store down, the object missing) raises :class:`IntakeFetchError`: the
applier stops before that entry, says why, and tries again — never skips, never reorders.
Bytes that are not those the pointer names (their checksum) are a damaged entry: the applier
stops for good (see :func:`messaging.log.etcd.entry.resolve`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from messaging.errors import MessagingError
from messaging.log.etcd.entry import CorruptEntryError
from messaging.log.etcd.intake_metrics import IntakeMetrics
from messaging.log.etcd.pointer import Pointer
from messaging.objects.errors import ObjectCorruptError, ObjectStoreError
from messaging.objects.store import ObjectStore

#: A fetched object not read by every log here within this long is dropped (seconds).
KEEP = 60.0
#: Prefetches start only while the objects held or on their way here are below this many
#: bytes (beyond, a fetch starts when its entry's turn comes).
PREFETCH_BYTES = 64 << 20


class IntakeFetchError(MessagingError):
    """The bytes a pointer names could not be fetched now (the store down or slow, the
    object missing): applying waits and tries again."""

    status = 503


@dataclass(slots=True)
class _Fetch:
    task: asyncio.Future[bytes]
    start: int
    uses: int  # logs here that still need it
    expires: float
    seeded: bool = False  # what this node wrote (not a fetch)


class IntakeReads:
    """A node's fetches of intake objects (on the loop)."""

    def __init__(self, store: ObjectStore, *, timeout: float,
                 held: Callable[[], set[str]]) -> None:
        self.store = store
        self.timeout = timeout
        self._held = held
        self._fetches: dict[tuple[str, int, int], _Fetch] = {}
        #: GETs made and bytes fetched since start (diagnostics).
        self.gets = 0
        self.bytes = 0
        self.error: str | None = None

    def seed(self, name: str, data: bytes, logs: int) -> None:
        """The object ``name`` this node just wrote (``data``, for ``logs`` of its logs):
        they apply their pointers from it, without a GET (on the loop)."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        future.set_result(data)
        self._fetches[(name, 0, len(data))] = _Fetch(future, 0, logs,
                                                      time.monotonic() + KEEP, seeded=True)

    def release(self, name: str, size: int, logs: int) -> None:
        """``logs`` of the logs an object this node wrote was seeded for will never read it
        (their pointers failed)."""
        key = (name, 0, size)
        entry = self._fetches.get(key)
        if entry is not None:
            entry.uses -= logs
            if entry.uses <= 0:
                del self._fetches[key]

    def start(self, pointer: Pointer, metrics: IntakeMetrics) -> None:
        """Start fetching what ``pointer`` names, unless that is under way or too much is
        held here already (on the loop)."""
        self.expire()
        if self.holding() < PREFETCH_BYTES:
            self._entry(pointer, metrics)

    def holding(self) -> int:
        """Bytes of the objects fetched here or on their way (not those this node wrote)."""
        return sum(end - start for (_name, start, end), entry in self._fetches.items()
                   if not entry.seeded)

    def expire(self) -> None:
        """Drop what no log here read within KEEP (its log stopped, or it moved on)."""
        now = time.monotonic()
        for key, old in list(self._fetches.items()):
            if old.expires < now and old.task.done():
                del self._fetches[key]

    def _entry(self, pointer: Pointer, metrics: IntakeMetrics) -> tuple[tuple[str, int, int],
                                                                         _Fetch]:
        held = self._held()
        whole = all(key in held for key in pointer.logs)
        key = ((pointer.name, 0, pointer.size) if whole
               else (pointer.name, pointer.offset, pointer.end))
        entry = self._fetches.get(key)
        if entry is None:
            uses = sum(1 for log in pointer.logs if log in held) if whole else 1
            task = asyncio.get_running_loop().create_task(self._get(*key, metrics))
            task.add_done_callback(_retrieved)  # a prefetch nobody awaits fails quietly
            entry = self._fetches[key] = _Fetch(task, key[1], max(uses, 1),
                                                time.monotonic() + KEEP)
        return key, entry

    async def read(self, pointer: Pointer, metrics: IntakeMetrics) -> bytes:
        """The bytes ``pointer`` names (on the loop); IntakeFetchError when they cannot be
        had now, CorruptEntryError when the store holds other bytes."""
        key, entry = self._entry(pointer, metrics)
        try:
            data = await asyncio.shield(entry.task)
        except BaseException:
            if self._fetches.get(key) is entry and entry.task.done():
                del self._fetches[key]  # the next try fetches again
            raise
        entry.uses -= 1
        if entry.uses <= 0 and self._fetches.get(key) is entry:
            del self._fetches[key]
        return data[pointer.offset - entry.start:pointer.end - entry.start]

    async def _get(self, name: str, start: int, end: int, metrics: IntakeMetrics) -> bytes:
        self.gets += 1
        metrics.gets.inc()
        metrics.fetched.inc()
        try:
            async with asyncio.timeout(self.timeout):
                data = await self.store.get_range(name, start, end)
        except TimeoutError:
            self.error = (f"intake object {name} in {self.store.url}: no answer within "
                          f"{self.timeout:g}s")
            raise IntakeFetchError(self.error) from None
        except ObjectCorruptError as err:
            self.error = str(err)
            raise CorruptEntryError(str(err)) from err
        except ObjectStoreError as err:
            self.error = f"intake object {name}: {err}"
            raise IntakeFetchError(self.error) from err
        self.error = None
        self.bytes += len(data)
        return data

    def clear(self) -> None:
        """Drop every fetch (the last log using them stopped)."""
        for entry in self._fetches.values():
            entry.task.cancel()
        self._fetches.clear()

    def describe(self) -> dict[str, Any]:
        """Diagnostics."""
        return {"gets": self.gets, "bytes": self.bytes, "held": len(self._fetches),
                "error": self.error}


class LogReads:
    """One log's use of the node's fetches: started on the loop, awaited by its writer
    thread."""

    def __init__(self, reads: IntakeReads, metrics: IntakeMetrics) -> None:
        self.reads = reads
        self.metrics = metrics
        self._loop: asyncio.AbstractEventLoop | None = None

    def prefetch(self, pointer: Pointer) -> None:
        """Start fetching (on the loop, as the watch delivers the entry)."""
        self._loop = asyncio.get_running_loop()
        self.reads.start(pointer, self.metrics)

    def fetch(self, pointer: Pointer) -> bytes:
        """The bytes ``pointer`` names (writer thread: waits for the loop's fetch)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            raise IntakeFetchError("the event loop is not running")
        future = asyncio.run_coroutine_threadsafe(self.reads.read(pointer, self.metrics),
                                                  loop)
        try:
            return future.result(self.reads.timeout + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise IntakeFetchError(f"intake object {pointer.name}: no answer within "
                                   f"{self.reads.timeout:g}s") from None
        except concurrent.futures.CancelledError:
            raise IntakeFetchError("the fetch was cancelled (the node is closing)") from None


def _retrieved(task: asyncio.Future[bytes]) -> None:
    """Mark a fetch's failure as seen (its reader, if any, hears it from its own await)."""
    if not task.cancelled():
        task.exception()
