"""Primary/backup journals on a topic: a fenced :class:`Writer` and a :class:`Receiver`.

A primary keeps its state machine's changes in a journal (a topic): it commits each change
as an entry before applying it, and now and then a checkpoint of its whole state. Secondaries
follow the journal with a :class:`Receiver`, applying entries (and replacing their state at
checkpoints); one that takes over from a dead primary does so without losing or repeating a
change:

1. it **claims** the journal with a higher writer epoch (:meth:`Writer.claim`). The claim is
   an entry published with producer headers (``Producer-Id: journal/<topic>``, the epoch as
   ``Producer-Epoch``), so from then on the broker refuses (403) every entry of an older
   epoch: a deposed primary that is still running is fenced, and whatever it had committed
   is ordered before the claim;
2. it **catches up** through the claim: :meth:`Receiver.try_fetch_entry` until it raises
   :class:`CaughtUp` with an index at or past the claim's. ``CaughtUp`` is raised exactly
   when the receiver has fetched every entry the broker had committed when it asked (an
   empty read from the receiver's position, with the broker's committed index of that
   moment): no timeout guesses;
3. it commits its own entries as the new primary.

Messages of a journal: type 1 an entry, 2 a checkpoint, 3 a claim; data = the writer's epoch
(u64, big-endian) followed by the entry's bytes (a claim's: the writer's random id, so that a
second writer claiming the same epoch learns it lost). Two writers must still never *choose*
the same epoch on purpose: take it from what the receiver has seen (``receiver.epoch + 1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from messaging.client.client import Client
from messaging.errors import (
    ConnectionFailedError,
    CorruptFrameError,
    FencedError,
    JournalError,
    MessagingError,
    NotFoundError,
    TopicTruncatedError,
)
from messaging.failover import Retry
from messaging.frames import FRAMES_CONTENT_TYPE, BatchDecoder, Message, decode
from messaging.headers import INDEX_HEADER

log = logging.getLogger(__name__)

ENTRY, CHECKPOINT, CLAIM = 1, 2, 3
_EPOCH = struct.Struct(">Q")
#: Messages a receiver asks for per read.
FETCH_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Entry:
    """A committed state change: its index in the journal, the writer's epoch, its bytes."""

    index: int
    epoch: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A primary's whole state as of this point in the journal."""

    index: int
    epoch: int
    state: bytes

    @property
    def next_index(self) -> int:
        """Where a receiver restored from this checkpoint resumes (:meth:`Receiver.set_index`)."""
        return self.index + 1


class CaughtUp(Exception):
    """The receiver has fetched every entry the broker had committed when it asked.

    ``index`` is the journal topic's committed index at that moment (0: no journal yet).
    """

    def __init__(self, index: int) -> None:
        super().__init__(f"caught up with the journal through index {index}")
        self.index = index


def _pack(epoch: int, data: bytes) -> bytes:
    return _EPOCH.pack(epoch) + data


def _unpack(message: Message) -> tuple[int, bytes]:
    if len(message.data) < _EPOCH.size:
        raise CorruptFrameError(f"journal message {message.index} is too short")
    return _EPOCH.unpack_from(message.data)[0], message.data[_EPOCH.size:]


class Writer:
    """The primary's side: fenced entries and checkpoints on ``topic`` at writer ``epoch``.

    Entries are committed one at a time, in order. The first :meth:`commit_entry` claims the
    journal (see :meth:`claim`) if that was not done yet.
    """

    def __init__(self, client: Client, topic: int, epoch: int) -> None:
        self.client = client
        self.topic = topic
        self.epoch = epoch
        self.producer_id = f"journal/{topic}"
        self.writer_id = uuid.uuid4().hex
        self._seq = 0
        self._claimed: int | None = None
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[object] | None = None  # the task in a checkpoint
        self._failure: MessagingError | None = None

    @property
    def claimed(self) -> int | None:
        """The index of this writer's claim, once made."""
        return self._claimed

    async def claim(self) -> int:
        """Claim the journal for this epoch: every older epoch's writer is refused from now
        on. Returns the claim's index: every entry committed before it is below it."""
        async with self._lock:
            return await self._claim()

    async def _claim(self) -> int:
        if self._claimed is None:
            first = await self._publish(CLAIM, self.writer_id.encode(), verify=True)
            self._claimed = first
        return self._claimed

    async def commit_entry(self, data: bytes) -> int:
        """Commit one entry; returns its index. Waits while a checkpoint is in progress.

        :class:`FencedError` when a newer epoch has claimed the journal.
        """
        if self._holder is not None and self._holder is asyncio.current_task():
            raise JournalError("no entry may be committed during a checkpoint: call "
                               "checkpoint() or leave prepared() first")
        async with self._lock:
            await self._claim()
            return await self._publish(ENTRY, data)

    @contextlib.asynccontextmanager
    async def prepared(self) -> AsyncIterator[None]:
        """Prepare a checkpoint: wait for the entry in flight, hold back new ones until the
        block ends. Take the state inside, then :meth:`checkpoint` it::

            async with writer.prepared():
                index = await writer.checkpoint(state_bytes())
        """
        async with self._lock:
            await self._claim()
            self._holder = asyncio.current_task()
            try:
                yield
            finally:
                self._holder = None

    async def checkpoint(self, state: bytes) -> int:
        """Commit a checkpoint of the whole state; returns the index after it (where a
        receiver restored from it resumes). Outside :meth:`prepared` it prepares and exits
        by itself, so ``state`` must then include every entry committed so far."""
        if self._holder is not None and self._holder is asyncio.current_task():
            return await self._publish(CHECKPOINT, state) + 1
        async with self.prepared():
            return await self._publish(CHECKPOINT, state) + 1

    async def _publish(self, kind: int, data: bytes, *, verify: bool = False) -> int:
        if self._failure is not None:
            raise self._failure
        payload = _pack(self.epoch, data)
        try:
            result = await self.client.publish_as(
                self.topic, [payload], (self.producer_id, self.epoch, self._seq), kind)
        except MessagingError as err:
            if err.status == 403:
                self._failure = FencedError(f"journal topic {self.topic}: writer epoch "
                                            f"{self.epoch} was fenced by a newer one ({err})")
                raise self._failure from err
            if 400 <= err.status < 500 and err.status != 409:
                raise  # refused, nothing stored: this seq may be used again
            self._failure = JournalError(f"journal topic {self.topic}: writer epoch "
                                         f"{self.epoch} cannot go on: {err}")
            raise self._failure from err
        if result.duplicate and verify:
            stored = await self.client.read(self.topic, result.last, result.last + 1)
            if not stored or stored[0].data != payload:
                self._failure = FencedError(f"journal topic {self.topic}: another writer "
                                            f"claimed epoch {self.epoch} first")
                raise self._failure
        self._seq += 1
        return result.last


class Receiver:
    """A secondary's side: fetch the journal's entries and checkpoints in order.

    ``index`` is the last journal index fetched; ``epoch`` the newest writer epoch seen.
    """

    def __init__(self, client: Client, topic: int, index: int = 0) -> None:
        self.client = client
        self.topic = topic
        self.index = 0
        self.epoch = 0
        self._buffer: list[Message] = []
        self.set_index(index)

    def set_index(self, index: int) -> None:
        """Fetch from ``index`` (inclusive) on: e.g. a checkpoint's ``next_index`` after
        restoring its state. 0 is the start of the journal."""
        self.index = max(index - 1, 0)
        self._buffer = []

    async def try_fetch_entry(self) -> Entry | Checkpoint:
        """The next entry or checkpoint; :class:`CaughtUp` when the broker had nothing
        after this receiver's position when asked."""
        while True:
            message = self._next_buffered()
            if message is not None:
                return message
            committed = await self._read()
            if not self._buffer:
                raise CaughtUp(committed)

    async def fetch_entry(self) -> Entry | Checkpoint:
        """The next entry or checkpoint, waiting for one to be committed."""
        while True:
            try:
                return await self.try_fetch_entry()
            except CaughtUp:
                await self.wait()

    def _next_buffered(self) -> Entry | Checkpoint | None:
        while self._buffer:
            message = self._buffer.pop(0)
            if message.index <= self.index:
                continue
            self.index = message.index
            epoch, data = _unpack(message)
            if epoch < self.epoch:
                log.warning("journal topic %d: skipping index %d of stale epoch %d", self.topic,
                            message.index, epoch)
                continue
            self.epoch = epoch
            if message.type == ENTRY:
                return Entry(message.index, epoch, data)
            if message.type == CHECKPOINT:
                return Checkpoint(message.index, epoch, data)
            # A claim (or a type this version does not know): only its epoch matters.
        return None

    async def _read(self) -> int:
        """Buffer what the broker has after ``index``; returns its committed index then."""
        start = self.index + 1 if self.index else 0
        params = {"topicID": self.topic, "index": start, "limit": FETCH_LIMIT}
        try:
            try:
                response = await self.client.request("GET", "/messaging/messages",
                                                     params=params)
            except TopicTruncatedError as err:
                if start != 0:
                    raise
                params["index"] = err.first_index
                response = await self.client.request("GET", "/messaging/messages",
                                                     params=params)
        except NotFoundError:
            return 0  # no journal yet
        messages, _used = decode(response.body, after=self.index)
        self._buffer.extend(messages)
        committed = response.headers.get(INDEX_HEADER, "0")
        return int(committed) if committed.isdigit() else 0

    async def wait(self) -> None:
        """Wait (a streaming read, no polling) until the broker has a message after
        ``index``; buffer what arrives first."""
        loop = asyncio.get_running_loop()
        retry = Retry(self.client.retry_policy)
        params = {"topicID": str(self.topic), "index": str(self.index + 1),
                  "streaming": "true"}
        while True:
            try:
                async with self.client.stream("/messaging/messages", params,
                                              FRAMES_CONTENT_TYPE) as chunks:
                    decoder = BatchDecoder(after=self.index)
                    async for data in chunks:
                        for batch in decoder.feed(data):
                            self._buffer.extend(batch.messages())
                        if self._buffer:
                            return
            except ConnectionFailedError as err:
                if not retry.failed(loop.time(), refused_everywhere=err.refused,
                                    reached=self.client.reached):
                    raise
            await asyncio.sleep(retry.delay(loop.time()))
