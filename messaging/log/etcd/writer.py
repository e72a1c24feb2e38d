"""The write side of EtcdLog: log entries, group commit into puts, and the quorum gate.

Concurrent commands become one *log entry* (the value of one put of the log key): a header
naming the writing process and its batch number, then each command with its length. Up to
MAX_PUTS_IN_FLIGHT puts run at once; while all are busy, new commands pile up into the next,
larger group. A put goes out only if etcd was seen with quorum within the last second
(otherwise a quick linearizable read decides, and a failure is a 503 at once); a put that may
have left and failed is a 504, never resent. The waiters of a put are answered by the apply
side (:meth:`LogWriter.answer`) once this node has applied the put's revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from messaging.broker.commands import ApplyResult
from messaging.clock import now_ms
from messaging.errors import (
    BrokerClosedError,
    ClusterNoSpaceError,
    ClusterUnavailableError,
    CommitUnknownError,
    MessageTooLargeError,
    MessagingError,
)
from messaging.log.base import answer_callers
from messaging.log.etcd.budget import Budget
from messaging.log.etcd.client import EtcdClient, describe
from messaging.log.etcd.entry import (
    COMPRESS_FROM,
    compressed,
    encode_entry,
    encode_pointer_entry,
)
from messaging.log.etcd.entry_format import BASE_VERSION
from messaging.log.etcd.pointer import Pointer
from messaging.log.etcd.quorum_reads import QuorumReads
from messaging.log.etcd.startup import Startup
from messaging.quiet_log import RECURRING_LOG_INTERVAL, QuietLog

log = logging.getLogger(__name__)

#: A put carries commands up to about this many bytes (etcd refuses requests over 1.5 MiB).
MAX_PUT_BYTES = 1 << 20
#: The largest single command: it goes alone in a put, still under etcd's default limit.
MAX_COMMAND_BYTES = 1_400_000
#: Puts may be in flight together: enough that puts stuck at a dead etcd leader do not stop
#: new ones reaching the next one.
MAX_PUTS_IN_FLIGHT = 8
#: Pending commands of at least this many bytes go in a put of their own even while another
#: put is on its way to etcd.
COALESCE_BYTES = 256 << 10
#: A put on its way for longer than this many times the recent round trip is slow: the next
#: one does not wait for it ...
PUT_SLOW_FACTOR = 3.0
#: ... within these bounds (s).
PUT_SLOW_MIN = 0.005
PUT_SLOW_MAX = 0.25
#: Weight of the newest round trip in the moving average.
PUT_TIME_WEIGHT = 0.2
#: After its put committed, how long a publisher waits for this node to apply it.
APPLY_TIMEOUT = 30.0
#: A quorum proof (a successful read or put) younger than this lets a put go unchecked.
QUORUM_FRESH = 1.0
#: After a failed quorum check, puts fail at once with its error for this long.
QUORUM_FAILED_HOLD = 0.5
#: The quorum error of a writer that has not checked yet.
NOT_CHECKED = "not checked yet"

#: Entries up to this many bytes of commands are encoded (and compressed) on the event loop.
ENCODE_ON_LOOP = 128 << 10
#: After an entry that did not compress, only every this many-th entry tries again.
COMPRESS_RETRY = 16


class ApplyTiming(NamedTuple):
    """When (time.monotonic) the apply side received a put's revision, and began and finished
    applying the batch of revisions it went in."""

    received: float
    started: float
    finished: float


@dataclass(slots=True)
class _Batch:
    """The waiters of one put, answered when this node applies its revision."""

    futures: list[asyncio.Future[ApplyResult]]
    submitted: list[float]  # when each command reached the writer (time.monotonic)
    commands: list[bytes]
    done: asyncio.Event = field(default_factory=asyncio.Event)
    revision: int = 0  # the put's revision, once etcd has answered it
    sent: float = 0.0  # when the put left
    put_done: float = 0.0  # when etcd answered it
    applied: tuple[ApplyTiming, float] | None = None  # apply timing; when it was answered


class _Pending(NamedTuple):
    """A command waiting for its put."""

    command: bytes
    future: asyncio.Future[ApplyResult]
    submitted: float


class LogWriter:
    """Group commit of commands into puts of the log key, behind a quorum gate."""

    def __init__(self, client: EtcdClient, log_key: bytes, node_id: bytes,
                 on_quorum_read: Callable[[Any], None],
                 settled: Callable[[bytes], ApplyResult | None] = lambda _command: None,
                 *, startup: Startup | None = None) -> None:
        """``settled``: what an already applied command did, when the state shows it (for
        the publishes a snapshot install covers; see :meth:`snapshot_installed`);
        ``startup``: the log's start, while which failures are logged at INFO."""
        self.client = client
        self.startup = startup or Startup(log, grace=0.0)
        self._settled = settled
        self.log_key = log_key
        self.node_id = node_id
        #: The entry format puts are written in: the cluster's active one (the membership
        #: keeps it current), the previous release's until it is known.
        self.entry_version = BASE_VERSION
        #: The time an entry formed now gets (ms since the epoch): the node's clock, held
        #: within the cluster's bound (see messaging.log.etcd.clock_check).
        self.clock: Callable[[], int] = now_ms
        self._on_quorum_read = on_quorum_read
        #: The node's gathered quorum reads of this etcd cluster (None: read alone).
        self.quorum_reads: QuorumReads | None = None
        self._pending: list[_Pending] = []
        self._pending_bytes = 0  # of the commands in _pending
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(MAX_PUTS_IN_FLIGHT)
        self._batches: dict[int, _Batch] = {}
        self._puts: set[asyncio.Task[None]] = set()
        self._seq = 0
        self.groups = 0
        self._quorum_lock = asyncio.Lock()
        self._quorum_at = float("-inf")
        self._quorum_failed_at = float("-inf")
        self.quorum_error: str | None = NOT_CHECKED
        self.alarm: str | None = None
        self._installed = 0  # revisions through here were applied by a snapshot install
        # Set when the node stopped applying: what was not sent yet is refused with it.
        self._stopped: MessagingError | None = None
        # Puts on their way to etcd (sent, not answered yet): batch seq -> when sent; and a
        # moving average of how long etcd takes to answer one.
        self._sending: dict[int, float] = {}
        self._put_time = PUT_SLOW_MIN / PUT_SLOW_FACTOR
        self._compress_misses = 0  # entries since compression last did not pay (0: it did)
        self._quiet = QuietLog(log, RECURRING_LOG_INTERVAL)
        self.budget = Budget()

    def submit(self, command: bytes) -> asyncio.Future[ApplyResult]:
        """Queue ``command``; the future gets this node's result once it is applied."""
        if len(command) > MAX_COMMAND_BYTES:
            raise MessageTooLargeError(
                f"in cluster mode a publish is limited to {MAX_COMMAND_BYTES} bytes of frames "
                f"per request (etcd's default request limit is 1.5 MiB); this one has "
                f"{len(command)}: split it into smaller batches")
        future: asyncio.Future[ApplyResult] = asyncio.get_running_loop().create_future()
        if self._stopped is not None:
            future.set_exception(self._stopped)
            return future
        self._pending.append(_Pending(command, future, time.monotonic()))
        self._pending_bytes += len(command)
        self._wakeup.set()
        return future

    def answer(self, node: bytes, seq: int, results: Sequence[ApplyResult | MessagingError],
               timing: ApplyTiming) -> None:
        """The apply side applied batch ``seq`` of ``node``: answer it if it is one of ours,
        and record where its publishes' time went (:mod:`messaging.log.etcd.budget`)."""
        if node != self.node_id:
            return
        batch = self._batches.pop(seq, None)
        if batch is None:
            return  # its publishers were already told the outcome is unknown
        answer_callers(batch.futures, results)
        batch.done.set()
        batch.applied = (timing, time.monotonic())
        if batch.put_done:
            self._record(batch)
        # else the watch beat etcd's answer to the put: recorded once that answer comes

    def _record(self, batch: _Batch) -> None:
        """Add a batch's publishes to the budget (once both its put and its apply are done)."""
        assert batch.applied is not None
        timing, answered = batch.applied
        received = max(timing.received, batch.put_done)
        for submitted in batch.submitted:
            self.budget.record(queued=batch.sent - submitted,
                               put=batch.put_done - batch.sent,
                               watch=received - batch.put_done,
                               apply_wait=timing.started - received,
                               apply=timing.finished - max(timing.started, received),
                               answer=answered - timing.finished)

    def snapshot_installed(self, revision: int) -> None:
        """A peer's snapshot through ``revision`` replaced this node's data: the puts it covers
        were applied by the install, not one by one. Their publishers are answered at once,
        and their put slots freed instead of waiting out APPLY_TIMEOUT: an idempotent publish
        whose producer state shows it gets the duplicate answer with its indexes; any other
        a 504, which an idempotent client resolves by retrying."""
        self._installed = max(self._installed, revision)
        for batch in list(self._batches.values()):
            if 0 < batch.revision <= revision:
                self._answer_installed(batch)

    def _answer_installed(self, batch: _Batch) -> None:
        unknown = _installed_over(batch.revision, self._installed)
        for future, command in zip(batch.futures, batch.commands, strict=True):
            if future.done():
                continue
            result = self._settled(command)
            if result is not None:
                future.set_result(result)
            else:
                future.set_exception(unknown)
        batch.done.set()

    def fail_waiting(self, unknown: MessagingError, refused: MessagingError) -> None:
        """The node stopped applying: publishes whose puts were sent hear ``unknown``, those
        not sent yet ``refused``, also those taken for a put whose task has not started
        and those submitted from now on (no put goes out any more)."""
        self._stopped = refused
        for batch in list(self._batches.values()):
            _fail(batch, unknown)
        self._refuse_pending(refused)

    @property
    def quorum_lost(self) -> bool:
        """Whether the last quorum check failed (none has succeeded since)."""
        return self.quorum_error not in (None, NOT_CHECKED)

    @property
    def quorum(self) -> bool:
        """Whether etcd was seen with quorum lately."""
        return self.quorum_error is None and time.monotonic() - self._quorum_at < 3 * QUORUM_FRESH

    def waiting(self) -> int:
        """Publishes not answered yet: queued, or in a put whose outcome is not known here.
        A put that was failed (node stopped, installed over) no longer counts, even while its
        request to etcd is still on its way."""
        unanswered = sum(not future.done() for batch in self._batches.values()
                         for future in batch.futures)
        return len(self._pending) + unanswered

    def diagnostics(self) -> dict[str, Any]:
        """Write-path figures."""
        return {"quorum": self.quorum, "quorum_error": self.quorum_error, "alarm": self.alarm,
                "puts_in_flight": len(self._puts), "pending": len(self._pending),
                "waiting": self.waiting(),
                "groups": self.groups}

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self) -> None:
        """Group pending commands into puts until cancelled.

        Puts coalesce by themselves: a put goes out when no put is on its way to etcd, when
        what is pending is worth a put of its own (COALESCE_BYTES), or when the puts on their
        way have been out longer than puts take (:meth:`_put_slow`: a put stuck at a dead
        etcd leader never holds back the next). Otherwise commands wait for the put on its
        way and go in one put after it, so a node answering a thousand single publishes a
        second makes a few hundred puts, not a thousand.
        """
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                wait = self._hold_for()
                if wait is not None:
                    # A put is on its way: wake when one comes back, when enough piles up,
                    # or when it turns slow.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), wait)
                    self._wakeup.clear()
                    continue
                await self._slots.acquire()
                group = self._take_group()
                if not group:
                    self._slots.release()
                    break
                task = asyncio.create_task(self._put_group(group), name="messaging-etcd-put")
                self._puts.add(task)
                task.add_done_callback(self._put_finished)
                task.add_done_callback(_unsent([item.future for item in group]))

    def _hold_for(self) -> float | None:
        """None to send a put now; else how long pending commands may wait for the puts on
        their way to etcd before one more goes out."""
        if not self._sending:
            return None
        if self._pending_bytes >= COALESCE_BYTES:
            return None
        newest = max(self._sending.values())
        left = newest + self._put_slow() - time.monotonic()
        return left if left > 0 else None

    def _put_slow(self) -> float:
        """How long a put may be out before it counts as slow: a few times the recent round
        trip, within PUT_SLOW_MIN..PUT_SLOW_MAX."""
        return min(max(PUT_SLOW_FACTOR * self._put_time, PUT_SLOW_MIN), PUT_SLOW_MAX)

    async def drain(self, timeout: float) -> None:
        """Refuse what was not sent yet; give the puts in flight ``timeout`` s to be applied."""
        self._refuse_pending(BrokerClosedError("the broker is shutting down"))
        if self._puts:
            await asyncio.wait(list(self._puts), timeout=timeout)

    async def cancel_puts(self) -> None:
        """Cancel the puts still in flight (their publishers hear the outcome is unknown)."""
        for put in list(self._puts):
            put.cancel()
        if self._puts:
            await asyncio.wait(list(self._puts))

    # -- internals --------------------------------------------------------------------------

    def _refuse_pending(self, error: MessagingError) -> None:
        """Answer every command not sent yet with ``error``."""
        pending, self._pending = self._pending, []
        self._pending_bytes = 0
        for item in pending:
            if not item.future.done():
                item.future.set_exception(error)

    def _put_finished(self, task: asyncio.Task[None]) -> None:
        self._puts.discard(task)
        self._slots.release()

    def _take_group(self) -> list[_Pending]:
        group: list[_Pending] = []
        size = 0
        taken = 0
        for item in self._pending:
            if group and size + len(item.command) > MAX_PUT_BYTES:
                break
            taken += 1
            self._pending_bytes -= len(item.command)
            if item.future.done():  # its publisher went away before it was sent
                continue
            group.append(item)
            size += len(item.command)
        del self._pending[:taken]
        return group

    def submit_pointer(self, pointer: Pointer, commands: Sequence[bytes],
                       ticket: bytes) -> list[asyncio.Future[ApplyResult]]:
        """Commit a pointer entry for ``commands``, which an intake object holds where
        ``pointer`` says, in a put of its own, only while the object's ``ticket`` key is
        unchanged (see :mod:`messaging.log.etcd.intake`); each future gets its command's
        result once this node has applied it, as :meth:`submit`'s."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[ApplyResult]] = [loop.create_future() for _ in commands]
        now = time.monotonic()
        batch = _Batch(futures, [now] * len(futures), list(commands))
        if self._stopped is not None:
            _fail(batch, self._stopped)
            return futures

        async def encode(seq: int) -> bytes:
            return encode_pointer_entry(self.node_id, seq, pointer, time_ms=self.clock())

        async def send(value: bytes) -> int:
            revision = await self.client.put_when(self.log_key, value, unchanged=ticket)
            if revision is None:
                raise TicketClosedError(
                    f"intake object {pointer.name} was given up before its pointer could be "
                    f"committed (older than the sweep's grace): nothing was written; retry")
            return revision

        async def put() -> None:
            async with self._slots:
                await self._put(batch, encode, send)

        task = asyncio.create_task(put(), name="messaging-etcd-pointer-put")
        self._puts.add(task)
        task.add_done_callback(self._puts.discard)
        task.add_done_callback(_unsent(futures))
        return futures

    async def _put_group(self, group: list[_Pending]) -> None:
        batch = _Batch([item.future for item in group], [item.submitted for item in group],
                       [item.command for item in group])

        async def encode(seq: int) -> bytes:
            return await self.encode_value(seq, batch.commands)

        async def send(value: bytes) -> int:
            return await self.client.put(self.log_key, value)

        await self._put(batch, encode, send)

    async def _put(self, batch: _Batch, encode: Callable[[int], Awaitable[bytes]],
                   send: Callable[[bytes], Awaitable[int]]) -> None:
        """Encode and send one put of ``batch``'s commands, then wait for this node to apply
        its revision (which answers them), or fail them."""
        self._seq += 1
        seq = self._seq
        if self._stopped is not None:  # taken before the node stopped, never sent
            _fail(batch, self._stopped)
            return
        self._batches[seq] = batch
        commands = batch.commands
        self.groups += 1
        try:
            try:
                # On its way from now (the next commands wait for it), also while it is
                # encoded and the quorum is checked.
                self._sending[seq] = time.monotonic()
                try:
                    value = await encode(seq)
                    await self.ensure_quorum()
                    sent = batch.sent = self._sending[seq] = time.monotonic()
                    revision = await send(value)
                finally:
                    del self._sending[seq]
                    self._wakeup.set()  # what waited for this put may go now
                batch.put_done = time.monotonic()
                took = batch.put_done - sent
                self._put_time += (took - self._put_time) * PUT_TIME_WEIGHT
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("put %d of %s: %d commands, %d bytes (%d sent), revision %d, "
                              "%.3f ms", seq, self.log_key.decode(), len(commands),
                              sum(map(len, commands)), len(value), revision, took * 1000)
                if batch.applied is not None:
                    self._record(batch)
            except MessagingError as err:
                self._put_failed(err)
                _fail(batch, err)
                return
            except Exception as err:  # a bug or an unexpected client error: never hang waiters
                log.exception("put of %d commands failed", len(commands))
                _fail(batch, CommitUnknownError(f"the write may or may not be committed: "
                                                f"{describe(err)}"))
                return
            self._quorum_proved()
            self.alarm = None
            batch.revision = revision
            if revision <= self._installed:  # the install came before etcd's answer
                self._answer_installed(batch)
                return
            try:
                async with asyncio.timeout(APPLY_TIMEOUT):  # no task per put, as wait_for has
                    await batch.done.wait()
            except TimeoutError:
                _fail(batch, CommitUnknownError(
                    f"committed in etcd at revision {revision}, but this node has not applied "
                    f"it within {APPLY_TIMEOUT:.0f}s (see /messaging/diagnostics)"))
        except asyncio.CancelledError:
            _fail(batch, CommitUnknownError("the broker shut down before the write was known "
                                            "to be applied; it may still be committed"))
            raise
        finally:
            self._batches.pop(seq, None)

    async def encode_value(self, seq: int, commands: list[bytes]) -> bytes:
        """The put's value. Compression is tried unless recent entries did not compress
        (random or encrypted payloads): then only every COMPRESS_RETRY-th entry tries."""
        size = sum(map(len, commands))
        attempt = size >= COMPRESS_FROM and self._compress_misses % COMPRESS_RETRY == 0
        version = self.entry_version
        time_ms = self.clock()
        if size <= ENCODE_ON_LOOP:
            value = encode_entry(self.node_id, seq, commands, compress=attempt,
                                 version=version, time_ms=time_ms)
        else:  # compressing a big entry takes a millisecond or more: not on the loop
            value = await asyncio.to_thread(encode_entry, self.node_id, seq, commands,
                                            compress=attempt, version=version,
                                            time_ms=time_ms)
        if attempt and not compressed(value):
            self._compress_misses = 1  # it did not pay: skip the next ones
        elif self._compress_misses and size >= COMPRESS_FROM:
            self._compress_misses = 0 if attempt else self._compress_misses + 1
        return value

    async def ensure_quorum(self) -> None:
        """Raise ClusterUnavailableError unless etcd was recently seen with quorum."""
        if time.monotonic() - self._quorum_at < QUORUM_FRESH:
            return
        async with self._quorum_lock:
            now = time.monotonic()
            if now - self._quorum_at < QUORUM_FRESH:
                return
            if now - self._quorum_failed_at < QUORUM_FAILED_HOLD and self.quorum_error:
                raise ClusterUnavailableError(self.quorum_error)
            await self._check_quorum()

    async def check_quorum(self) -> None:
        """A quick linearizable read now (the monitor's periodic check)."""
        async with self._quorum_lock:
            await self._check_quorum()

    async def _check_quorum(self) -> None:
        try:
            response = await (self.client.check_quorum(self.log_key)
                              if self.quorum_reads is None
                              else self.quorum_reads.read(self.log_key))
        except ClusterUnavailableError as err:
            self.quorum_error = str(err)
            self._quorum_failed_at = time.monotonic()
            self.startup.log(self._quiet, "quorum", logging.WARNING, "%s", err)
            raise
        self._quorum_proved()
        self._on_quorum_read(response)

    def _quorum_proved(self) -> None:
        self._quorum_at = time.monotonic()
        if self.quorum_error is not None and not self.startup.starting:
            log.info("etcd quorum regained")  # while starting, the ready line says it
        self.quorum_error = None

    def _put_failed(self, err: MessagingError) -> None:
        if isinstance(err, ClusterNoSpaceError):
            self.alarm = "NOSPACE"
            self._quiet.log("nospace", logging.ERROR, "%s", err)
        elif isinstance(err, ClusterUnavailableError):
            if self.quorum_error is None:
                log.warning("etcd quorum lost: %s", err)
            self.quorum_error = str(err)
            self._quorum_failed_at = time.monotonic()
            self.startup.log(self._quiet, "unavailable", logging.WARNING, "%s", err)
        else:
            self.startup.log(self._quiet, type(err).__name__, logging.WARNING,
                             "put failed: %s", err)



class TicketClosedError(MessagingError):
    """An intake object's pointer came too late: its ticket was closed by the sweep, so the
    put was refused by etcd and nothing was written (safe to retry)."""

    status = 503

    def headers(self) -> dict[str, str]:
        """Retry at once: the retry goes in a new object."""
        return {"Retry-After": "1"}


def _installed_over(revision: int, installed: int) -> CommitUnknownError:
    return CommitUnknownError(
        f"committed in etcd at revision {revision}, which this node applied by installing a "
        f"peer's snapshot (through revision {installed}) rather than one by one: its outcome "
        "is not known here. An idempotent publish retried with the same producer headers is "
        "answered as a duplicate with its indexes")


def _unsent(futures: list[asyncio.Future[ApplyResult]]) -> Callable[[asyncio.Task[None]], None]:
    """A done callback of a put's task: its commands not answered by then were never sent
    (the task was cancelled before it began, or while it waited for a put slot: once sent, a
    put answers its own, if only that the outcome is unknown)."""
    def done(_task: asyncio.Task[None]) -> None:
        for future in futures:
            if not future.done():
                future.set_exception(BrokerClosedError("the broker is shutting down"))
    return done


def _fail(batch: _Batch, error: MessagingError) -> None:
    for future in batch.futures:
        if not future.done():
            future.set_exception(error)
    batch.done.set()
