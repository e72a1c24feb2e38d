"""Queries over a topic's committed frames: where an index is, what a segment shows readers
now, which segment follows, how many messages come after an index, and their append times.

Threads: any thread (readers run on worker threads). Nothing here changes the segment table:
it looks at it under the table's lock, copies what it needs, and reads files outside the
lock. A query never sees a frame that is not committed. What it finds damaged is reported
through the topic's :class:`~messaging.topic.stats.DamageLog`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import TypeVar

from messaging.errors import (
    CorruptDataError,
    CorruptFrameError,
    TopicDeletedError,
    TopicTruncatedError,
)
from messaging.topic.segment import Segment, SegmentView
from messaging.topic.stats import DamageLog
from messaging.topic.table import SegmentTable
from messaging.topic.view import TopicView

_T = TypeVar("_T")


class TopicReads:
    """The read side of one topic: the positions a
    :class:`~messaging.topic.reader.TopicReader` reads through, and the count and time
    queries, all over committed state."""

    def __init__(self, table: SegmentTable, damage: DamageLog) -> None:
        self._table = table
        self._damage = damage
        self.topic_id = table.topic_id

    # -- positions (what a TopicReader reads through) ---------------------------------------

    def locate(self, index: int) -> tuple[Segment, int, int] | None:
        """Segment, byte position and ordinal of the first committed frame at or after index.

        Raises :class:`TopicTruncatedError` below the first retained index. Takes the table's
        lock only to look at the segment list; file I/O happens outside it. None if there is
        no such frame yet.
        """
        table = self._table
        with table.lock:
            if table.deleted_through and index <= table.deleted_through:
                raise _deleted_error(table)
            if table.tombstone and index < table.tombstone:
                raise TopicTruncatedError(self.topic_id, table.tombstone)
            segments = list(table.segments)
            i = max(bisect_right(table.firsts, index) - 1, 0)
        while i < len(segments):
            segment = segments[i]
            table.ensure_indexed(segment)
            count, last = self._committed_of(segment)
            if count and last >= index:
                position, ordinal = self._in_segment(segment, segment.seek, index)
                return segment, position, ordinal
            if segment.damage is not None:
                raise segment.damage  # the index may be in the part that cannot be read
            i += 1
        return None

    def next_position(self, index: int) -> tuple[Segment, int, int] | None:
        """Where frame ``index`` will be read from when it is the very next index to commit.

        The end of the committed frames (segment, byte position, ordinal), for a reader that
        starts at the topic's end: every frame committed later has an index at or above
        ``index`` and comes after that position, so the reader can read it there (from the
        in-memory tail when it follows). None when ``index`` is not the next one.
        """
        table = self._table
        with table.lock:
            if (not table.segments or index != table.committed_last + 1
                    or (table.deleted_through and index <= table.deleted_through)
                    or (table.tombstone and index < table.tombstone)):
                return None
            segment = table.segments[0]
            for later in reversed(table.segments):  # the last one holding committed frames
                if later.committed_size:
                    segment = later
                    break
            if not segment.indexed or segment.damage is not None:
                return None
            return segment, segment.committed_size, segment.committed_count

    def view(self, segment: Segment) -> SegmentView:
        """What readers may see of ``segment`` right now, consistently."""
        with self._table.lock:
            return SegmentView(segment.committed_size, segment.committed_last_index,
                               segment.committed_count,
                               segment.committed_size == segment.size)

    def following(self, segment: Segment) -> Segment | None:
        """The segment after ``segment``, for a reader that finished it; None if none yet.

        Raises the damage that ended ``segment`` early, and :class:`TopicTruncatedError` when
        retention deleted segments the reader had not reached (rather than skip them).
        """
        if segment.damage is not None:
            raise segment.damage
        table = self._table
        with table.lock:
            if 0 < segment.following_first < table.tombstone:
                raise TopicTruncatedError(self.topic_id, table.tombstone)
            i = bisect_right(table.firsts, segment.first_index)
            following = table.segments[i] if i < len(table.segments) else None
        if following is not None:
            table.ensure_indexed(following)
        return following

    def corrupt(self, segment: Segment, error: Exception) -> CorruptDataError:
        """Describe damage found in ``segment`` (``error`` names the byte); counted and logged
        once per place."""
        return self._damage.report(segment, error)

    def _committed_of(self, segment: Segment) -> tuple[int, int]:
        """A consistent (committed count, committed last index) of a segment."""
        with self._table.lock:
            return segment.committed_count, segment.committed_last_index

    def _in_segment(self, segment: Segment, operation: Callable[[int], _T], arg: int) -> _T:
        """Run a segment read, turning what it finds into this topic's errors."""
        try:
            return operation(arg)
        except FileNotFoundError:
            raise TopicTruncatedError(self.topic_id, self._table.first_index) from None
        except CorruptFrameError as err:
            raise self.corrupt(segment, err) from err

    # -- counts -----------------------------------------------------------------------------

    def index_after(self, after: int, count: int) -> int | None:
        """The index of the ``count``-th committed message at or after ``after``.

        When fewer than ``count`` such messages exist, the index of the last one; None when
        there is none. O(log n) in segments and marks plus a short scan.
        """
        if count < 1:
            raise ValueError("count must be at least 1")
        # Counting starts at what is kept.
        located = self.locate(max(after, self._table.first_index))
        if located is None:
            return None
        segment, _position, ordinal = located
        last_seen = self._committed_of(segment)[1]
        segments, ordinal = self._segments_from(segment, ordinal)
        target = ordinal + count - 1
        for segment in segments:
            self._table.ensure_indexed(segment)
            committed_count, committed_last = self._committed_of(segment)
            if target < committed_count:
                return self._in_segment(segment, segment.index_at_ordinal, target)
            target -= committed_count
            if committed_count:
                last_seen = committed_last
        return last_seen

    def count_after(self, after: int) -> int:
        """How many committed messages have an index above ``after`` (of those kept).

        Broker indexes are shared by every topic, so index differences are not message
        counts; this counts frames. O(log n) in segments and marks plus a short scan.
        """
        located = self.locate(max(after + 1, self._table.first_index))
        if located is None:
            return 0
        segment, _position, ordinal = located
        segments, ordinal = self._segments_from(segment, ordinal)
        total = -ordinal
        for segment in segments:
            self._table.ensure_indexed(segment)
            total += self._committed_of(segment)[0]
        return max(total, 0)

    def _segments_from(self, segment: Segment, ordinal: int) -> tuple[list[Segment], int]:
        """The segments from ``segment`` on, and where in the first one to start.

        :meth:`locate` looked at the segment list without keeping the lock; retention may
        have deleted ``segment`` since. It deletes only the oldest segments, so every kept
        one comes after it: counting starts at the first kept message then (what the
        caller counts are the messages kept).
        """
        table = self._table
        with table.lock:
            try:
                start = table.segments.index(segment)
            except ValueError:
                return list(table.segments), 0
            return table.segments[start:], ordinal

    # -- times ------------------------------------------------------------------------------

    def last_time(self) -> int | None:
        """The append time of the newest committed message that has one (None: none has)."""
        for segment in reversed(self._table.snapshot()):
            last = segment.last_time()
            if last is not None:
                return last
        return None

    def _timed_view(self) -> list[tuple[Segment, int | None]]:
        """Each segment holding committed frames with the time of its newest committed
        message (None: unknown), all as of one commit: a commit that crosses a roll changes
        several segments, and a reader must not see half of it. Time files are read (once)
        before the lock is taken; under it only memory is looked at."""
        table = self._table
        for segment in table.snapshot():
            if segment.times is not None:
                segment.times.ensure_loaded()
        with table.lock:
            return [(s, s.times.last_committed_time() if s.times is not None else None)
                    for s in table.segments if s.committed_size]

    def index_at_time(self, time_ms: int) -> int | None:
        """The index of the first committed message appended at or after ``time_ms`` (of
        those kept); None when there is none yet.

        Times never decrease along the topic, so this bisects the segments by their newest
        time, then one segment's records: a few small reads, never a scan of the frames. A
        segment whose times are unknown takes the time of the nearest known one before it.
        Segments written before times existed count as older than any time; but when the
        answer lies just after segments whose time index is damaged, the read starts at the
        first of them, so that nothing appended at or after ``time_ms`` is skipped (their
        messages may be older: damage is never taken for "too old").
        """
        view = self._timed_view()

        def known_before(i: int) -> int | None:  # the newest known time up to segment i
            for j in range(i, -1, -1):
                if view[j][1] is not None:
                    return view[j][1]
            return None

        lo, hi = 0, len(view)
        while lo < hi:
            mid = (lo + hi) // 2
            newest = known_before(mid)
            if newest is None or newest < time_ms:
                lo = mid + 1
            else:
                hi = mid
        if lo == len(view):
            return None
        times = view[lo][0].times
        found = times.first_index_at(time_ms) if times is not None else None
        start = lo
        if found is None or found <= view[lo][0].first_index:
            # The answer is where this segment starts: damaged ones just before it may hold
            # messages as recent (not when it starts with an older message).
            while start > 0 and _damaged(view[start - 1][0]):
                start -= 1
        index = view[start][0].first_index if start < lo or found is None else found
        return max(index, self._table.first_index)

    def time_of(self, index: int) -> int | None:
        """The append time of the message with ``index`` (None: unknown)."""
        runs = self.times(index, index)
        return runs[0][1] if runs else None

    def times(self, start: int, stop: int) -> list[tuple[int, int | None]]:
        """The append times of the committed messages with indexes ``start`` .. ``stop``:
        (first index, time) runs, each holding until the next one starts; time None for
        messages written before times existed."""
        table = self._table
        with table.lock:
            segments = list(table.segments)
            i = max(bisect_right(table.firsts, start) - 1, 0)
            stop = min(stop, table.committed_last)
        runs: list[tuple[int, int | None]] = []
        if start > stop:
            return runs
        for segment in segments[i:]:
            if segment.first_index > stop:
                break
            low = max(start, segment.first_index)
            found: list[tuple[int, int | None]] = (
                [] if segment.times is None else list(segment.times.runs(low, stop)))
            if not found or found[0][0] > low:  # no time for these (from before, damaged)
                found.insert(0, (low, None))
            for first, time_ms in found:
                if not runs or runs[-1][1] != time_ms:
                    runs.append((first, time_ms))
        return runs


def _deleted_error(table: SegmentTable) -> TopicDeletedError:
    """The 410 for a read at or below the topic's last deletion (the table's lock held)."""
    return TopicDeletedError(table.topic_id, table.deleted_through,
                             table.first_index_locked() or table.deleted_through + 1)


def _damaged(segment: Segment) -> bool:
    """Whether a segment has a time index that is damaged (its times are unknown)."""
    return segment.times is not None and segment.times.damaged


def index_before_end(topic: TopicView, count: int) -> int | None:
    """The index of ``topic``'s ``count``-th committed message counting back from the last
    one (the first kept when fewer are kept); None when it holds none. From its counts, so
    any view that counts (a topic over an object store too) answers it alike."""
    if count < 1:
        raise ValueError("count must be at least 1")
    first = topic.first_index
    kept = topic.count_after(first - 1)
    if kept == 0:
        return None
    return topic.index_after(first, max(kept - count + 1, 1))
