"""One watch stream per etcd cluster: the watches of every command log a node applies there.

A node that holds several topic groups whose logs live in one etcd cluster watches each log
key on one gRPC ``Watch`` stream (etcd multiplexes watchers on a stream by watch id), so it
keeps one stream, one reader and one HTTP/2 stream's worth of etcd's per-stream work for all
of them rather than one per group. :class:`WatchStream` owns the stream: it opens it on first
use, on its current endpoint; reads every response and hands it to the :class:`KeyWatch` of
its watch id; and, when the stream fails, fails every watch on it and opens the next one on
the next endpoint when a watch is opened again (:class:`~messaging.log.etcd.watch.LogWatch`
restarts its watch after any failure). A watch etcd refuses or cancels, or does not confirm
within CREATED_WITHIN, fails the stream as well: the next one is opened with fresh
credentials (a long-lived stream keeps the token it was opened with).

A key watch never holds the others back: the reader never waits. Each watch has a buffer of
its own; one whose consumer is more than BUFFERED_RESPONSES responses or BUFFERED_BYTES of
values behind (an apply catching up, an applier that stopped, a disk that stalls) is
cancelled at etcd, its consumer still gets every response it holds, then
:class:`FellBehind`, and its log watch opens it again from the revision after the last one
it delivered, which etcd still holds (compaction never passes a node's durable revision).

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

#: A consumer this many responses behind has its watch cancelled (see the module).
BUFFERED_RESPONSES = 256
#: ... or this many bytes of values behind (per watch: a node whose groups all catch up at
#: once may hold this much for each).
BUFFERED_BYTES = 32 << 20
#: A watch etcd has not confirmed this long after it was asked for fails its stream.
CREATED_WITHIN = 5.0


class FellBehind(Exception):
    """A key watch's consumer fell too far behind the stream: it was cancelled at etcd."""


class KeyWatch:
    """One key's watch on a :class:`WatchStream`: an async iterator of its responses (each an
    etcd ``WatchResponse`` of this watch, its ``created`` one first), ending with the failure
    that stopped it. A compaction past its start raises
    :class:`~messaging.log.etcd.client.CompactedError`; a failed stream or a consumer that
    fell behind raise an error that says why."""

    def __init__(self, stream: WatchStream, watch_id: int, key: bytes, generation: int) -> None:
        self.watch_id = watch_id
        self.key = key
        #: The stream it runs on (WatchStream.generation when it was opened).
        self.generation = generation
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
            self._bytes = 0
            self._stream.forget(self)
            _wake(self._waiter)

    # -- the stream's side ------------------------------------------------------------------

    def take(self, response: Any) -> None:
        """A response of this watch, from the stream's reader."""
        if self._closed or self._error is not None:
            return
        if response.compact_revision:
            self.fail(CompactedError(int(response.compact_revision)))
            return
        if response.created:
            self.live = True
        self._responses.append(response)
        self._bytes += _value_bytes(response)
        if len(self._responses) > BUFFERED_RESPONSES or self._bytes > BUFFERED_BYTES:
            # Cancelled at etcd; what it holds is still handed on, then FellBehind.
            self.fail(FellBehind(f"the watch of {self.key.decode()} fell "
                                 f"{len(self._responses)} responses ({self._bytes} bytes) "
                                 "behind its stream: cancelled, to be opened again after "
                                 "what it holds"))
            self._stream.forget(self)
        _wake(self._waiter)

    def fail(self, error: BaseException) -> None:
        """End this watch with ``error`` (after what it already holds)."""
        if self._error is None:
            self._error = error
        _wake(self._waiter)


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


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
        self._chores: set[asyncio.Task[None]] = set()
        #: Streams opened so far (a new one after each failure): the current one's number.
        self.generation = 0

    def endpoint_url(self) -> str:
        """The URL of the endpoint the stream runs (or will run) on."""
        return self._endpoints[self.endpoint]

    def watches(self) -> int:
        """Key watches on the stream now."""
        return len(self._watches)

    def endpoint_failed(self, endpoint: int) -> None:
        """A call to ``endpoint`` failed: while no stream runs, the next one goes to the next
        endpoint (a running stream stays where it works)."""
        if self._call is None and endpoint == self.endpoint:
            self.endpoint = (self.endpoint + 1) % len(self._endpoints)

    async def open(self, key: bytes, start_revision: int) -> KeyWatch:
        """Watch ``key`` from ``start_revision`` on the stream (opened first if none runs)."""
        call = await self._running_call()
        watch = KeyWatch(self, self._next_id, key, self.generation)
        self._next_id += 1
        self._watches[watch.watch_id] = watch
        try:
            async with self._writing:
                await call.write(self.client.watch_create(key, start_revision, watch.watch_id))
        except asyncio.CancelledError:
            self.forget(watch)  # the create may have gone out
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            raise ConnectionError("the watch stream ended while a watch was opened on it"
                                  ) from None
        except Exception as err:
            self.forget(watch)
            self._failed(call, err)
            raise
        self._chore(self._confirmed(call, watch), "messaging-etcd-watch-created")
        return watch

    def restart(self, reason: str, generation: int) -> None:
        """End stream ``generation`` if it still runs (every watch on it fails with
        ``reason``): the next watch opened starts one on the next endpoint. A watch judged
        stuck while it waited on its stream calls this."""
        call = self._call
        if call is not None and generation == self.generation:
            self._failed(call, TimeoutError(reason))

    def forget(self, watch: KeyWatch) -> None:
        """A watch closed or fell behind: cancel it at etcd while its stream runs."""
        if self._watches.pop(watch.watch_id, None) is None or self._call is None:
            return
        if watch.generation == self.generation:
            self._chore(self._cancel(self._call, watch.watch_id), "messaging-etcd-watch-cancel")

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
        for task in list(self._chores):
            await cancel_and_wait(task)

    # -- the stream ---------------------------------------------------------------------------

    async def _running_call(self) -> grpc.aio.StreamStreamCall:
        async with self._opening:
            if self._call is None:
                call = await self.client.watch_stream(self.endpoint)
                self._call = call
                self.generation += 1
                if self._reader is not None and not self._reader.done():
                    self._reader.cancel()  # an older stream's, ending anyway
                self._reader = asyncio.get_running_loop().create_task(
                    self._read(call), name="messaging-etcd-watch-stream")
            return self._call

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        """Hand each response to its watch until the stream ends."""
        error: BaseException
        try:
            async for response in call:
                watch = self._watches.get(int(response.watch_id))
                if watch is None and response.watch_id != -1:
                    continue  # a watch closed meanwhile (or the confirmation of its cancel)
                if response.canceled and not response.compact_revision:
                    # etcd refused or ended a watch of ours (an expired token, permissions:
                    # refused creates come as watch -1): a stream opened afresh, with a token
                    # asked for afresh, is the way out
                    error = ConnectionError(f"etcd cancelled a watch on this stream: "
                                            f"{response.cancel_reason or 'no reason given'}")
                    self.client.forget_token()
                    self._failed(call, error)
                    return
                if watch is None:
                    continue
                watch.take(response)
            error = ConnectionError("watch stream ended")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the reader itself is cancelled (close, or a newer stream)
            error = ConnectionError("watch stream cancelled")  # the call, under the reader
        except Exception as err:
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

    async def _confirmed(self, call: grpc.aio.StreamStreamCall, watch: KeyWatch) -> None:
        """Fail the stream if etcd has not confirmed ``watch`` within CREATED_WITHIN."""
        await asyncio.sleep(CREATED_WITHIN)
        if not watch.live and self._watches.get(watch.watch_id) is watch:
            self._failed(call, TimeoutError(
                f"etcd did not confirm the watch of {watch.key.decode()} within "
                f"{CREATED_WITHIN:g}s"))

    async def _cancel(self, call: grpc.aio.StreamStreamCall, watch_id: int) -> None:
        with contextlib.suppress(Exception):  # best effort: a dead stream took it along
            async with self._writing:
                if self._runs(call):
                    await call.write(self.client.watch_cancel(watch_id))

    def _chore(self, work: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    def _runs(self, call: grpc.aio.StreamStreamCall) -> bool:
        """Whether ``call`` is the stream that runs now."""
        return self._call is call
