"""Conn, a subscription to one topic, handing out verified frames (FrameBatch).

A Conn owns two background tasks: a reader that keeps one GET of the topic open (resuming from
the last received index + 1 after a break, so nothing is re-delivered or skipped) and a
heartbeat that reports the processed index. It talks to brokers only through the small
:class:`BrokerClient` protocol (which :class:`~messaging.client.Client` implements) and decides
when to give up with :mod:`messaging.failover`'s :class:`~messaging.failover.Retry`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Protocol

from messaging.aio import wait_finished
from messaging.client.times import TimedBatch, TimeRuns, timed
from messaging.clock import parse_moment
from messaging.errors import (
    ConnClosedError,
    ConnectionFailedError,
    ConnStateError,
    CorruptFrameError,
    MessagingError,
    NotFoundError,
    TopicTruncatedError,
)
from messaging.failover import Retry, RetryPolicy
from messaging.frames import (
    FRAMES_CONTENT_TYPE,
    HEADER,
    HEADER_SIZE,
    BatchDecoder,
    FrameBatch,
    Message,
    decode_slices,
)

log = logging.getLogger(__name__)

_QUEUE_CHUNKS = 16
#: Messages made into objects at a time while iterating (see :func:`decode_slices`): made a
#: whole 1,000-message batch at once, the full collections they brought took about half the
#: iteration time.
_SLICE = 64
_MESSAGES_PATH = "/messaging/messages"
#: How often a Conn with times asks for a message's time before giving up (None), and the
#: pause between (growing).
TIMES_ATTEMPTS = 5
TIMES_RETRY_DELAY = 0.05


class BrokerClient(Protocol):
    """What a Conn needs from its client (:class:`~messaging.client.Client`)."""

    @property
    def retry_policy(self) -> RetryPolicy:
        """How long and how often to retry."""
        ...

    @property
    def reached(self) -> bool:
        """Whether any broker ever answered."""
        ...

    def stream(self, path: str, params: dict[str, str],
               content_type: str) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """An open GET's body as chunks; one round over the brokers, no retries."""
        ...

    async def heartbeat(self, topic: int, index: int, url: str) -> None:
        """Report that subscriber ``url`` processed ``topic`` through ``index``."""
        ...

    async def times(self, topic: int | str, index: int = 0,
                    end: int | None = None) -> TimeRuns:
        """The append times of ``topic``'s messages from ``index``."""
        ...


class _End:
    """Queued by the reader task when a non-streaming read reached the end of the topic."""


class Conn:
    """A subscription: ``await conn.open(index)``, then ``async for message in conn``.

    A background task reads the stream (reconnecting from ``index + 1`` with backoff after a
    break, so nothing is re-delivered or skipped) and another heartbeats :attr:`index`. When
    no broker answers for the client's ``retry_timeout`` (or, before any broker ever answered,
    every URL refuses the connection), iteration raises :class:`ConnectionFailedError`.
    """

    def __init__(self, client: BrokerClient, topic: int, data_url: str | None,
                 heartbeat_interval: float, consumer: str | None = None, *,
                 times: bool = False) -> None:
        self.client = client
        self.topic = topic
        #: Whether messages handed out carry their append time (:attr:`Message.time`).
        self.times = times
        self._runs: TimeRuns | None = None  # the times of the messages being handed out
        self._since: int | str | None = None  # open(since=...): the first read's start
        #: A consumer name: open() starts right after its stored position, and it heartbeats
        #: as that subscriber unless ``data_url`` names another.
        self.consumer = consumer
        self.data_url = data_url if data_url is not None else consumer
        self.heartbeat_interval = heartbeat_interval
        self.index = 0
        self.streaming = True
        self._state = "new"
        self._queue: asyncio.Queue[FrameBatch | BaseException | _End] = asyncio.Queue(
            _QUEUE_CHUNKS)
        self._current: list[Message] = []  # the slice being handed out
        self._position = 0  # within _current
        self._current_batch: FrameBatch | None = None
        self._slices: Iterator[tuple[int, list[Message]]] = iter(())  # of _current_batch
        self._slice_at = 0  # the byte offset of _current in _current_batch
        self._made = 0  # messages of _current_batch made so far, _current's included
        self._tasks: list[asyncio.Task[None]] = []
        self._received = 0
        self._from_first = False  # opened at index 0 and nothing received yet
        self._answered = False  # the last read attempt got a 200
        self._by_consumer = False  # the next read starts after the consumer's stored position
        self.reconnects = 0
        #: Called once when reads start failing (with the error), and once when a broker
        #: answers again: for a command to say it is waiting (``messaging tail --follow``).
        self.on_wait: Callable[[MessagingError], None] | None = None
        self.on_resume: Callable[[], None] | None = None
        self._waiting = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._state == "closed"

    async def open(self, index: int = 0, streaming: bool = True, *,
                   since: int | str | None = None) -> None:
        """Start reading from ``index`` (inclusive); non-streaming stops at the topic's end.

        ``index`` 0 starts at the first index retention kept; reading from a nonzero index
        that retention deleted raises :class:`TopicTruncatedError` while iterating. A Conn
        made with a ``consumer`` name ignores ``index``: it starts right after the position
        the broker stores for that consumer (at the first kept index for a new one).
        ``since`` (ms since the epoch, RFC 3339 text, or a duration back from now such as
        ``"15m"``) starts at the first message appended at or after then instead.
        """
        if since is not None and (index or self.consumer is not None):
            raise ConnStateError("give index, since or a consumer name, not more than one")
        if self._state == "closed":
            raise ConnClosedError("this Conn is closed; create a new one")
        if self._state == "open":
            raise ConnStateError("this Conn is already open")
        self._state = "open"
        self.streaming = streaming
        self.index = self._received = max(index - 1, 0)
        self._from_first = index == 0
        if self.consumer is not None:
            self.index = self._received = 0
            self._from_first, self._by_consumer = False, True
        if since is not None:
            # A duration counts back from now, once: a read resumed later starts there too.
            self._from_first = False
            self._since = parse_moment(since) if isinstance(since, str) else since
        self._tasks.append(asyncio.create_task(self._read_loop(), name="messaging-conn-read"))
        if self.data_url and self.heartbeat_interval > 0:
            self._tasks.append(asyncio.create_task(self._heartbeat_loop(),
                                                   name="messaging-conn-heartbeat"))

    async def close(self) -> None:
        """End the iteration and stop the background tasks."""
        if self._state == "closed":
            return
        was_open = self._state == "open"
        self._state = "closed"
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            await wait_finished(task)  # the caller's own cancellation goes on
        self._tasks = []
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(_End())
        if was_open and self.data_url and self.index:
            with contextlib.suppress(MessagingError):
                await self.client.heartbeat(self.topic, self.index, self.data_url)

    async def commit(self, index: int | None = None) -> None:
        """Heartbeat ``index`` (default :attr:`index`, the last message handed out) now, as
        ``data_url``: with a consumer name, its stored position (never moved backwards)."""
        if not self.data_url:
            raise ConnStateError("this Conn has no consumer name or data_url to commit as")
        await self.client.heartbeat(self.topic, self.index if index is None else index,
                                    self.data_url)

    async def __aenter__(self) -> Conn:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> Conn:
        return self

    async def __anext__(self) -> Message:
        if self._position < len(self._current):
            message = self._current[self._position]
            self._position += 1
            self.index = message.index
            return message if not self.times else await self._timed(message)
        made = next(self._slices, None)
        if made is None:
            batch = await self._next_batch()
            self._current_batch = batch
            self._slices = decode_slices(batch.buffer, _SLICE)
            self._made = 0
            made = next(self._slices)
        self._slice_at, self._current = made
        self._made += len(self._current)
        self._position = 1
        message = self._current[0]
        self.index = message.index
        return message if not self.times else await self._timed(message)

    async def _timed(self, message: Message) -> Message:
        """``message`` with its append time (see :meth:`_runs_through`)."""
        runs = await self._runs_through(message.index, message.index)
        covered = runs is not None and runs.covers(message.index)
        return timed(message, runs.time_of(message.index) if covered and runs else None)

    async def _runs_through(self, first: int, last: int) -> TimeRuns | None:
        """The append times of messages ``first`` through ``last``: the runs fetched last,
        or fetched now for every message received from ``first`` on (one request for a
        stretch of messages).

        A node behind the one streaming (a cluster, after a failover) may not have the
        messages yet: it is asked again a few times. None: a topic deleted meanwhile, or a
        broker without times (times of messages that retention took since are None too)."""
        runs = self._runs
        for attempt in range(TIMES_ATTEMPTS):
            if runs is not None and runs.covers(last):
                return runs
            if runs is not None and last < runs.index:
                return None  # retention took them since: their times too
            if attempt:
                await asyncio.sleep(TIMES_RETRY_DELAY * attempt)
            try:
                runs = self._runs = await self.client.times(self.topic, first,
                                                            max(self._received, last) + 1)
            except (NotFoundError, TopicTruncatedError):
                return None  # gone, or a broker from before times
        return None

    async def _with_times(self, batch: FrameBatch) -> FrameBatch:
        """``batch`` with its messages' times, when this Conn was made with ``times``."""
        if not self.times:
            return batch
        return TimedBatch(batch.buffer, batch.count, batch.first, batch.last, batch.offsets,
                          batch.topic, await self._runs_through(batch.first, batch.last))

    async def batches(self) -> AsyncIterator[FrameBatch]:
        """Messages in batches over one buffer each (no Python object per message); with
        ``times``, each a :class:`~messaging.client.times.TimedBatch` (one request for the
        times of a stretch of messages, as message by message)."""
        batch = self._current_batch
        if batch is not None:
            handed = self._current[:self._position]
            left = batch.count - (self._made - len(self._current) + len(handed))
            used = self._slice_at + sum(HEADER_SIZE + len(m.data) for m in handed)
            self._current, self._position, self._slices = [], 0, iter(())
            if left:
                # Hand over the rest of the current buffer as it came: the publisher's CRCs
                # intact (indexes need not be consecutive: the first is read from its frame).
                rest = batch.buffer[used:]
                self.index = batch.last
                yield await self._with_times(FrameBatch(
                    rest, left, HEADER.unpack_from(rest, 0)[0], batch.last, topic=self.topic))
        while True:
            try:
                batch = await self._next_batch()
            except StopAsyncIteration:
                return
            self.index = batch.last
            yield await self._with_times(batch)

    async def _next_batch(self) -> FrameBatch:
        if self._state == "new":
            raise ConnStateError("open() the Conn before iterating it")
        if self._state == "closed":
            raise ConnClosedError("this Conn is closed")
        item = await self._queue.get()
        if isinstance(item, _End):
            if self._state != "closed":
                self._queue.put_nowait(item)  # a finished read: later calls end too
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    async def _read_loop(self) -> None:
        try:
            await self._read_until_done()
        except Exception as err:  # a bug: let the iteration raise it rather than hang
            log.exception("topic %d: the reader failed", self.topic)
            await self._queue.put(err)

    async def _read_until_done(self) -> None:
        """Read, resume and retry until the end, a definitive error, or cancellation."""
        loop = asyncio.get_running_loop()
        retry = Retry(self.client.retry_policy)
        error: MessagingError | None
        while True:
            before = self._received
            self._answered = False
            try:
                finished = await self._read_once()
            except TopicTruncatedError as err:
                if not self._from_first or err.first_index - 1 <= self._received:
                    await self._queue.put(err)
                    return
                # Opened at 0 ("from the first kept"): start where retention left off.
                log.info("topic %d: starting at the first kept index %d", self.topic,
                         err.first_index)
                self._received = err.first_index - 1
                continue
            except ConnectionFailedError as err:
                finished, error, refused = False, err, err.refused
            except MessagingError as err:  # a broken frame or a 503 may pass; others won't
                if not isinstance(err, CorruptFrameError) and err.status != 503:
                    await self._queue.put(err)
                    return
                finished, error, refused = False, err, False
            else:
                error, refused = None, False
            if finished:
                await self._queue.put(_End())
                return
            if self._received > before:  # it was making progress: reconnect at once
                retry.progressed()
            if self._answered:
                retry.succeeded()
            if error is not None:
                if not self._waiting:
                    self._waiting = True
                    if self.on_wait is not None:
                        self.on_wait(error)
                log.info("topic %d: read failed after index %d (%s); retrying", self.topic,
                         self._received, error)
                if not retry.failed(loop.time(), refused_everywhere=refused,
                                    reached=self.client.reached):
                    await self._queue.put(error)
                    return
            self.reconnects += 1
            await asyncio.sleep(retry.delay(loop.time(), jitter=0.5 + random.random()))

    async def _read_once(self) -> bool:
        """One GET; returns whether it reached the end of a non-streaming read."""
        params = {"topicID": str(self.topic), "index": str(self._received + 1),
                  "streaming": "true" if self.streaming else "false"}
        if self._by_consumer and self.consumer is not None:
            del params["index"]
            params["consumer"] = self.consumer
        elif self._since is not None:
            del params["index"]
            params["since"] = str(self._since)
        async with self.client.stream(_MESSAGES_PATH, params, FRAMES_CONTENT_TYPE) as chunks:
            self._answered = True
            if self._waiting:
                self._waiting = False
                if self.on_resume is not None:
                    self.on_resume()
            decoder = BatchDecoder(after=self._received)
            async for data in chunks:
                for batch in decoder.feed(data):
                    self._received = batch.last
                    self._from_first = self._by_consumer = False
                    self._since = None
                    await self._queue.put(replace(batch, topic=self.topic))
            decoder.finish()
        return not self.streaming

    async def _heartbeat_loop(self) -> None:
        """Heartbeat at once (so retention keeps everything from the starting point on), then
        every ``heartbeat_interval``."""
        assert self.data_url is not None
        while True:
            try:
                await self.client.heartbeat(self.topic, self.index, self.data_url)
            except MessagingError as err:
                log.info("topic %d: heartbeat failed: %s", self.topic, err)
            await asyncio.sleep(self.heartbeat_interval)
