"""A bounded cache of object chunks shared by every reader of one broker.

Objects are read in chunks of :data:`CHUNK` bytes by ranged GETs; chunks are kept, least
recently used first out, while their total stays within ``--object-cache-size``. Readers run
on worker threads and block on a chunk while the event loop fetches it (the store is
asynchronous); two readers wanting the same chunk share one request. A sequential reader asks
for the next chunk (or the next object's first) ahead of time: :meth:`ObjectCache.prefetch`
starts the request and returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import OrderedDict

from messaging.objects.errors import StoreUnreachableError
from messaging.objects.store import ObjectStore
from messaging.tiered.metrics import StoreMetrics, error_kind

#: Bytes per ranged GET and per cache entry.
CHUNK = 1 << 20
#: Seconds a reader waits for one chunk before the store counts as unreachable.
READ_TIMEOUT = 30.0

_Key = tuple[str, int]  # object name, chunk number


class ObjectCache:
    """Chunks of objects, fetched on the loop, kept within ``max_bytes``."""

    def __init__(self, store: ObjectStore, loop: asyncio.AbstractEventLoop, max_bytes: int,
                 metrics: StoreMetrics, *, chunk: int = CHUNK,
                 timeout: float = READ_TIMEOUT) -> None:
        self.store = store
        self.loop = loop
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.chunk = chunk
        self.timeout = timeout
        self._chunks: OrderedDict[_Key, bytes] = OrderedDict()
        self._pending: dict[_Key, concurrent.futures.Future[bytes]] = {}
        self._lock = threading.Lock()
        self.size = 0  # bytes held

    def read(self, name: str, object_size: int, start: int, end: int) -> bytes:
        """Bytes ``start`` up to ``end`` of the object ``name`` of ``object_size`` bytes.

        Blocking: call it from a worker thread, never on the loop. Raises the store's
        errors (:mod:`messaging.objects.errors`).
        """
        end = min(end, object_size)
        parts: list[bytes] = []
        position = start
        while position < end:
            number = position // self.chunk
            data = self._get(name, object_size, number)
            base = number * self.chunk
            parts.append(data[position - base:min(end - base, len(data))])
            position = base + len(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def prefetch(self, name: str, object_size: int, position: int) -> None:
        """Start fetching the chunk holding ``position`` unless it is cached or on its way
        (any thread; returns at once; a failure is left for the read that needs it)."""
        if position >= object_size:
            return
        key = (name, position // self.chunk)
        with self._lock:
            if key in self._chunks or key in self._pending:
                return
            self._pending[key] = self._fetch_later(key, object_size)

    def _get(self, name: str, object_size: int, number: int) -> bytes:
        key = (name, number)
        with self._lock:
            data = self._chunks.get(key)
            if data is not None:
                self._chunks.move_to_end(key)
                self.metrics.cache_hits.inc()
                return data
            future = self._pending.get(key)
            if future is None:
                future = self._pending[key] = self._fetch_later(key, object_size)
                self.metrics.cache_misses.inc()
            else:
                self.metrics.cache_hits.inc()  # a prefetch (or another reader) asked first
        try:
            # The fetch gives up by itself after ``timeout`` (see _fetch); the wait here only
            # guards against a loop that no longer runs. The future is shared with other
            # readers and prefetches: never cancelled from here.
            return future.result(self.timeout + 5)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            error = StoreUnreachableError(self.store.url, name,
                                          f"no answer in {self.timeout:g} s")
            self.metrics.error("read", error_kind(error))
            raise error from None

    def _fetch_later(self, key: _Key, object_size: int) -> concurrent.futures.Future[bytes]:
        """The request for one chunk, run on the loop (``_lock`` held)."""
        return asyncio.run_coroutine_threadsafe(self._fetch(key, object_size), self.loop)

    async def _fetch(self, key: _Key, object_size: int) -> bytes:
        name, number = key
        start = number * self.chunk
        try:
            try:
                data = await asyncio.wait_for(
                    self.store.get_range(name, start, min(object_size, start + self.chunk)),
                    self.timeout)
            except TimeoutError:
                raise StoreUnreachableError(self.store.url, name,
                                            f"no answer in {self.timeout:g} s") from None
        except BaseException as err:
            with self._lock:
                self._pending.pop(key, None)
            if isinstance(err, Exception):
                self.metrics.error("read", error_kind(err))
            raise
        self.metrics.read_bytes.inc(len(data))
        self._keep(key, data)
        return data

    def _keep(self, key: _Key, data: bytes) -> None:
        """Cache a fetched chunk (and it is no longer pending)."""
        with self._lock:
            self._pending.pop(key, None)
            if key in self._chunks or len(data) > self.max_bytes:
                return
            self._chunks[key] = data
            self.size += len(data)
            while self.size > self.max_bytes:
                _key, dropped = self._chunks.popitem(last=False)
                self.size -= len(dropped)

    def forget(self, name: str) -> None:
        """Drop every cached chunk of an object (deleted from the store)."""
        with self._lock:
            for key in [k for k in self._chunks if k[0] == name]:
                self.size -= len(self._chunks.pop(key))
