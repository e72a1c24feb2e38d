"""Applying etcd's command log: revisions in order, in batches, on the writer thread.

The watch (:mod:`messaging.log.etcd.watch`) delivers each revision of the log key to the
applier's inbox (at most QUEUED_REVISIONS unapplied: more hold the watch back). The node's
writer thread takes what has queued up, up to APPLY_BATCH_BYTES, as one batch: each
revision's value is decoded into its commands and all of them go through one
``Broker.write_group``, so every node assigns the same indexes and writes the same segment
files.

A node pays for every wake-up of its writer thread (on a shared machine a thread that slept
runs its first few hundred µs of Python cold: bench/RESULTS.md "Cluster cost"), so a steady
stream of other nodes' revisions is applied at most once per ``linger`` (``--cluster-apply-
linger``): a revision that comes within ``linger`` of the last drain waits for the next one,
with whatever else arrives meanwhile. A revision that holds a put of this node (its
publishers wait), anything delivered after a quiet spell, a full half of the inbox, and anyone
waiting for revisions to apply are drained at once; so only subscribers of this node to
topics published through other nodes wait, at most ``linger``, and only while revisions
stream in.

The loop hears of a batch (one ``call_soon_threadsafe``) only when it has something to do:
wake the followers of the touched topics and then answer the publishers of this node whose
puts made those revisions (:meth:`~messaging.log.etcd.writer.LogWriter.answer`), or wake
whoever waits for revisions to apply. A batch of other nodes' revisions wakes the followers
from the writer thread (the topics' notifiers take any thread) and costs the loop nothing;
the writer posts the next batch itself if revisions arrived meanwhile.

A pointer entry (the intake lane: :mod:`messaging.log.etcd.intake`) is applied as the inline
entry it stands for, once the bytes it names are fetched (:mod:`messaging.log.etcd.
intake_reads`: started when the watch delivers it). A fetch that fails holds this log's apply
before that entry, saying why (:attr:`Applier.held`, in ``/readyz``), and is tried again.

A batch that failed locally as a whole (disk trouble, the broker's index back where it was)
is retried; one that failed in part, or while a topic's fsync has failed, or that holds a
value this node cannot decode (a checksum that does not match, a newer version's entry: never
skipped), stops this node for good (:attr:`Applier.failure`): it refuses publishes until it is
restarted.

The module is over 600 lines because the applier is one state machine shared by the loop and
the writer thread (inbox, drains, lingers, retries, holds and waiters); split, its lock and
its ownership rules would span files.

Ownership: the delivered count, the linger's timer and the time of the last drain it posted,
:attr:`Applier.failure` and :attr:`Applier.error` belong to the loop; the inbox is a deque
the loop appends to and the writer thread takes from; whether a drain is posted, the applied
count and the waiters are shared, behind the applier's lock (taken for a few attribute
operations, never across I/O); :meth:`Applier._drain` runs on the writer thread and shares
besides only :class:`~messaging.log.etcd.progress.Progress` (behind its lock),
:class:`ApplyCost` (behind its own) and the writer-thread-only
:class:`~messaging.log.etcd.checkpoint.Checkpoints`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from messaging.broker.broker import Broker
from messaging.broker.commands import ApplyResult
from messaging.errors import (
    BrokerClosedError,
    CommitUnknownError,
    MessagingError,
    StorageError,
    StorageFailedError,
)
from messaging.log.etcd.checkpoint import Checkpoints
from messaging.log.etcd.entry import (
    LogEntry,
    decode_entry,
    entry_writer,
    is_pointer_entry,
    resolve,
)
from messaging.log.etcd.intake_reads import LogReads
from messaging.log.etcd.progress import Progress
from messaging.log.etcd.writer import ApplyTiming, LogWriter
from messaging.log.local import DeferredSync
from messaging.log.serial import SerialExecutor
from messaging.quiet_log import RECURRING_LOG_INTERVAL, QuietLog

log = logging.getLogger(__name__)

#: A batch of revisions is cut once it holds this many bytes of log values.
APPLY_BATCH_BYTES = 32 << 20
#: Revisions delivered but not yet applied: this many hold the watch back.
QUEUED_REVISIONS = 64
#: Other nodes' revisions wait for the linger only while fewer than this many are queued.
LINGER_REVISIONS = QUEUED_REVISIONS // 2
#: How long a steady stream of other nodes' revisions may wait to be applied together.
DEFAULT_APPLY_LINGER = 0.02
#: A batch that failed as a whole is tried again after this long, doubling up to RETRY_MAX.
RETRY_FIRST = 0.1
RETRY_MAX = 2.0


@dataclass(frozen=True, slots=True)
class Revision:
    """One revision of the log key, as the watch delivered it."""

    revision: int
    value: bytes
    received: float  # when the watch delivered it (time.monotonic)


class _GroupFailed(Exception):
    """Nothing of a batch of revisions was applied (local disk trouble): try it again."""


class _Diverged(Exception):
    """Part of a batch applied and part failed locally: this node can no longer follow."""


class _Unfetchable(Exception):
    """What a pointer entry names could not be fetched now: the revisions before it are
    applied, it and those after it wait and are tried again. ``at``: its place in the
    batch."""

    def __init__(self, message: str, at: int) -> None:
        super().__init__(message)
        self.at = at


class _Unreadable(Exception):
    """A revision's value does not decode (damaged, or from a newer version): this node
    stops before it, since skipping it would make its indexes differ from the others'.
    ``at``: its place in the batch (the revisions before it are applied first)."""

    def __init__(self, message: str, at: int) -> None:
        super().__init__(message)
        self.at = at


@dataclass(slots=True)
class _Applied:
    spans: list[tuple[Revision, bytes, int, int, int]]  # node, seq, first command, count
    results: list[ApplyResult | MessagingError]
    touched: set[int]
    started: float  # time.monotonic, on the writer thread
    finished: float
    cpu: float = 0.0  # seconds of the writer thread's CPU the batch took
    revisions: int = 0
    messages: int = 0


class ApplyCost:
    """The writer thread's CPU per applied revision and per message, over recent batches
    (the writer thread records, the loop reads)."""

    def __init__(self, keep: float = 600.0) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._batches: deque[tuple[float, float, int, int]] = deque()  # at, cpu, revs, msgs
        #: Batches applied since start (tests and diagnostics count drains with it).
        self.batches = 0

    def record(self, cpu: float, revisions: int, messages: int) -> None:
        """One applied batch."""
        now = time.monotonic()
        with self._lock:
            self.batches += 1
            self._batches.append((now, cpu, revisions, messages))
            while self._batches and self._batches[0][0] < now - self._keep:
                self._batches.popleft()

    def report(self, window: float) -> dict[str, float | None]:
        """``apply_cpu_us_per_revision``, ``apply_cpu_us_per_message`` and
        ``revisions_per_apply`` (how many revisions a batch held) over the last ``window``
        seconds (None: nothing applied then)."""
        since = time.monotonic() - window
        cpu = revisions = messages = 0.0
        count = 0
        with self._lock:
            batches = list(self._batches)
        for at, spent, revs, msgs in batches:
            if at >= since:
                count += 1
                cpu += spent
                revisions += revs
                messages += msgs
        return {"apply_cpu_us_per_revision": round(cpu * 1e6 / revisions, 1)
                if revisions else None,
                "apply_cpu_us_per_message": round(cpu * 1e6 / messages, 2)
                if messages else None,
                "revisions_per_apply": round(revisions / count, 2) if count else None}


class Applier:
    """Applies the delivered revisions in order and answers this node's publishers.

    The loop calls :meth:`deliver` and :meth:`drained`; the writer thread (a
    :class:`~messaging.log.serial.SerialExecutor`) does the applying, one batch per job: the
    loop posts a drain when revisions wait and none is under way, the writer takes what has
    queued up (up to APPLY_BATCH_BYTES), applies it, hands the loop what it must do (if
    anything) with one ``call_soon_threadsafe``, and posts the next drain itself while
    revisions wait (behind the other jobs queued meanwhile, such as a group fsync). No
    future and no asyncio queue per revision. Other nodes' revisions that stream in are
    drained at most once per ``linger`` seconds (0: each at once; see the module).
    """

    def __init__(self, broker: Broker, writer: SerialExecutor, writes: LogWriter,
                 progress: Progress, checkpoints: Checkpoints, unsynced: DeferredSync,
                 log_key: bytes, linger: float = DEFAULT_APPLY_LINGER,
                 pointers: LogReads | None = None) -> None:
        self.broker = broker
        self._pointers = pointers
        self._writer = writer
        self._writes = writes
        self._progress = progress
        self._checkpoints = checkpoints
        self._unsynced = unsynced
        self._log_name = log_key.decode()
        # Appended on the loop, taken by the writer thread (deque: both ends are atomic).
        self._inbox: deque[Revision] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._node = writes.node_id  # this node's puts are answered on the loop
        self._lock = threading.Lock()  # _scheduled, _done and _waiters (see the module)
        self._scheduled = False  # a drain is posted or under way
        self._closed = False
        self._delivered = 0  # revisions delivered (the loop's)
        self._done = 0  # of them applied or given up
        self._waiters: list[asyncio.Future[None]] = []  # on the loop, for _done to move
        self._linger = linger
        self._kicked_at = float("-inf")  # loop time of the last drain the loop posted
        self._lingering: asyncio.TimerHandle | None = None  # the drain a linger defers
        self._retry_delay = RETRY_FIRST
        self._retrying: asyncio.TimerHandle | None = None  # the next try of a failed batch
        self._quiet = QuietLog(log, RECURRING_LOG_INTERVAL)
        #: Why the last batch failed while it is being retried (None: it did not).
        self.error: str | None = None
        #: Why applying is held before a pointer entry whose bytes cannot be fetched now
        #: (None: it is not), and that entry's revision (0: none).
        self.held: str | None = None
        self.held_at = 0
        #: What applying costs (diagnostics).
        self.cost = ApplyCost()
        #: Set when this node stopped applying for good: publishes are refused with it.
        self.failure: MessagingError | None = None

    def deliver(self, revision: Revision) -> None:
        """Queue a revision for applying (see :meth:`room`). Synchronous: a revision the watch
        delivered is queued, once, whatever happens to the watch next."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._inbox.append(revision)
        self._delivered += 1
        if self._pointers is not None and is_pointer_entry(revision.value):
            self._prefetch(revision)
        if self._lingers(revision, self._loop.time()):
            if self._lingering is None:
                self._lingering = self._loop.call_at(self._kicked_at + self._linger,
                                                     self._kick)
        else:
            self._kick()

    def _prefetch(self, revision: Revision) -> None:
        """Start fetching what a pointer entry names (a value that does not decode is
        reported when its turn comes)."""
        assert self._pointers is not None
        try:
            pointer = decode_entry(revision.value).pointer
        except ValueError:
            return
        if pointer is not None:
            self._pointers.prefetch(pointer)

    async def drop_held(self) -> int:
        """Give up the revisions waiting to be applied (on the loop: the writer thread drops
        them after the drain under way), counted as done: a peer's snapshot is about to cover
        them (see :meth:`messaging.log.etcd.log.EtcdLog._catch_up_from_peer`). Returns how
        many."""
        loop = asyncio.get_running_loop()
        dropped = await loop.run_in_executor(self._writer, self._drop_inbox)
        self.held, self.held_at, self.error = None, 0, None
        self._retry_delay = RETRY_FIRST
        if self._retrying is not None:  # nothing left to try again: what comes is new
            self._retrying.cancel()
            self._retrying = None
            self._idle()
        self._wake()
        return dropped

    def _drop_inbox(self) -> int:
        """Writer thread: empty the inbox, counting what it held as done."""
        dropped = 0
        while self._inbox:
            self._inbox.popleft()
            dropped += 1
        with self._lock:
            self._done += dropped
        return dropped

    async def room(self) -> None:
        """Wait while QUEUED_REVISIONS delivered revisions are not applied yet (for good once
        this node stopped applying: the watch is held back)."""
        await self._until(self._delivered - QUEUED_REVISIONS + 1)

    def hurry(self) -> None:
        """Apply what waits now, without a linger (someone needs this node caught up)."""
        self._kick()

    def _lingers(self, revision: Revision, now: float) -> bool:
        """Whether ``revision`` may wait for the drain that ends the linger: another node's,
        within ``linger`` of the last drain, with room in the inbox and nobody waiting."""
        if (now - self._kicked_at >= self._linger or len(self._inbox) >= LINGER_REVISIONS
                or entry_writer(revision.value) == self._node):
            return False
        with self._lock:
            return not self._waiters

    async def drained(self) -> None:
        """Wait until every revision delivered so far is applied (without a linger)."""
        self._kick()
        await self._until(self._delivered)

    def close(self) -> None:
        """Post no more drains (the node is closing; one under way finishes); a read waiting
        for a revision is told so at once."""
        self._closed = True
        self._stop_lingering()
        self._wake()

    def _stop_lingering(self) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None

    async def applied_through(self, revision: int) -> None:
        """Wait until this node has applied the log through ``revision`` (without a linger:
        what is delivered meanwhile is applied at once); the caller bounds the wait. Raises
        :attr:`failure` once this node stopped applying, BrokerClosedError once it closes."""
        loop = asyncio.get_running_loop()
        while True:
            if self.failure is not None:
                raise self.failure
            if self._closed:
                raise BrokerClosedError("the broker is shutting down")
            with self._lock:  # the writer counts a batch under it after moving ``applied``
                if self._progress.applied >= revision:
                    return
                waiter = loop.create_future()
                self._waiters.append(waiter)
            self._kick()
            try:
                await waiter
            finally:
                with self._lock:  # a wait given up (a timeout, a client gone) leaves nothing
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)

    @property
    def waiting(self) -> int:
        """How many waits for revisions to apply are registered now."""
        with self._lock:
            return len(self._waiters)

    def wake(self) -> None:
        """Wake whoever waits for revisions to apply, to look again (on the loop): after
        something other than an applied batch moved this node on (a snapshot install)."""
        self._wake()

    async def _until(self, done: int) -> None:
        """Wait until at least ``done`` revisions are applied (or given up) (on the loop)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._done >= done:
                    return
                waiter = loop.create_future()
                self._waiters.append(waiter)
            await waiter

    def _kick(self) -> None:
        """Post a drain unless one is under way (on the loop); it ends any linger (the
        drain under way posts the next one itself while revisions wait)."""
        self._stop_lingering()
        if self._closed or self.failure is not None or not self._inbox:
            return
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        assert self._loop is not None
        self._kicked_at = self._loop.time()
        self._writer.post(self._drain)

    def _drain(self) -> None:
        """Apply what has queued up as one batch and hand the loop what it must do (writer
        thread); then checkpoint when due, after the answers are on their way, and post the
        next drain if revisions wait."""
        batch: list[Revision] = []
        size = 0
        inbox = self._inbox
        while inbox and size < APPLY_BATCH_BYTES:
            item = inbox.popleft()
            batch.append(item)
            size += _weight(item.value)
        if not batch:
            self._next_drain()
            return
        failed = self._unsynced.failed
        if failed is not None:
            # A group fsync of applied data failed: what it covered is not known to be
            # durable here and the checkpoint cannot move past it, so this node stops.
            self._report(self._stop, batch, failed)
            return
        try:
            try:
                applied = self._apply_revisions(batch)
            except (_Unreadable, _Unfetchable) as err:
                if not err.at:
                    raise
                # The revisions before it first; the next drain stops at it.
                inbox.extendleft(reversed(batch[err.at:]))
                batch = batch[:err.at]
                applied = self._apply_revisions(batch)
        except (_GroupFailed, _Unfetchable) as err:
            inbox.extendleft(reversed(batch))  # nothing applied: the same batch again
            self._report(self._retry, batch, err)
            return
        except (_Diverged, _Unreadable) as err:
            self._report(self._stop, batch, err)
            return
        own = self._finish(applied)
        self._checkpoint_if_due()
        if not own:
            self._next_drain()
        # else the loop posts the next drain once it has answered (the writer thread, busy
        # with the next batch, would hold the GIL while the answers wait for it)

    def _finish(self, applied: _Applied) -> bool:
        """Count a batch as applied; answer, notify and wake (writer thread): on the loop
        only what must be done there. Returns whether it holds puts of this node (their
        publishers are answered on the loop)."""
        self.cost.record(applied.cpu, applied.revisions, applied.messages)
        with self._lock:
            self._done += applied.revisions
            wake = bool(self._waiters)
        own = any(node == self._node for _item, node, _seq, _first, _count in applied.spans)
        if not own:
            self.broker.notify(applied.touched)  # nobody here to answer after them
        if own or wake or self.error is not None:
            self._report(self._applied, applied if own else None)
        return own

    def _next_drain(self) -> None:
        """Post the next drain while revisions wait, else let the loop post it (writer
        thread)."""
        with self._lock:
            more = bool(self._inbox) and not self._closed
            if not more:
                self._scheduled = False
        if more:
            self._writer.post(self._drain)

    def _report(self, callback: Callable[..., None], *args: object) -> None:
        """Run ``callback(*args)`` on the loop (writer thread)."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: the process is ending
            self._loop.call_soon_threadsafe(callback, *args)

    def _idle(self) -> None:
        with self._lock:
            self._scheduled = False
        self._kick()

    def _applied(self, applied: _Applied | None) -> None:
        """A batch is applied: answer this node's publishers (``applied``: it holds some of
        their puts), wake the waiters (on the loop)."""
        self.error = self.held = None
        self.held_at = 0
        self._retry_delay = RETRY_FIRST
        if applied is not None:
            self._answer(applied)
        self._wake()
        if applied is not None:  # the writer left the next drain to the loop
            self._idle()

    def _retry(self, batch: list[Revision], err: Exception) -> None:
        """Nothing of a batch applied (local disk trouble): try it again after a back-off,
        unless a topic's fsync failed (on the loop)."""
        if any(t.failure is not None for t in self.broker.topics()):
            # An fsync failed: the topic takes no more writes until a restart re-verifies
            # its files, so retrying cannot succeed.
            self._stop(batch, err)
            return
        self.error = str(err)
        if isinstance(err, _Unfetchable):
            self.held, self.held_at = self.error, batch[0].revision
        self._quiet.log("apply", logging.ERROR, "applying revisions %d..%d failed "
                        "(retrying): %s", batch[0].revision, batch[-1].revision, err)
        assert self._loop is not None
        self._retrying = self._loop.call_later(self._retry_delay, self._idle)
        self._retry_delay = min(self._retry_delay * 2, RETRY_MAX)

    def _wake(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _stop(self, batch: list[Revision], err: Exception) -> None:
        """Stop for good (on the loop): nothing of ``batch`` is visible, publishes are
        refused (503) and the ones waiting are told their outcome is unknown here (504,
        committed in etcd). A restart re-verifies the files and replays from the
        checkpoint, which never covers data that was not fsynced. No drain is posted again,
        and whoever waits for revisions to apply waits on (the watch is held back)."""
        self.failure = StorageFailedError(
            f"this node stopped applying the log at revision {batch[0].revision}: {err}; "
            "restart it (it re-verifies its files and replays from its checkpoint)")
        self.error = str(err)
        self.held, self.held_at = None, 0  # stopped for good: nothing to catch up past
        log.critical("%s", self.failure)
        self._wake()  # a read waiting for a revision hears the failure; the watch waits on
        self._writes.fail_waiting(CommitUnknownError(
            f"committed in etcd, but this node stopped applying the log: {err}; the other "
            "nodes have it"), self.failure)

    def _apply_revisions(self, batch: list[Revision]) -> _Applied:
        """Apply revisions in order as one group (writer thread)."""
        started = time.monotonic()
        cpu = time.thread_time()
        commands: list[bytes] = []
        times: list[int | None] = []
        spans: list[tuple[Revision, bytes, int, int, int]] = []
        for at, item in enumerate(batch):
            try:
                entry = decode_entry(item.value)
            except ValueError as err:
                # Never skipped: a value this node cannot read may hold commands the others
                # apply (a newer version's entry) or be damaged (its checksum), and going
                # past it would give this node other indexes than theirs.
                raise _Unreadable(f"revision {item.revision} of {self._log_name} is not a "
                                  f"log entry this node can read ({err}); nothing of it "
                                  "was skipped or applied", at) from err
            if entry.pointer is not None:
                entry = self._resolve(entry, item, at)
            spans.append((item, entry.node, entry.seq, len(commands), len(entry.commands)))
            commands.extend(entry.commands)
            times.extend([entry.time] * len(entry.commands))
        # Never fsynced here: etcd is the write-ahead log, and the files are fsynced in
        # groups off this path (the deferred sync, and before every checkpoint).
        results = (self.broker.write_group(commands, durable=False, notify=False, times=times)
                   if commands else [])
        local = [r for r in results if isinstance(r, (StorageError, BrokerClosedError))]
        if local:
            if len(local) == len(results) and all(r is local[0] for r in local):
                raise _GroupFailed(str(local[0]))  # nothing was applied: the index is back
            raise _Diverged(str(local[0]))
        touched = {t for r in results if isinstance(r, ApplyResult) for t in r.topics}
        self._unsynced.add(touched)
        self._progress.applied_through(batch[-1].revision)
        self._checkpoints.applied(len(batch), self.broker.index)
        self.broker.metrics.group_commits.inc(len(commands))
        finished = time.monotonic()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("applied revisions %d..%d of %s: %d commands, %d bytes, %.3f ms",
                      batch[0].revision, batch[-1].revision, self._log_name,
                      len(commands), sum(len(item.value) for item in batch),
                      (finished - started) * 1000)
        messages = sum(r.count for r in results if isinstance(r, ApplyResult))
        return _Applied(spans, results, touched, started, finished,
                        time.thread_time() - cpu, len(batch), messages)

    def _resolve(self, entry: LogEntry, item: Revision, at: int) -> LogEntry:
        """A pointer entry with the commands it names (writer thread): waits for their
        fetch; raises _Unfetchable when they cannot be had now, _Unreadable when they are
        not what the pointer says."""
        pointer = entry.pointer
        assert pointer is not None
        if self._pointers is None:  # held, not stopped: a restart with the store goes on
            raise _Unfetchable(f"revision {item.revision} of {self._log_name} names intake "
                               f"object {pointer.name}, which cannot be fetched now: this "
                               "node has no object store; restart it with the cluster's "
                               "--object-store", at)
        try:
            body = self._pointers.fetch(pointer)
        except ValueError as err:  # CorruptEntryError: the store holds other bytes
            raise _Unreadable(f"revision {item.revision} of {self._log_name}: {err}; nothing "
                              "of it was skipped or applied", at) from err
        except Exception as err:  # the store, a name, a closing loop: held, tried again
            raise _Unfetchable(f"revision {item.revision} of {self._log_name} names intake "
                               f"object {pointer.name}, which cannot be fetched now: "
                               f"{describe_error(err)}", at) from err
        try:
            return resolve(entry, body)
        except ValueError as err:
            raise _Unreadable(f"revision {item.revision} of {self._log_name}: {err}; nothing "
                              "of it was skipped or applied", at) from err

    def _checkpoint_if_due(self) -> None:
        """Checkpoint when due (writer thread, queued after the batch it follows)."""
        try:
            self._checkpoints.if_due()
        except Exception:  # a failed checkpoint is written again next time
            self._quiet.log("checkpoint", logging.ERROR, "writing the checkpoint failed",
                            exc_info=True)

    def _answer(self, applied: _Applied) -> None:
        """Wake the followers, then answer this node's publishers (on the loop): the
        fan-out's pass is queued ahead of the publishers' handlers, as on a single node."""
        try:
            self.broker.notify(applied.touched)
        finally:  # whatever waking them meets, the publishers are answered
            for item, node, seq, first, count in applied.spans:
                self._writes.answer(node, seq, applied.results[first:first + count],
                                    ApplyTiming(item.received, applied.started,
                                                applied.finished))


def describe_error(err: BaseException) -> str:
    """What went wrong, for a message: the error's own words (its kind when it has none)."""
    return str(err) or type(err).__name__


def _weight(value: bytes) -> int:
    """How many bytes applying a revision's value takes in: a pointer entry's, those it
    names (fetched and held while its batch is applied)."""
    if not is_pointer_entry(value):
        return len(value)
    try:
        pointer = decode_entry(value).pointer
    except ValueError:
        return len(value)
    return pointer.length if pointer is not None else len(value)
