"""A topic: an ordered set of segment files in one directory, and everything done to them.

A topic lives in its own directory as ``<first index, 20 digits>.seg`` files of frames, each
with its time index ``<first index>.time`` (see :mod:`messaging.topic.times`; segments written
before times existed have none), plus an optional ``tombstone`` (``{"first_index": N}``:
everything below N was deleted by retention).

:class:`Topic` is the face the other rooms use; it composes parts that each own one job:

* :mod:`~messaging.topic.recovery` opens the files (and removes frames the broker's state
  never accepted);
* :class:`~messaging.topic.writer.TopicWriter`, the writer thread's transaction: append,
  write, sync, commit or abort;
* :class:`~messaging.topic.table.SegmentTable`, the one state those threads share: the
  segment list and what is committed, under one short lock;
* :class:`~messaging.topic.read.TopicReads`, every query over committed state (positions,
  counts, times), and :class:`~messaging.topic.reader.TopicReader` reading through it;
* :func:`~messaging.topic.retention.truncate`, retention's deletion of the oldest segments.

Threads: one writer thread appends, writes, syncs and commits; any number of reader threads
read; a retention thread deletes. Each part says which thread owns what it holds: the
writer's transaction is in its ``TopicWriter``, which nothing but the topic holds; readers
read through ``TopicReads`` and the rooms above through
:class:`~messaging.topic.view.TopicView`, neither of which has a writer's method. Readers see
only *committed* frames (see :meth:`Topic.commit`), so a consumer never sees a message that a
crash, or a failed write or fsync, could still take back. Followers wait on the event loop
for a notification the writer sends once per commit, never on a sleep.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable
from pathlib import Path

from messaging.aio import Notifier
from messaging.config import DEFAULT_MAX_SEGMENT_SIZE
from messaging.errors import MessagingError, StorageFailedError
from messaging.topic import retention
from messaging.topic.read import TopicReads, index_before_end
from messaging.topic.reader import TopicReader
from messaging.topic.recovery import recover, remove_frames_after
from messaging.topic.retention import TOMBSTONE
from messaging.topic.segment import Segment
from messaging.topic.stats import DamageLog, TopicStats
from messaging.topic.table import SegmentTable
from messaging.topic.tail import EMPTY_TAIL, Tail
from messaging.topic.writer import TopicWriter

__all__ = ["TOMBSTONE", "Topic", "TopicStats"]

log = logging.getLogger(__name__)


class Topic:
    """One topic: an ordered set of segment files in ``path``.

    Open with :meth:`Topic.open`, which recovers the last segment. Indexes strictly increase
    across the topic; an append of an index not above :attr:`last_index` is skipped as stale, so
    replaying commands after a restart is idempotent.

    Writing is a small transaction driven by one writer thread (see
    :class:`~messaging.topic.writer.TopicWriter`): :meth:`append` stages frames in memory,
    :meth:`write` writes them, :meth:`sync` makes them durable, :meth:`commit` makes them
    visible; :meth:`abort` undoes everything since the last commit. A failed fsync stops the
    topic for writes (see :class:`StorageFailedError`).
    """

    def __init__(self, path: Path, topic_id: int, max_segment_size: int,
                 segments: list[Segment], tombstone: int, stats: TopicStats) -> None:
        self.path = path
        self.id = topic_id
        self.stats = stats
        damage = DamageLog(topic_id, stats)
        self._table = SegmentTable(topic_id, segments, tombstone, damage)
        self._writer = TopicWriter(path, topic_id, max_segment_size, self._table)
        #: Every query over committed state: what readers read through.
        self.reads = TopicReads(self._table, damage)
        #: The newest committed bytes of the active segment, shared by every follower that has
        #: caught up: they read them from memory, without a thread, a lock or a system call.
        #: Replaced (never changed) by the writer thread at each commit.
        self.tail: Tail = EMPTY_TAIL
        self._notifier = Notifier()

    @classmethod
    def open(cls, path: Path, topic_id: int,
             max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE) -> Topic:
        """Open (creating if needed) the topic in ``path`` and recover its last segment.

        No file stays open: the active segment is opened by the first write after this.
        """
        path.mkdir(parents=True, exist_ok=True)
        stats = TopicStats()
        segments, tombstone = recover(path, topic_id, stats)
        return cls(path, topic_id, max_segment_size, segments, tombstone, stats)

    # -- properties -------------------------------------------------------------------------

    @property
    def max_segment_size(self) -> int:
        """Bytes past which the next append starts a new segment."""
        return self._writer.max_segment_size

    @max_segment_size.setter
    def max_segment_size(self, size: int) -> None:
        self._writer.max_segment_size = size

    @property
    def tombstone(self) -> int:
        """The first index retention kept (0: retention never deleted anything)."""
        with self._table.lock:
            return self._table.tombstone

    def hide_through(self, index: int) -> None:
        """The topic was deleted at broker ``index`` and created again: a read from an index
        at or below it answers 410 (:class:`TopicDeletedError`) instead of serving what came
        after as if it followed on. Kept in memory; the broker sets it from its state."""
        self._table.hide_through(index)

    @property
    def first_index(self) -> int:
        """The first index that may still be read: the tombstone, else the first segment's."""
        return self._table.first_index

    @property
    def last_index(self) -> int:
        """The index of the last frame appended (committed or not); 0 if none."""
        with self._table.lock:
            return self._table.latest_index_locked(committed=False)

    @property
    def committed_index(self) -> int:
        """The index of the last frame readers can see; 0 if none (no lock: loop-safe)."""
        return self._table.committed_last

    @property
    def size(self) -> int:
        """Bytes in all segments (committed or not)."""
        with self._table.lock:
            return sum(s.size for s in self._table.segments)

    @property
    def segment_count(self) -> int:
        """How many segment files the topic has."""
        with self._table.lock:
            return len(self._table.segments)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._table.closed

    @property
    def failure(self) -> StorageFailedError | None:
        """Why the topic stopped accepting writes (a failed fsync), or None."""
        return self._writer.failure

    @property
    def holds_file(self) -> bool:
        """Whether the topic keeps a segment file open for writing."""
        return self._writer.holds_file

    def segments(self) -> list[Segment]:
        """A snapshot of the segment list (oldest first)."""
        return self._table.snapshot()

    # -- writing (the writer thread: see TopicWriter) ---------------------------------------

    def check_writable(self) -> None:
        """Raise why the topic cannot take writes (closed, or stopped by a failed fsync)."""
        self._writer.check_writable()

    def append(self, frames: bytes | bytearray | memoryview, offsets: array[int] | None = None,
               first: int = 0, time_ms: int | None = None) -> int:
        """Stage complete frames (indexes already assigned, checksums verified) with their
        append time; returns how many were staged, stale ones skipped. No I/O (see
        :meth:`TopicWriter.append`)."""
        return self._writer.append(frames, offsets, first, time_ms)

    def write(self) -> None:
        """Write what was staged, without fsync (see :meth:`TopicWriter.write`)."""
        self._writer.write()

    @property
    def times_staged(self) -> bool:
        """Whether time records wait to be written (writer thread)."""
        return self._writer.times_staged

    def write_times(self) -> None:
        """Write and fsync the staged time records; the frames they cover are written by
        :meth:`write` after."""
        self._writer.write_times()

    def sync(self) -> None:
        """Write what is staged, then fsync it (see :meth:`TopicWriter.sync`)."""
        self._writer.sync()

    def commit(self, *, notify: bool = True) -> None:
        """Make everything written so far visible to readers and wake followers.

        Writes first if something is still staged (so ``append`` + ``commit`` works alone).
        ``notify=False`` leaves waking the followers to the caller (see :meth:`notify`).
        """
        tail = self._writer.commit()
        if tail is not None:
            self.tail = tail
        if notify:
            self._notifier.notify()

    def notify(self) -> None:
        """Wake the followers waiting for this topic's next commit (any thread)."""
        self._notifier.notify()

    def abort(self) -> None:
        """Undo everything since the last commit (see :meth:`TopicWriter.abort`)."""
        self._writer.abort()

    def release(self) -> bool:
        """Close the segment file kept open for writing, if nothing waits to be synced."""
        return self._writer.release()

    # -- waiting ----------------------------------------------------------------------------

    async def wait_for(self, after_index: int) -> None:
        """Return once a frame with index above ``after_index`` is committed (or on close).

        Runs on the event loop without taking a lock: the writer wakes it once per commit.
        """
        table = self._table
        await self._notifier.wait_until(
            lambda: table.closed or table.committed_last > after_index)

    @property
    def waiting(self) -> int:
        """How many followers wait for this topic's next commit."""
        return self._notifier.waiting

    def listen(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the running loop after every commit (see :class:`Notifier`)."""
        self._notifier.listen(callback)

    def unlisten(self, callback: Callable[[], None]) -> None:
        """Stop running a callback given to :meth:`listen`."""
        self._notifier.unlisten(callback)

    # -- reading (any thread: see TopicReads) -----------------------------------------------

    def reader(self, index: int, end: int | None = None, limit: int | None = None) -> TopicReader:
        """A reader of committed frames from ``index`` (inclusive) to ``end`` (exclusive)."""
        return TopicReader(self, self.reads, index, end, limit)

    def ensure_indexed(self, segment: Segment) -> None:
        """Index a segment recovery did not read (see :meth:`SegmentTable.ensure_indexed`)."""
        self._table.ensure_indexed(segment)

    def index_after(self, after: int, count: int) -> int | None:
        """The index of the ``count``-th committed message at or after ``after`` (the last
        one when fewer exist; None when there is none)."""
        return self.reads.index_after(after, count)

    def count_after(self, after: int) -> int:
        """How many committed messages have an index above ``after`` (of those kept)."""
        return self.reads.count_after(after)

    def index_before_end(self, count: int) -> int | None:
        """The index of the ``count``-th committed message counting back from the last one
        (the first kept when fewer are kept); None when the topic holds none."""
        return index_before_end(self, count)

    @property
    def last_time(self) -> int | None:
        """The append time of the newest committed message that has one (None: none has)."""
        return self.reads.last_time()

    def index_at_time(self, time_ms: int) -> int | None:
        """The index of the first committed message appended at or after ``time_ms`` (of
        those kept); None when there is none yet (see :meth:`TopicReads.index_at_time`)."""
        return self.reads.index_at_time(time_ms)

    def time_of(self, index: int) -> int | None:
        """The append time of the message with ``index`` (None: unknown)."""
        return self.reads.time_of(index)

    def times(self, start: int, stop: int) -> list[tuple[int, int | None]]:
        """(first index, append time) runs of the committed messages ``start`` .. ``stop``
        (time None: unknown)."""
        return self.reads.times(start, stop)

    # -- deleting ---------------------------------------------------------------------------

    def truncate(self, max_size: int, floor_index: int, older_than: int | None = None) -> int:
        """Retention: delete the oldest whole segments past ``max_size`` or appended before
        ``older_than``, never one holding an index above ``floor_index`` nor the active one;
        returns the bytes deleted (see :func:`messaging.topic.retention.truncate`)."""
        return retention.truncate(self._table, self.path, self.stats, max_size, floor_index,
                                  older_than)

    def cut_after(self, index: int) -> int:
        """Remove every frame above ``index`` from the files (at start-up, before any write).

        For frames a crash left behind that the catalog never accepted (they were never
        acknowledged). Closes this topic: open it again afterwards. Returns bytes removed.
        """
        located = self.reads.locate(index + 1) if self.last_index > index else None
        self.close()
        if located is None:
            return 0
        return remove_frames_after(self.path, self.id, self.segments(), located, index)

    # -- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Sync, close the files (each exactly once) and wake every follower."""
        if self._table.closed:
            return
        try:
            if self._writer.failure is None:
                self.write()
                self.sync()
        except MessagingError as err:
            log.error("topic %d: could not sync on close: %s", self.id, err)
        finally:
            self._writer.close_files()
            self._table.close()
            self._notifier.notify()
