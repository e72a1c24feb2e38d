"""Transactional consumers (after Gazette's ``consumer`` package): exactly-once processing.

A :class:`Consumer` reads topics, hands each message to a handler inside a transaction, and
ends the transaction after ``max_messages`` messages or ``max_duration`` seconds (or as soon
as no more messages are ready). At the end it commits, **in one atomic store write**, the
application's state, the read positions and its producer numbers; messages the handler
published (:meth:`Transaction.publish`) are acknowledged by the broker *before* that write.

Why a crash at any point changes nothing:

- Until the store write, nothing of the transaction is in the store: after a crash the
  consumer resumes from the store's positions and processes the same messages again.
- Derived publishes carry producer headers (``Producer-Id`` ``consumer/<name>``, and per
  target topic an epoch and a sequence number kept in the store with the positions), so
  processing the same messages again sends the same ``(id, epoch, seq)`` and the broker
  stores them once. For that the transaction must be the same: before its first publish a
  transaction saves its *read set* (an intent: the positions it started from and the last
  index it read in each topic) beside the store, and after a crash a consumer whose store
  is still at those positions runs exactly that read set again, in index order.
- The handler must therefore be deterministic: the same state and messages give the same
  state changes and publishes. It runs on the store's thread, so it may use the store
  (a SQLite connection) freely, but must not do I/O of its own.

Committed positions are heartbeated to the broker as consumer ``name`` (so retention keeps
what is not committed yet, and ``GET /messaging/consumers`` shows the lag); the store, not
the broker, is the truth the consumer resumes from.

Stores: :class:`JSONFileStore` (the state is one JSON document, replaced atomically) and
:class:`SQLiteStore` (application tables and the checkpoint in one SQLite transaction). A
store belongs to one running consumer at a time (a lock file enforces it on one machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from messaging.aio import wait_finished
from messaging.client.client import Client
from messaging.client.conn import Conn
from messaging.errors import ConsumerError, MessagingError
from messaging.files import lock_exclusive, read_json, write_json_atomic
from messaging.frames import HEADER_SIZE, Message

log = logging.getLogger(__name__)

V = TypeVar("V")
V_co = TypeVar("V_co", covariant=True)
_T = TypeVar("_T")

#: Steps of a transaction reported to a :class:`Consumer`'s ``hook``, in order.
HANDLED, INTENT, PUBLISHED, COMMITTED = "handled", "intent", "published", "committed"
#: Bytes of derived messages per publish request (below a cluster's etcd request limit).
DEFAULT_MAX_PUBLISH_BYTES = 1 << 20


# -- what the store keeps ---------------------------------------------------------------------


@dataclass(slots=True)
class Checkpoint:
    """What a store commits with the application's state.

    ``positions``: topic → the last index processed (0: nothing yet). ``producers``: target
    topic → ``(epoch, next seq)`` of the consumer's idempotent producer there.
    """

    positions: dict[int, int] = field(default_factory=dict)
    producers: dict[int, tuple[int, int]] = field(default_factory=dict)

    def saved(self) -> dict[str, Any]:
        """The JSON form."""
        return {"positions": {str(t): i for t, i in sorted(self.positions.items())},
                "producers": {str(t): list(p) for t, p in sorted(self.producers.items())}}

    @classmethod
    def restore(cls, data: Mapping[str, Any] | None) -> Checkpoint:
        """The checkpoint from :meth:`saved` (None: a new consumer's)."""
        data = data or {}
        try:
            return cls({int(t): int(i) for t, i in data.get("positions", {}).items()},
                       {int(t): (int(p[0]), int(p[1]))
                        for t, p in data.get("producers", {}).items()})
        except (TypeError, ValueError, IndexError, AttributeError) as err:
            raise ConsumerError(f"invalid consumer checkpoint {data!r}") from err

    def copy(self) -> Checkpoint:
        """An independent copy."""
        return Checkpoint(dict(self.positions), dict(self.producers))


@dataclass(frozen=True, slots=True)
class Intent:
    """The read set of a transaction that publishes, saved before its first publish: the
    checkpoint it started from and the last index it read in each topic."""

    base: Checkpoint
    ends: dict[int, int]

    def saved(self) -> dict[str, Any]:
        """The JSON form."""
        return {"base": self.base.saved(), "ends": {str(t): i for t, i in self.ends.items()}}

    @classmethod
    def restore(cls, data: Mapping[str, Any]) -> Intent:
        """The intent from :meth:`saved`."""
        try:
            return cls(Checkpoint.restore(data["base"]),
                       {int(t): int(i) for t, i in data["ends"].items()})
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ConsumerError(f"invalid consumer intent {data!r}") from err


class Store(Protocol[V_co]):
    """Where a consumer commits its state and checkpoint; every method runs on the
    consumer's store thread, one at a time."""

    def open(self) -> Checkpoint:
        """Lock the store for this consumer and load the committed checkpoint."""
        ...

    def begin(self) -> V_co:
        """Start a transaction; returns what the handler changes (``Transaction.state``)."""
        ...

    def commit(self, checkpoint: Checkpoint) -> None:
        """Make the transaction's state changes and ``checkpoint`` durable, atomically."""
        ...

    def abort(self) -> None:
        """Drop the transaction's state changes."""
        ...

    def save_intent(self, intent: Intent) -> None:
        """Save a transaction's read set durably (before its first publish)."""
        ...

    def load_intent(self) -> Intent | None:
        """The last intent saved, if any."""
        ...

    def close(self) -> None:
        """Drop an open transaction, release the lock."""
        ...


class _StoreFiles:
    """The lock file and the intent file beside a store's own file."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._intent_path = self.path.with_name(self.path.name + ".intent")
        self._lock_fd: int | None = None

    def _lock(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = lock_exclusive(self._lock_path)
        if fd is None:
            raise ConsumerError(f"consumer store {self.path} is in use by another consumer")
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def save_intent(self, intent: Intent) -> None:
        """Replace the intent file atomically and durably."""
        write_json_atomic(self._intent_path, intent.saved())

    def load_intent(self) -> Intent | None:
        """The intent file's content, or None."""
        try:
            return Intent.restore(read_json(self._intent_path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise ConsumerError(f"consumer intent {self._intent_path} is unreadable: "
                                f"{err}") from err


class JSONFileStore(_StoreFiles):
    """The application state as one JSON document, committed with the checkpoint by an
    atomic replace of one file (temporary file, fsync, rename, fsync of the directory).

    The handler changes ``txn.state`` (a deep copy of the committed state) in place.
    """

    def __init__(self, path: Path | str, initial: Any = None) -> None:
        super().__init__(path)
        self.initial = {} if initial is None else initial
        #: The committed state (after :meth:`open`, and after each commit).
        self.state: Any = copy.deepcopy(self.initial)
        self._view: Any = None

    def open(self) -> Checkpoint:
        """Lock, then load the file (a new store starts from ``initial``)."""
        self._lock()
        try:
            saved = read_json(self.path)
        except FileNotFoundError:
            return Checkpoint()
        except (OSError, ValueError) as err:
            self._unlock()
            raise ConsumerError(f"consumer store {self.path} is unreadable: {err}") from err
        self.state = saved.get("state")
        return Checkpoint.restore(saved.get("checkpoint"))

    def begin(self) -> Any:
        """A copy of the committed state for the handler to change."""
        self._view = copy.deepcopy(self.state)
        return self._view

    def commit(self, checkpoint: Checkpoint) -> None:
        """Replace the file with the changed state and ``checkpoint``."""
        write_json_atomic(self.path, {"format": 1, "state": self._view,
                                      "checkpoint": checkpoint.saved()})
        self.state, self._view = self._view, None

    def abort(self) -> None:
        """Forget the changed copy."""
        self._view = None

    def close(self) -> None:
        """Release the lock."""
        self._view = None
        self._unlock()


class SQLiteStore(_StoreFiles):
    """Application tables and the checkpoint in one SQLite database, committed in one SQLite
    transaction (WAL, ``synchronous=FULL``: durable when the commit returns).

    ``schema`` (SQL, run once at open with ``IF NOT EXISTS`` style statements) creates the
    application's tables; the handler gets the connection, inside the open transaction, as
    ``txn.state``.
    """

    def __init__(self, path: Path | str, schema: str = "") -> None:
        super().__init__(path)
        self.schema = schema
        self._db: sqlite3.Connection | None = None

    def open(self) -> Checkpoint:
        """Lock, open the database, create the tables, load the checkpoint."""
        self._lock()
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("CREATE TABLE IF NOT EXISTS messaging_checkpoint "
                       "(id INTEGER PRIMARY KEY CHECK (id = 0), checkpoint TEXT NOT NULL)")
            if self.schema:
                db.executescript(self.schema)
            row = db.execute("SELECT checkpoint FROM messaging_checkpoint").fetchone()
        except sqlite3.Error as err:
            self._unlock()
            raise ConsumerError(f"consumer store {self.path}: {err}") from err
        self._db = db
        try:
            return Checkpoint.restore(json.loads(row[0]) if row else None)
        except ValueError as err:
            raise ConsumerError(f"consumer store {self.path}: invalid checkpoint") from err

    @property
    def db(self) -> sqlite3.Connection:
        """The open connection."""
        if self._db is None:
            raise ConsumerError(f"consumer store {self.path} is not open")
        return self._db

    def begin(self) -> sqlite3.Connection:
        """``BEGIN IMMEDIATE``; the handler writes through the returned connection."""
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def commit(self, checkpoint: Checkpoint) -> None:
        """Write the checkpoint and ``COMMIT`` (with the handler's changes)."""
        self.db.execute("INSERT OR REPLACE INTO messaging_checkpoint VALUES (0, ?)",
                        (json.dumps(checkpoint.saved()),))
        self.db.execute("COMMIT")

    def abort(self) -> None:
        """``ROLLBACK`` the handler's changes."""
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    def close(self) -> None:
        """Roll back an open transaction, close, release the lock."""
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
            self._db.close()
            self._db = None
        self._unlock()


# -- transactions -----------------------------------------------------------------------------


class Transaction(Generic[V]):
    """What a handler gets with each message: the store's ``state`` and :meth:`publish`."""

    def __init__(self, state: V) -> None:
        #: The store's view: a JSON document (JSONFileStore) or a sqlite3 connection.
        self.state = state
        self.publishes: list[tuple[int, int, bytes]] = []  # (topic, type, data)

    def publish(self, topic: int, data: bytes, type: int = 1) -> None:
        """Publish ``data`` to ``topic`` when the transaction commits (exactly once)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"publish data must be bytes, not {data.__class__.__name__}")
        self.publishes.append((topic, type, bytes(data)))


Handler = Callable[[Transaction[V], Message], None]
Hook = Callable[[str, int], None]


class _Stop:
    """Put in the message queue to end a waiting transaction."""


class Consumer(Generic[V]):
    """Reads ``topics``, runs ``handler`` in transactions, commits to ``store`` exactly once.

    ``await consumer.run()`` until :meth:`stop` (or ``run(until={topic: index})`` until every
    listed topic is committed through that index). ``hook(step, transaction)`` is called at
    each step of a transaction (:data:`HANDLED`, :data:`INTENT`, :data:`PUBLISHED`,
    :data:`COMMITTED`), for tests and metrics.
    """

    def __init__(self, client: Client, topics: Iterable[int], store: Store[V],
                 handler: Handler[V], *, name: str, max_messages: int = 1000,
                 max_duration: float = 1.0, heartbeat_interval: float = 5.0,
                 max_publish_bytes: int = DEFAULT_MAX_PUBLISH_BYTES,
                 hook: Hook | None = None) -> None:
        if not name:
            raise ValueError("a consumer needs a name")
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        self.client = client
        self.topics = sorted(set(topics))
        if not self.topics:
            raise ValueError("a consumer needs at least one topic")
        self.store = store
        self.handler = handler
        self.name = name
        self.producer_id = f"consumer/{name}"
        self.max_messages = max_messages
        self.max_duration = max_duration
        self.heartbeat_interval = heartbeat_interval
        self.max_publish_bytes = max_publish_bytes
        self.hook = hook
        #: What the store has committed (after ``run`` has opened it).
        self.committed = Checkpoint()
        #: Transactions committed by this consumer object.
        self.transactions = 0
        self._queue: asyncio.Queue[Message | BaseException | _Stop] = asyncio.Queue(
            max(2 * max_messages, 64))
        self._stopping = False
        self._thread: ThreadPoolExecutor | None = None

    def stop(self) -> None:
        """End :meth:`run` after the transaction in progress."""
        self._stopping = True
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(_Stop())

    async def run(self, *, until: Mapping[int, int] | None = None) -> None:
        """Recover, then consume until :meth:`stop`, ``until`` is reached, or an error."""
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"messaging-consumer-{self.name}")
        conns: list[Conn] = []
        tasks: list[asyncio.Task[None]] = []
        try:
            self.committed = await self._on_thread(self.store.open)
            try:
                await self._recover()
                await self._heartbeat(self.topics)
                for topic in self.topics:
                    position = self.committed.positions.get(topic, 0)
                    conn = self.client.conn(topic)
                    await conn.open(position + 1 if position else 0, streaming=True)
                    conns.append(conn)
                    tasks.append(asyncio.create_task(self._feed(conn),
                                                     name=f"messaging-consumer-feed-{topic}"))
                if self.heartbeat_interval > 0:
                    tasks.append(asyncio.create_task(self._heartbeat_loop(),
                                                     name="messaging-consumer-heartbeat"))
                while not self._stopping and not self._reached(until):
                    messages = await self._collect()
                    if messages:
                        await self._transaction(messages)
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    await wait_finished(task)  # the caller's own cancellation goes on
                for conn in conns:
                    await conn.close()
                await self._on_thread(self.store.close)
        finally:
            thread, self._thread = self._thread, None
            await asyncio.get_running_loop().run_in_executor(None, thread.shutdown)

    def _reached(self, until: Mapping[int, int] | None) -> bool:
        return until is not None and all(self.committed.positions.get(t, 0) >= i
                                          for t, i in until.items())

    async def _on_thread(self, call: Callable[..., _T], *args: Any) -> _T:
        assert self._thread is not None
        return await asyncio.get_running_loop().run_in_executor(self._thread, call, *args)

    # -- reading ------------------------------------------------------------------------------

    async def _feed(self, conn: Conn) -> None:
        try:
            async for message in conn:
                await self._queue.put(message)
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # the transaction loop raises it
            await self._queue.put(err)

    async def _collect(self) -> list[Message]:
        """The next transaction's messages: at least one, then what is ready, within the
        size and time bounds."""
        first = await self._queue.get()
        if isinstance(first, _Stop):
            return []
        if isinstance(first, BaseException):
            raise first
        messages = [first]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_duration
        while len(messages) < self.max_messages and loop.time() < deadline:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            if isinstance(item, _Stop):
                self._stopping = True
                break
            if isinstance(item, BaseException):
                self._queue.put_nowait(item)  # raised by the next collect, after this commit
                break
            messages.append(item)
        return messages

    async def _recover(self) -> None:
        """Run again a transaction that saved its read set and may have published."""
        intent = await self._on_thread(self.store.load_intent)
        if intent is None or intent.base != self.committed:
            return  # none, or one that was committed
        log.info("consumer %s: running an interrupted transaction again (%s)", self.name,
                 ", ".join(f"topic {t} through {i}" for t, i in sorted(intent.ends.items())))
        messages: list[Message] = []
        for topic, end in sorted(intent.ends.items()):
            position = intent.base.positions.get(topic, 0)
            messages += await self.client.read(topic, position + 1 if position else 0, end + 1)
        if {m.topic: m.index for m in messages} != {t: i for t, i in intent.ends.items()}:
            raise ConsumerError(f"consumer {self.name}: the messages of an interrupted "
                                "transaction are no longer all readable")
        await self._transaction(messages, replay=True)

    # -- the transaction -----------------------------------------------------------------------

    async def _transaction(self, messages: list[Message], *, replay: bool = False) -> None:
        messages.sort(key=lambda m: m.index)  # one order for every run over the same read set
        number = self.transactions + 1
        base = self.committed.copy()
        ends: dict[int, int] = {}
        for message in messages:
            ends[message.topic] = message.index
        txn = await self._on_thread(self._handle, messages)
        producers = dict(base.producers)
        try:
            self._step(HANDLED, number)
            if txn.publishes:
                if not replay:
                    await self._on_thread(self.store.save_intent, Intent(base, ends))
                self._step(INTENT, number)
                await self._publish(txn.publishes, producers)
                self._step(PUBLISHED, number)
            checkpoint = Checkpoint({**base.positions, **ends}, producers)
            await self._on_thread(self.store.commit, checkpoint)
        except BaseException:
            await self._on_thread(self.store.abort)
            raise
        self.committed = checkpoint
        self.transactions = number
        self._step(COMMITTED, number)
        await self._heartbeat(sorted(ends))

    def _handle(self, messages: Sequence[Message]) -> Transaction[V]:
        """Run the handler over every message in one store transaction (store thread)."""
        txn = Transaction(self.store.begin())
        try:
            for message in messages:
                self.handler(txn, message)
        except BaseException:
            self.store.abort()
            raise
        return txn

    def _step(self, step: str, number: int) -> None:
        if self.hook is not None:
            self.hook(step, number)

    async def _publish(self, publishes: list[tuple[int, int, bytes]],
                       producers: dict[int, tuple[int, int]]) -> None:
        await publish_derived(self.client, self.producer_id, self.name, publishes, producers,
                              self.max_publish_bytes)

    # -- heartbeats ------------------------------------------------------------------------------

    async def _heartbeat(self, topics: Sequence[int]) -> None:
        """Report committed positions to the broker (best effort: the store is the truth)."""
        calls: list[Awaitable[None]] = [
            self.client.heartbeat(t, self.committed.positions.get(t, 0), self.name)
            for t in topics]
        for topic, result in zip(topics, await asyncio.gather(*calls, return_exceptions=True),
                                 strict=False):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                log.info("consumer %s: heartbeat of topic %d failed: %s", self.name, topic,
                         result)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            await self._heartbeat(self.topics)


async def publish_derived(client: Client, producer_id: str, name: str,
                          publishes: list[tuple[int, int, bytes]],
                          producers: dict[int, tuple[int, int]], max_bytes: int) -> None:
    """Send a consumer's derived messages (topic, type, data), per target topic in order,
    and advance ``producers`` (target topic -> (epoch, next seq)).

    Requests are cut the same way whenever the same publishes are sent again
    (:func:`cut_requests`), so each goes out with the same (epoch, seq) as the first time. A
    broker that forgot this producer (unused for 7 days) answers 409 to a sequence above 0:
    the target then starts a new epoch at seq 0.
    """
    for topic in sorted({t for t, _type, _d in publishes}):
        mine = [(type_, data) for t, type_, data in publishes if t == topic]
        epoch, seq = producers.get(topic, (0, 0))
        for type_, datas in cut_requests(mine, max_bytes):
            try:
                await client.publish_as(topic, datas, (producer_id, epoch, seq), type_)
            except MessagingError as err:
                if err.status == 403:
                    raise ConsumerError(f"consumer {name}: its producer on topic {topic} was "
                                        f"fenced by a newer epoch: {err}") from err
                if err.status != 409 or seq == 0:
                    raise
                epoch, seq = epoch + 1, 0
                log.warning("consumer %s: topic %d forgot its producer; starting epoch %d",
                            name, topic, epoch)
                await client.publish_as(topic, datas, (producer_id, epoch, seq), type_)
            seq += 1
        producers[topic] = (epoch, seq)


def cut_requests(publishes: list[tuple[int, bytes]], max_bytes: int,
                 ) -> list[tuple[int, list[bytes]]]:
    """Consecutive messages (type, data) of one type, cut at ``max_bytes`` of frames."""
    requests: list[tuple[int, list[bytes]]] = []
    size = 0
    for type_, data in publishes:
        frame = HEADER_SIZE + len(data)
        if not requests or requests[-1][0] != type_ or (
                size + frame > max_bytes and requests[-1][1]):
            requests.append((type_, []))
            size = 0
        requests[-1][1].append(data)
        size += frame
    return requests
