"""One watch stream per etcd cluster: the watches of every command log a node applies there.

A node that holds several topic groups whose logs live in one etcd cluster watches each log
key on one gRPC ``Watch`` stream (etcd multiplexes watchers on a stream by watch id), so it
keeps one stream, one reader and one HTTP/2 stream's worth of etcd's per-stream work for all
of them rather than one per group. :class:`WatchStream` owns the stream: it opens it on first
use, on its current endpoint; reads every response and hands it to the :class:`KeyWatch` of
its watch id; and, when the stream fails, fails every watch on it and opens the next one on
the next endpoint when a watch is opened again (:class:`~messaging.log.etcd.watch.LogWatch`
restarts its watch after any failure).

A key watch never holds the others back: each has a buffer of its own, and one whose consumer
falls behind by more than BUFFERED_RESPONSES responses or BUFFERED_BYTES of values (an applier
that stopped, a disk that stalls) is cancelled at etcd and fails with :class:`FellBehind`; its
log watch opens it again from the revision after the last one it delivered, which etcd still
holds (compaction never passes a node's durable revision).

Everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

import grpc

from messaging.aio import cancel_and_wait
from messaging.log.etcd.client import CompactedError, EtcdClient, describe

log = logging.getLogger(__name__)

#: A key watch whose consumer has this many responses waiting is cancelled (FellBehind).
BUFFERED_RESPONSES = 1024
#: ... or this many bytes of values waiting.
BUFFERED_BYTES = 64 << 20


class FellBehind(Exception):
    """A key watch's consumer fell too far behind the stream: it was cancelled at etcd."""


class KeyWatch:
    """One key's watch on a :class:`WatchStream`: an async iterator of its responses (each an
    etcd ``WatchResponse`` of this watch), ending with the failure that stopped it.

    ``live`` once etcd confirmed it (its ``created`` response is handed on too). A
    compaction past its start raises :class:`~messaging.log.etcd.client.CompactedError`; a
    watch etcd cancelled, a failed stream or a consumer that fell behind raise an error that
    says why.
    """

    def __init__(self, stream: WatchStream, watch_id: int, key: bytes) -> None:
        self.watch_id = watch_id
        self.key = key
        self.live = False
        self._stream = stream
        self._responses: deque[Any] = deque()
        self._bytes = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def __aiter__(self) -> KeyWatch:
        return self

    async def __anext__(self) -> Any:
        while not self._responses:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        response = self._responses.popleft()
        self._bytes -= _value_bytes(response)
        return response

    def close(self) -> None:
        """Stop this watch (at etcd too, when its stream still runs); no more responses."""
        if not self._closed:
            self._closed = True
            self._responses.clear()
            self._stream.forget(self)
            self._wake()

    # -- the stream's side ------------------------------------------------------------------

    def take(self, response: Any) -> None:
        """A response of this watch, from the stream's reader."""
        if self._closed or self._error is not None:
            return
        if response.compact_revision:
            self.fail(CompactedError(int(response.compact_revision)))
            return
        if response.canceled:
            self.fail(ConnectionError(response.cancel_reason or "watch canceled by etcd"))
            return
        if response.created:
            self.live = True
        elif not response.events:
            return  # progress: nothing to deliver
        self._responses.append(response)
        self._bytes += _value_bytes(response)
        if len(self._responses) > BUFFERED_RESPONSES or self._bytes > BUFFERED_BYTES:
            waiting, size = len(self._responses), self._bytes
            self._responses.clear()
            self._bytes = 0
            self.fail(FellBehind(f"the watch of {self.key.decode()} fell {waiting} responses "
                                 f"({size} bytes) behind its stream: cancelled, to be "
                                 "opened again from where it is"))
            self._stream.forget(self)
        self._wake()

    def fail(self, error: BaseException) -> None:
        """End this watch with ``error`` (after what it already holds)."""
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _value_bytes(response: Any) -> int:
    return sum(len(event.kv.value) for event in response.events)


class WatchStream:
    """The one watch stream of a node to one etcd cluster (``client``), for every key watch
    of that node there."""

    def __init__(self, client: EtcdClient, endpoints: list[str]) -> None:
        self.client = client
        self._endpoints = endpoints
        #: The endpoint the stream runs (or will run) on.
        self.endpoint = 0
        self._call: grpc.aio.StreamStreamCall | None = None
        self._reader: asyncio.Task[None] | None = None
        self._opening = asyncio.Lock()
        self._writing = asyncio.Lock()
        self._watches: dict[int, KeyWatch] = {}
        self._next_id = 1
        self._cancels: set[asyncio.Task[None]] = set()
        #: Streams opened so far (a new one after each failure).
        self.streams = 0

    def endpoint_url(self) -> str:
        """The URL of the endpoint the stream runs on."""
        return self._endpoints[self.endpoint]

    def watches(self) -> int:
        """Key watches on the stream now."""
        return len(self._watches)

    async def open(self, key: bytes, start_revision: int) -> KeyWatch:
        """Watch ``key`` from ``start_revision`` on the stream (opened first if none runs)."""
        call = await self._running_call()
        watch = KeyWatch(self, self._next_id, key)
        self._next_id += 1
        self._watches[watch.watch_id] = watch
        create = self.client.watch_create(key, start_revision, watch.watch_id)
        try:
            async with self._writing:
                await call.write(create)
        except BaseException as err:
            self._watches.pop(watch.watch_id, None)
            if not isinstance(err, asyncio.CancelledError):
                self._failed(call, err)
            raise
        return watch

    def restart(self, reason: str) -> None:
        """End the stream (every watch on it fails with ``reason``): the next watch opened
        starts one on the next endpoint. A watch judged stuck calls this: its stream is."""
        call = self._call
        if call is not None:
            self._failed(call, TimeoutError(reason))

    def forget(self, watch: KeyWatch) -> None:
        """A watch closed or fell behind: cancel it at etcd while the stream runs."""
        if self._watches.pop(watch.watch_id, None) is None or self._call is None:
            return
        task = asyncio.get_running_loop().create_task(self._cancel(self._call, watch.watch_id),
                                                       name="messaging-etcd-watch-cancel")
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def close(self) -> None:
        """End the stream and every watch on it."""
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        for watch in list(self._watches.values()):
            watch.fail(ConnectionError("the watch stream closed"))
        self._watches.clear()
        if self._reader is not None:
            await cancel_and_wait(self._reader)
        for task in list(self._cancels):
            await cancel_and_wait(task)

    # -- the stream ---------------------------------------------------------------------------

    async def _running_call(self) -> grpc.aio.StreamStreamCall:
        async with self._opening:
            if self._call is None:
                self._call = await self.client.watch_stream(self.endpoint)
                self.streams += 1
                self._reader = asyncio.get_running_loop().create_task(
                    self._read(self._call), name="messaging-etcd-watch-stream")
            return self._call

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        """Hand each response to its watch until the stream ends."""
        error: BaseException
        try:
            async for response in call:
                watch = self._watches.get(int(response.watch_id))
                if watch is not None:
                    watch.take(response)
            error = ConnectionError("watch stream ended")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the reader itself is cancelled (close)
            error = ConnectionError("watch stream cancelled")  # the call, under the reader
        except grpc.aio.AioRpcError as err:
            error = err
        self._failed(call, error)

    def _failed(self, call: grpc.aio.StreamStreamCall, error: BaseException) -> None:
        """The stream ``call`` ended: fail its watches; the next one runs on the next
        endpoint."""
        if not self._runs(call):
            return  # an older stream, already replaced
        self._call = None
        call.cancel()
        watches = list(self._watches.values())
        self._watches.clear()
        for watch in watches:
            watch.fail(error)
        log.debug("watch stream on %s ended (%s); %d watches fail over",
                  self.endpoint_url(), describe(error), len(watches))
        self.endpoint = (self.endpoint + 1) % len(self._endpoints)

    async def _cancel(self, call: grpc.aio.StreamStreamCall, watch_id: int) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError, RuntimeError):
            async with self._writing:
                if self._runs(call):
                    await call.write(self.client.watch_cancel(watch_id))

    def _runs(self, call: grpc.aio.StreamStreamCall) -> bool:
        """Whether ``call`` is the stream that runs now."""
        return self._call is call
