"""The writer's side of a topic: a small transaction over its segment files.

:meth:`TopicWriter.append` stages frames in memory (no I/O), :meth:`~TopicWriter.write`
writes them, :meth:`~TopicWriter.sync` makes them durable, :meth:`~TopicWriter.commit` makes
them visible. :meth:`~TopicWriter.abort` undoes everything since the last commit, in memory
and on disk, so a failed or short write never leaves bytes the in-memory state does not
account for. A failed fsync stops the topic for writes (:class:`StorageFailedError`): after
it the kernel may have dropped the dirty pages, so a later fsync would prove nothing.

Threads: the broker's single writer thread drives the transaction (the store's fsync threads
may run :meth:`~TopicWriter.sync` and :meth:`~TopicWriter.write_times` for it, one topic
each, while it waits). Everything a :class:`TopicWriter` holds is the writer's: the staged
and written runs, the file open for writing and those waiting for their fsync, the tail
buffer; its own lock guards them and is held across disk I/O, so only writer-side threads
ever take it. What readers see is only what :meth:`~TopicWriter.commit` publishes: the
committed marks in the :class:`~messaging.topic.table.SegmentTable` (under that table's lock)
and the new in-memory tail it returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from array import array
from bisect import bisect_left
from pathlib import Path

from messaging.errors import BrokerClosedError, CorruptFrameError, StorageFailedError
from messaging.files import fsync_dir, storage_error, write_all
from messaging.frames import HEADER_SIZE, header_unpacker
from messaging.topic.segment import MARK_EVERY, Segment, segment_name
from messaging.topic.table import SegmentTable
from messaging.topic.tail import Tail, TailBuffer, TailChunk
from messaging.topic.times import SegmentTimes, TimeSyncError, times_path

log = logging.getLogger(__name__)

# Index and length only: what appending needs from each frame header.
_unpack_index_and_length = header_unpacker("index", "length").unpack_from

#: A run of frames staged or written into one segment: the segment, the byte position the
#: run starts at, its bytes.
StagedRun = tuple[Segment, int, bytearray]


class TopicWriter:
    """The transaction of one topic's writes (see the module); owned by the writer thread."""

    def __init__(self, path: Path, topic_id: int, max_segment_size: int,
                 table: SegmentTable) -> None:
        self.path = path
        self.id = topic_id
        self.max_segment_size = max_segment_size
        self._table = table
        self._lock = threading.Lock()  # held across disk I/O: writer-side threads only
        self._staged: list[StagedRun] = []
        self._written: list[StagedRun] = []  # since the last commit
        self._fd: int | None = None
        self._fd_segment: Segment | None = None
        self._unsynced: list[int] = []  # files of segments rolled away from, not yet fsynced
        self._dirty = False  # bytes written through _fd since its last fsync
        self._dir_dirty = False
        self._failed: StorageFailedError | None = None
        self._append_time: int | None = None  # the time of the frames being appended
        self._time_writes: list[Segment] = []  # segments with time records to write
        self._tail_buffer = TailBuffer()

    @property
    def failure(self) -> StorageFailedError | None:
        """Why the topic stopped accepting writes (a failed fsync), or None."""
        return self._failed

    @property
    def holds_file(self) -> bool:
        """Whether a segment file is open for writing."""
        return self._fd is not None

    def check_writable(self) -> None:
        """Raise why the topic cannot take writes (closed, or stopped by a failed fsync)."""
        if self._table.closed:
            raise BrokerClosedError(f"topic {self.id} is closed")
        if self._failed is not None:
            raise self._failed

    # -- staging (memory only) --------------------------------------------------------------

    def append(self, frames: bytes | bytearray | memoryview, offsets: array[int] | None = None,
               first: int = 0, time_ms: int | None = None) -> int:
        """Stage complete frames (indexes already assigned); returns how many were staged.

        No I/O: :meth:`write` writes what was staged. The caller has verified the frames'
        checksums (the broker does so on publish), so readers need not verify them again.
        Frames whose index is not above the topic's last index are skipped as stale (replay is
        idempotent). A new segment starts once the active one is past ``max_segment_size``.
        With ``offsets`` (every frame's start) and ``first`` (the first frame's index, the
        others following one by one), no header is read again: only the sparse-index marks
        are looked up, by bisection.

        ``time_ms`` is the frames' append time (the broker's, non-decreasing): a time record
        is staged where it changes and at the start of every new segment (None: the frames
        get no time, as before times existed). Frames with a time never go into a segment
        without a time index: such a segment is rolled away from first.
        """
        self._append_time = time_ms
        table = self._table
        if offsets is not None and first:
            with self._lock, table.lock:
                self.check_writable()
                if first > table.latest_index_locked(committed=False):
                    return self._append_known(memoryview(frames), offsets, first)
        view = memoryview(frames)
        size = len(view)
        written = 0
        unpack = _unpack_index_and_length
        with self._lock, table.lock:
            self.check_writable()
            last = table.latest_index_locked(committed=False)
            offset = run_start = 0
            segment = table.segments[-1] if table.segments else None
            # Hot loop: locals only; segment fields are written back when a run is staged.
            base = next_mark = count = 0
            limit = -1  # no segment yet: the first fresh frame starts one
            if segment is not None:
                base, next_mark, count = segment.size, segment.next_mark_position(), segment.count
                limit = self.max_segment_size
            timing = time_ms is not None  # the first fresh frame still needs its time
            while offset < size:
                if size - offset < HEADER_SIZE:
                    raise CorruptFrameError(f"incomplete frame header at byte {offset}")
                index, length = unpack(view, offset)
                end = offset + HEADER_SIZE + length
                if end > size:
                    raise CorruptFrameError(f"incomplete frame at byte {offset}")
                if index <= last:  # stale: a replayed command
                    self._stage(segment, view[run_start:offset], count, last)
                    offset = run_start = end
                    if segment is not None:
                        base = segment.size
                    continue
                position = base + offset - run_start
                if position >= limit or (timing and not self._timed(segment, index)):
                    self._stage(segment, view[run_start:offset], count, last)
                    run_start = offset
                    segment = self._roll(index)
                    base = position = count = next_mark = 0
                    limit = self.max_segment_size
                timing = False
                if position >= next_mark:
                    assert segment is not None
                    segment.add_mark(index, position, count)
                    next_mark = position + MARK_EVERY
                count += 1
                last = index
                written += 1
                offset = end
            self._stage(segment, view[run_start:offset], count, last)
        return written

    def _append_known(self, view: memoryview, offsets: array[int], first: int) -> int:
        """Stage fresh frames whose offsets are known (both locks held)."""
        segments = self._table.segments
        total = len(offsets)
        k = 0  # the next frame to place
        while k < total:
            segment = segments[-1] if segments else None
            if (segment is None or segment.size >= self.max_segment_size
                    or (k == 0 and not self._timed(segment, first))):
                segment = self._roll(first + k)
            base = segment.size - offsets[k]  # segment position of a frame = base + offset
            # Frames go into this segment while they start below the size limit.
            end = bisect_left(offsets, self.max_segment_size - base, k + 1)
            next_mark = segment.next_mark_position()
            count = segment.count
            j = bisect_left(offsets, next_mark - base, k, end)
            while j < end:
                position = base + offsets[j]
                segment.add_mark(first + j, position, count + j - k)
                j = bisect_left(offsets, position + MARK_EVERY - base, j + 1, end)
            stop = offsets[end] if end < total else len(view)
            self._stage(segment, view[offsets[k]:stop], count + end - k, first + end - 1)
            k = end
        return total

    def _stage(self, segment: Segment | None, run: memoryview, count: int, last: int) -> None:
        if segment is None or not run:
            return
        if self._staged and self._staged[-1][0] is segment:
            self._staged[-1][2].extend(run)
        else:
            self._staged.append((segment, segment.size, bytearray(run)))
        if segment.verified_size == segment.size:  # the caller verified what it appends
            segment.verified_size += len(run)
        segment.size += len(run)
        segment.count = count
        segment.last_index = last

    def _timed(self, segment: Segment | None, index: int) -> bool:
        """Give the fresh frame ``index`` its time in ``segment`` (staging a record when the
        time changes); False when the segment cannot time it (none, or one written before
        times existed): a new segment must start there."""
        time_ms = self._append_time
        if time_ms is None or segment is None:
            return time_ms is None and segment is not None
        times = segment.times
        if times is None or times.damaged:
            return False
        if times.last_time != time_ms:
            times.add(index, time_ms)
            self._time_writes.append(segment)
        return True

    def _roll(self, first_index: int) -> Segment:
        """Start a new segment in memory; its file is created by the next :meth:`write`
        (its time index before it, with a first record when frames come with a time)."""
        path = self.path / segment_name(first_index)
        segment = Segment(path, first_index, indexed=True, created=True)
        if self._append_time is not None:
            segment.times = SegmentTimes(times_path(path))
            segment.times.add(first_index, self._append_time)
            self._time_writes.append(segment)
        self._table.add_locked(segment)
        return segment

    # -- writing and syncing ----------------------------------------------------------------

    def write(self) -> None:
        """Write what was staged (one ``write`` per segment touched), without fsync.

        On failure raises :class:`DiskFullError` or :class:`StorageError`; the caller then
        calls :meth:`abort` (the topic's files still hold the partial write until then).
        """
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        if not self._staged:
            return
        self._write_times()
        try:
            for segment, _start, data in self._staged:
                write_all(self._file_for(segment), data)
                self._dirty = True
        except OSError as err:
            raise storage_error(f"writing topic {self.id} in {self.path}", err) from err
        self._written.extend(self._staged)
        self._staged.clear()

    @property
    def times_staged(self) -> bool:
        """Whether time records wait to be written."""
        return bool(self._time_writes)

    def write_times(self) -> None:
        """Write and fsync the staged time records now (see :meth:`_write_times`); the
        frames they cover are written by :meth:`write` after."""
        with self._lock:
            self._write_times()

    def _write_times(self) -> None:
        """Write and fsync the staged time records, before the frames they cover: a frame
        never reaches the disk ahead of its time. A failed fsync stops the topic, as for
        frames."""
        if not self._time_writes:
            return
        created = False
        try:
            for segment in dict.fromkeys(self._time_writes):
                if segment.times is not None and segment.times.staged:
                    created |= segment.times.write()
            if created:
                # A new time file's name becomes durable with its segment's, in the one
                # directory fsync of sync(), before the group is answered. A crash before
                # that may keep the segment's file without it: times unknown for frames
                # never acknowledged, never wrong ones.
                self._dir_dirty = True
        except TimeSyncError as err:
            self._failed = StorageFailedError(
                f"topic {self.id} stopped accepting writes: fsync failed ({err.strerror or err});"
                " restart the broker to re-verify its files")
            log.error("%s", self._failed)
            raise self._failed from err
        except OSError as err:
            raise storage_error(f"writing the time index of topic {self.id} in {self.path}",
                                err) from err
        self._time_writes.clear()

    def _file_for(self, segment: Segment) -> int:
        """The open file of ``segment`` (opening it, and creating a new segment's file)."""
        if self._fd_segment is segment and self._fd is not None:
            return self._fd
        if self._fd is not None:
            if self._dirty:
                self._unsynced.append(self._fd)
            else:
                os.close(self._fd)
            self._fd = self._fd_segment = None
            self._dirty = False
        flags = os.O_WRONLY | os.O_APPEND
        if segment.created:
            # Nothing committed can be in a new segment's file: a failed group may have left
            # a partial one behind (when removing it failed too), so start it empty.
            flags |= os.O_CREAT | os.O_TRUNC
        self._fd = os.open(segment.path, flags, 0o644)
        self._fd_segment = segment
        if segment.created:
            segment.created = False
            self._dir_dirty = True
        return self._fd

    def sync(self) -> None:
        """Write what is staged, then fsync it (and any new segment's directory entry).

        A failed fsync stops the topic for writes: after it the kernel may have dropped the
        dirty pages, so a later fsync would prove nothing about them.
        """
        with self._lock:
            if self._failed is not None:
                raise self._failed
            self._write_locked()
            unsynced, self._unsynced = self._unsynced, []
            try:
                for fd in unsynced:
                    os.fdatasync(fd)
                if self._dirty and self._fd is not None:
                    os.fdatasync(self._fd)
                if self._dir_dirty:
                    fsync_dir(self.path)
            except OSError as err:
                self._failed = StorageFailedError(
                    f"topic {self.id} stopped accepting writes: fsync failed "
                    f"({err.strerror or err}); restart the broker to re-verify its files")
                log.error("%s", self._failed)
                raise self._failed from err
            finally:
                for fd in unsynced:
                    os.close(fd)
            self._dirty = False
            self._dir_dirty = False

    # -- ending the transaction -------------------------------------------------------------

    def commit(self) -> Tail | None:
        """Make everything written so far visible to readers (writing first if something is
        still staged) in the segment table; returns the tail followers read from now on
        (None: unchanged, nothing was written)."""
        with self._lock:
            self._write_locked()
            written, self._written = self._written, []
        table = self._table
        with table.lock:
            table.commit_locked()
            return self._new_tail(written[-1]) if written else None

    def _new_tail(self, newest: StagedRun) -> Tail:
        """The tail after a commit whose last written run is ``newest`` (table lock held)."""
        segment, start, data = newest
        if segment is not self._table.segments[-1]:
            return self._tail_buffer.clear()
        return self._tail_buffer.push(TailChunk(segment, start, data, segment.committed_count,
                                                segment.committed_last_index))

    def abort(self) -> None:
        """Undo everything since the last commit: staged frames, written bytes, new segments.

        Segments the failed group created are removed and the active segment's file is cut
        back to its committed size. If that fails the topic stops accepting writes.
        """
        with self._lock:
            self._staged.clear()
            self._written.clear()
            self._time_writes.clear()
            table = self._table
            with table.lock:
                dropped = table.drop_uncommitted_locked()
                last = table.segments[-1] if table.segments else None
                if last is not None:
                    last.rollback()
            try:  # on disk: remove the new segments' files, cut the active one back
                if self._fd is not None and self._fd_segment in dropped:
                    os.close(self._fd)  # its file is removed below: nothing in it to sync
                    self._fd = self._fd_segment = None
                    self._dirty = False
                for segment in dropped:
                    with contextlib.suppress(FileNotFoundError):
                        segment.path.unlink()
                    if segment.times is not None:
                        segment.times.remove_file()
                    self._dir_dirty = True
                if last is not None and last.path.exists():
                    os.truncate(last.path, last.committed_size)
                if last is not None and last.times is not None:
                    last.times.rollback()
            except OSError as err:
                self._failed = StorageFailedError(
                    f"topic {self.id} stopped accepting writes: could not roll back a failed "
                    f"write ({err.strerror or err}); restart the broker to re-verify its files")
                log.error("%s", self._failed)

    # -- files ------------------------------------------------------------------------------

    def release(self) -> bool:
        """Close the segment file kept open for writing, if nothing waits to be synced."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._fd is None:
                return True
            if self._staged or self._dirty or self._unsynced:
                return False
            os.close(self._fd)
            self._fd = self._fd_segment = None
            return True
        finally:
            self._lock.release()

    def close_files(self) -> None:
        """Close every file, each exactly once, and forget what was staged (closing)."""
        with self._lock:
            fds = [*self._unsynced, *([self._fd] if self._fd is not None else [])]
            self._fd = self._fd_segment = None
            self._unsynced = []
            self._staged.clear()
            for fd in fds:
                os.close(fd)
