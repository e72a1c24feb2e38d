"""A topic's segment table: its segments, oldest first, and the bounds of what may be read.

This is the one state of a topic that several threads share, all of it guarded by
:attr:`SegmentTable.lock`:

* the writer thread (:class:`~messaging.topic.writer.TopicWriter`) adds the segments it rolls
  to, drops those of a group it aborts, and at each commit moves the committed marks and the
  committed index;
* the retention thread (:func:`~messaging.topic.retention.truncate`) removes the oldest
  segments and raises the tombstone;
* the broker hides what came before a deletion of the topic (:meth:`SegmentTable.hide_through`);
* readers (:class:`~messaging.topic.read.TopicReads`) and everyone else only look.

Every change is a method of the table; code of the topic room may read its fields while it
holds the lock. The lock is held for memory work only (the writer's files have a lock of their
own), so a reader on the event loop may take it. ``committed_last`` and ``closed`` are written
under it and also read without it (each one reference: atomic), by followers on the loop.

A :class:`~messaging.topic.segment.Segment` in the table is shared the same way: the writer
changes its ``size``/``count``/``last_index`` and marks (staging, with the lock held), its
files, and its ``committed_*`` fields (committing, with the lock held); readers take its
``committed_*`` fields under the lock and read no further. Readers change a segment only to
index one recovery did not read (under the segment's own lock), to record damage found in it,
and to raise its ``verified_size`` past frames whose checksums they checked.
"""

from __future__ import annotations

import threading
from itertools import pairwise

from messaging.errors import TopicTruncatedError
from messaging.topic.segment import Segment
from messaging.topic.stats import DamageLog


class SegmentTable:
    """One topic's segments and read bounds (see the module for who changes what).

    ``segments`` and ``firsts`` (their first indexes, for bisection) are in index order;
    ``tombstone`` is the first index retention kept (0: it never deleted anything);
    ``deleted_through`` the broker index at which the topic was last deleted (0: never);
    ``committed_last`` the last index readers may see.
    """

    def __init__(self, topic_id: int, segments: list[Segment], tombstone: int,
                 damage: DamageLog) -> None:
        self.topic_id = topic_id
        self.damage = damage
        self.lock = threading.Lock()
        self.segments = segments
        self.firsts = [s.first_index for s in segments]
        for segment, following in pairwise(segments):
            segment.following_first = following.first_index
        self.tombstone = tombstone
        self.deleted_through = 0
        self.closed = False
        self.committed_last = self.latest_index_locked(committed=True)  # not shared yet

    # -- any thread -------------------------------------------------------------------------

    def ensure_indexed(self, segment: Segment) -> None:
        """Index a segment recovery did not read, outside the table's lock.

        Damage is recorded on the segment (its good frames stay readable); a file retention
        deleted meanwhile is a 410.
        """
        if segment.indexed:
            return
        try:
            error = segment.ensure_indexed()
        except FileNotFoundError:
            raise TopicTruncatedError(self.topic_id, self.first_index) from None
        if error is not None:
            segment.damage = self.damage.report(segment, error)

    @property
    def first_index(self) -> int:
        """The first index that may still be read: the tombstone, else the first segment's."""
        with self.lock:
            return self.first_index_locked()

    def snapshot(self) -> list[Segment]:
        """The segments now, oldest first (a copy)."""
        with self.lock:
            return list(self.segments)

    # -- with the lock held -----------------------------------------------------------------

    def first_index_locked(self) -> int:
        """See :attr:`first_index`."""
        if self.tombstone:
            return self.tombstone
        return self.firsts[0] if self.firsts else 0

    def latest_index_locked(self, *, committed: bool) -> int:
        """The last appended (or committed) index; below the tombstone if there is none.

        Walks back from the newest segment, which recovery or a roll indexed. An older one is
        reached only past segments rolled to and not committed yet, and it is then the one
        the writer rolled away from, indexed too: no file is read under the lock.
        """
        for segment in reversed(self.segments):
            self.ensure_indexed(segment)
            count = segment.committed_count if committed else segment.count
            if count:
                return segment.committed_last_index if committed else segment.last_index
        return max(self.tombstone - 1, 0)

    # -- the writer thread, with the lock held ----------------------------------------------

    def add_locked(self, segment: Segment) -> None:
        """Add a segment the writer rolled to (its file is created by the next write)."""
        if self.segments:
            self.segments[-1].following_first = segment.first_index
        self.segments.append(segment)
        self.firsts.append(segment.first_index)

    def drop_uncommitted_locked(self) -> list[Segment]:
        """Remove the newest segments that hold nothing committed (rolled to by a group
        that is being aborted); returns them, newest first."""
        dropped: list[Segment] = []
        while self.segments and self.segments[-1].committed_size == 0:
            dropped.append(self.segments.pop())
            self.firsts.pop()
        return dropped

    def commit_locked(self) -> None:
        """Make every frame written so far visible: the segments' committed marks, their
        time records, the committed index."""
        for segment in reversed(self.segments):
            if segment.committed_size == segment.size:
                break
            segment.commit()
            if segment.times is not None:
                segment.times.commit()
        self.committed_last = self.latest_index_locked(committed=True)

    # -- the retention thread ---------------------------------------------------------------

    def remove_oldest(self, count: int, first_kept: int) -> None:
        """Forget the ``count`` oldest segments; reads below ``first_kept`` are 410 from now
        on (its tombstone is written already)."""
        with self.lock:
            del self.segments[:count]
            del self.firsts[:count]
            self.tombstone = first_kept

    # -- the broker -------------------------------------------------------------------------

    def hide_through(self, index: int) -> None:
        """Reads at or below ``index`` answer 410 (the topic was deleted there)."""
        with self.lock:
            self.deleted_through = max(self.deleted_through, index)

    def close(self) -> None:
        """Mark the topic closed (followers stop waiting)."""
        with self.lock:
            self.closed = True
