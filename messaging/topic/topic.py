"""Segmented topic storage: Segment, Topic and TopicReader.

A topic lives in its own directory as ``<first index, 20 digits>.seg`` files of frames, each
with its time index ``<first index>.time`` (see :mod:`messaging.topic.times`; segments written
before times existed have none), plus an optional ``tombstone`` (``{"first_index": N}``:
everything below N was deleted by retention).

Threads: one writer thread appends, writes, syncs and commits; any number of reader threads
read. Readers see only *committed* frames (see :meth:`Topic.commit`), so a consumer never sees
a message that a crash, or a failed write or fsync, could still take back. Followers wait on a
future the writer resolves, never on a sleep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from messaging.aio import Notifier
from messaging.config import DEFAULT_MAX_SEGMENT_SIZE
from messaging.errors import (
    BrokerClosedError,
    CorruptDataError,
    CorruptFrameError,
    MessagingError,
    StorageFailedError,
    TopicDeletedError,
    TopicTruncatedError,
)
from messaging.files import (
    fsync_dir,
    read_json,
    remove_stale_temporaries,
    storage_error,
    truncate_durably,
    write_all,
    write_json_atomic,
)
from messaging.frames import HEADER_SIZE, header_unpacker
from messaging.topic.reader import TopicReader
from messaging.topic.segment import (
    MARK_EVERY,
    SEGMENT_SUFFIX,
    Segment,
    SegmentView,
    segment_name,
)
from messaging.topic.tail import EMPTY_TAIL, Tail, TailBuffer, TailChunk
from messaging.topic.times import TIMES_SUFFIX, SegmentTimes, TimeSyncError, times_path
from messaging.topic.view import TopicView

log = logging.getLogger(__name__)
_T = TypeVar("_T")

TOMBSTONE = "tombstone"
#: Bytes of recent commits a topic keeps in memory for followers that have caught up.
# Index and length only: what appending needs from each frame header.
_unpack_index_and_length = header_unpacker("index", "length").unpack_from


@dataclass
class TopicStats:
    """Counters a topic keeps for diagnostics and metrics.

    Reader threads count damage and the retention thread deletions while others read them:
    :meth:`add` and :meth:`copy` take the counters' own lock (never held across I/O).
    """

    recovered_truncated_bytes: int = 0
    corrupt_frames: int = 0
    deleted_segments: int = 0
    deleted_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add to counters by name."""
        with self._lock:
            for name, count in counts.items():
                setattr(self, name, getattr(self, name) + count)

    def copy(self) -> dict[str, int]:
        """Every counter at one moment."""
        with self._lock:
            return {"recovered_truncated_bytes": self.recovered_truncated_bytes,
                    "corrupt_frames": self.corrupt_frames,
                    "deleted_segments": self.deleted_segments,
                    "deleted_bytes": self.deleted_bytes}


class Topic:
    """One topic: an ordered set of segment files in ``path``.

    Open with :meth:`Topic.open`, which recovers the last segment. Indexes strictly increase
    across the topic; an append of an index not above :attr:`last_index` is skipped as stale, so
    replaying commands after a restart is idempotent.

    Writing is a small transaction driven by one writer thread: :meth:`append` stages frames
    in memory (no I/O), :meth:`write` writes them, :meth:`sync` makes them durable,
    :meth:`commit` makes them visible. :meth:`abort` undoes everything since the last commit,
    in memory and on disk, so a failed or short write never leaves bytes the in-memory state
    does not account for. A failed fsync stops the topic for writes (see
    :class:`StorageFailedError`).

    Two locks: ``_lock`` guards the segment list and the committed fields and is held only
    briefly (readers on the event loop take it); ``_write_lock`` guards the writer's files and
    is held across disk I/O, so only writer-side threads take it.
    """

    def __init__(self, path: Path, topic_id: int, max_segment_size: int) -> None:
        self.path = path
        self.id = topic_id
        self.max_segment_size = max_segment_size
        self.stats = TopicStats()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._segments: list[Segment] = []
        self._firsts: list[int] = []
        self._tombstone = 0
        self._deleted_through = 0  # the index of the topic's last deletion (see hide_through)
        self._closed = False
        self._notifier = Notifier()
        self._committed_last = 0  # last committed index, read without the lock
        self._damage_logged: set[str] = set()
        #: The newest committed bytes of the active segment, shared by every follower that has
        #: caught up: they read them from memory, without a thread or a system call.
        self.tail: Tail = EMPTY_TAIL
        self._tail_buffer = TailBuffer()  # under _lock
        # Writer side (under _write_lock): staged runs, the open segment file, what needs fsync.
        self._staged: list[tuple[Segment, int, bytearray]] = []
        self._written: list[tuple[Segment, int, bytearray]] = []  # since the last commit
        self._fd: int | None = None
        self._fd_segment: Segment | None = None
        self._unsynced: list[int] = []  # files of segments rolled away from, not yet fsynced
        self._dirty = False  # bytes written through _fd since its last fsync
        self._dir_dirty = False
        self._failed: StorageFailedError | None = None
        self._append_time: int | None = None  # the time of the frames being appended
        self._time_writes: list[Segment] = []  # segments with time records to write

    # -- opening and recovery ---------------------------------------------------------------

    @classmethod
    def open(cls, path: Path, topic_id: int,
             max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE) -> Topic:
        """Open (creating if needed) the topic in ``path`` and recover its last segment.

        No file stays open: the active segment is opened by the first write after this.
        """
        path.mkdir(parents=True, exist_ok=True)
        topic = cls(path, topic_id, max_segment_size)
        topic._recover()
        return topic

    def _recover(self) -> None:
        # One directory listing per topic: start-up with many topics is dominated by it.
        with os.scandir(self.path) as listing:
            entries = {entry.name: entry for entry in listing}
        tombstone = self.path / TOMBSTONE
        if TOMBSTONE in entries:
            self._tombstone = int(read_json(tombstone)["first_index"])
        if any(name.startswith(TOMBSTONE + ".") for name in entries):
            remove_stale_temporaries(tombstone)
        for name in sorted(n for n in entries if n.endswith(TIMES_SUFFIX)):
            segment_file = name[: -len(TIMES_SUFFIX)] + SEGMENT_SUFFIX
            if segment_file not in entries or int(name[: -len(TIMES_SUFFIX)]) < self._tombstone:
                # Its segment was deleted (retention, a crash in a roll): it times nothing.
                (self.path / name).unlink()
                self._dir_dirty = True
        for name in sorted(n for n in entries if n.endswith(SEGMENT_SUFFIX)):
            file = self.path / name
            first = int(name[: -len(SEGMENT_SUFFIX)])
            if first < self._tombstone:
                # Retention wrote the tombstone and then stopped before deleting this file.
                file.unlink()
                self._dir_dirty = True
                continue
            segment = Segment(file, first, size=entries[name].stat().st_size)
            segment.committed_size = segment.size
            if name[: -len(SEGMENT_SUFFIX)] + TIMES_SUFFIX in entries:
                segment.times = SegmentTimes(times_path(file), on_disk=True)
            self._segments.append(segment)
        while self._segments:
            last = self._segments[-1]
            self._recover_segment(last)
            if last.size:
                break
            last.path.unlink()  # an empty segment: a crash right after a roll
            if last.times is not None:
                last.times.remove_file()
            self._dir_dirty = True
            self._segments.pop()
        self._firsts = [s.first_index for s in self._segments]
        for segment, following in zip(self._segments, self._segments[1:], strict=False):
            segment.following_first = following.first_index
        self._committed_last = self._committed_index_locked()
        if self._dir_dirty:
            fsync_dir(self.path)
            self._dir_dirty = False

    def _recover_segment(self, segment: Segment) -> None:
        with segment.path.open("rb") as f:
            data = f.read()
        error = segment.build_index(data, verify=True)
        if error is not None:
            cut = len(data) - segment.size
            self.stats.add(recovered_truncated_bytes=cut)
            log.warning("topic %d: truncated %d bytes at byte %d of %s (%s)", self.id, cut,
                        segment.size, segment.path.name, error)
            truncate_durably(segment.path, segment.size)
        self._recover_times(segment)

    def _recover_times(self, segment: Segment) -> None:
        """Cut the last segment's time index back to the frames that survived.

        Its records are fsynced before the frames they cover are written, so every frame
        kept has its record; records of frames a crash took are removed.
        """
        times = segment.times
        if times is None:
            return
        cut = times.recover(segment.last_index)
        if cut:
            log.warning("topic %d: removed %d bytes of time records past index %d from %s",
                        self.id, cut, segment.last_index, times.path.name)
        if segment.count and not times.committed and not times.damaged:
            log.warning("topic %d: %s holds no time record; the times of %s are unknown",
                        self.id, times.path.name, segment.path.name)
            segment.times = None  # as before times existed: the next append starts a segment

    # -- properties -------------------------------------------------------------------------

    @property
    def tombstone(self) -> int:
        """The first index retention kept (0: retention never deleted anything)."""
        with self._lock:
            return self._tombstone

    def hide_through(self, index: int) -> None:
        """The topic was deleted at broker ``index`` and created again: a read from an index
        at or below it answers 410 (:class:`TopicDeletedError`) instead of serving what came
        after as if it followed on. Kept in memory; the broker sets it from its state."""
        with self._lock:
            self._deleted_through = max(self._deleted_through, index)

    def _deleted_error(self) -> TopicDeletedError:
        """The 410 for a read at or below the last deletion (``_lock`` held)."""
        return TopicDeletedError(self.id, self._deleted_through,
                                 self._first_index_locked() or self._deleted_through + 1)

    @property
    def first_index(self) -> int:
        """The first index that may still be read: the tombstone, else the first segment's."""
        with self._lock:
            return self._first_index_locked()

    def _first_index_locked(self) -> int:
        if self._tombstone:
            return self._tombstone
        return self._firsts[0] if self._firsts else 0

    @property
    def last_index(self) -> int:
        """The index of the last frame appended (committed or not); 0 if none."""
        with self._lock:
            return self._latest_index_locked(committed=False)

    def _latest_index_locked(self, *, committed: bool) -> int:
        """The last appended (or committed) index; below the tombstone if there is none."""
        for segment in reversed(self._segments):
            self.ensure_indexed(segment)
            count = segment.committed_count if committed else segment.count
            if count:
                return segment.committed_last_index if committed else segment.last_index
        return max(self._tombstone - 1, 0)

    @property
    def committed_index(self) -> int:
        """The index of the last frame readers can see; 0 if none (no lock: loop-safe)."""
        return self._committed_last

    def _committed_index_locked(self) -> int:
        return self._latest_index_locked(committed=True)

    @property
    def size(self) -> int:
        """Bytes in all segments (committed or not)."""
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        """How many segment files the topic has."""
        with self._lock:
            return len(self._segments)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def failure(self) -> StorageFailedError | None:
        """Why the topic stopped accepting writes (a failed fsync), or None."""
        return self._failed

    @property
    def holds_file(self) -> bool:
        """Whether the topic keeps a segment file open for writing."""
        return self._fd is not None

    def segments(self) -> list[Segment]:
        """A snapshot of the segment list (oldest first)."""
        with self._lock:
            return list(self._segments)

    # -- writing ----------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Raise why the topic cannot take writes (closed, or stopped by a failed fsync)."""
        if self._closed:
            raise BrokerClosedError(f"topic {self.id} is closed")
        if self._failed is not None:
            raise self._failed

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
        if offsets is not None and first:
            with self._write_lock, self._lock:
                self.check_writable()
                if first > self._latest_index_locked(committed=False):
                    return self._append_known(memoryview(frames), offsets, first)
        view = memoryview(frames)
        size = len(view)
        written = 0
        unpack = _unpack_index_and_length
        with self._write_lock, self._lock:
            self.check_writable()
            last = self._latest_index_locked(committed=False)
            offset = run_start = 0
            segment = self._segments[-1] if self._segments else None
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
        total = len(offsets)
        k = 0  # the next frame to place
        while k < total:
            segment = self._segments[-1] if self._segments else None
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
        if self._segments:
            self._segments[-1].following_first = first_index
        self._segments.append(segment)
        self._firsts.append(first_index)
        return segment

    def write(self) -> None:
        """Write what was staged (one ``write`` per segment touched), without fsync.

        On failure raises :class:`DiskFullError` or :class:`StorageError`; the caller then
        calls :meth:`abort` (the topic's files still hold the partial write until then).
        """
        with self._write_lock:
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
        """Whether time records wait to be written (writer thread)."""
        return bool(self._time_writes)

    def write_times(self) -> None:
        """Write and fsync the staged time records now (see :meth:`_write_times`); the
        frames they cover are written by :meth:`write` after."""
        with self._write_lock:
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
        with self._write_lock:
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

    def commit(self, *, notify: bool = True) -> None:
        """Make everything written so far visible to readers and wake followers.

        Writes first if something is still staged (so ``append`` + ``commit`` works alone).
        ``notify=False`` leaves waking the followers to the caller (see :meth:`notify`).
        """
        with self._write_lock:
            self._write_locked()
            written, self._written = self._written, []
        with self._lock:
            for segment in reversed(self._segments):
                if segment.committed_size == segment.size:
                    break
                segment.commit()
                if segment.times is not None:
                    segment.times.commit()
            self._committed_last = self._committed_index_locked()
            if written:
                self.tail = self._new_tail(written[-1])
        if notify:
            self._notifier.notify()

    def _new_tail(self, newest: tuple[Segment, int, bytearray]) -> Tail:
        """The tail after a commit whose last written run is ``newest`` (lock held)."""
        segment, start, data = newest
        if segment is not self._segments[-1]:
            return self._tail_buffer.clear()
        return self._tail_buffer.push(TailChunk(segment, start, data, segment.committed_count,
                                                segment.committed_last_index))

    def notify(self) -> None:
        """Wake the followers waiting for this topic's next commit (any thread)."""
        self._notifier.notify()

    def abort(self) -> None:
        """Undo everything since the last commit: staged frames, written bytes, new segments.

        Segments the failed group created are removed and the active segment's file is cut
        back to its committed size. If that fails the topic stops accepting writes.
        """
        with self._write_lock:
            self._staged.clear()
            self._written.clear()
            self._time_writes.clear()
            with self._lock:
                dropped: list[Segment] = []
                while self._segments and self._segments[-1].committed_size == 0:
                    dropped.append(self._segments.pop())
                    self._firsts.pop()
                last = self._segments[-1] if self._segments else None
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

    def release(self) -> bool:
        """Close the segment file kept open for writing, if nothing waits to be synced."""
        if not self._write_lock.acquire(blocking=False):
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
            self._write_lock.release()

    # -- waiting ----------------------------------------------------------------------------

    async def wait_for(self, after_index: int) -> None:
        """Return once a frame with index above ``after_index`` is committed (or on close).

        Runs on the event loop without taking a lock: the writer wakes it once per commit.
        """
        await self._notifier.wait_until(
            lambda: self._closed or self._committed_last > after_index)

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

    # -- reading (the view a TopicReader reads through) ---------------------------------------

    def reader(self, index: int, end: int | None = None, limit: int | None = None) -> TopicReader:
        """A reader of committed frames from ``index`` (inclusive) to ``end`` (exclusive)."""
        return TopicReader(self, index, end, limit)

    def ensure_indexed(self, segment: Segment) -> None:
        """Index a segment recovery did not read, outside the topic lock.

        Damage is recorded on the segment (its good frames stay readable); a file retention
        deleted meanwhile is a 410.
        """
        if segment.indexed:
            return
        try:
            error = segment.ensure_indexed()
        except FileNotFoundError:
            raise TopicTruncatedError(self.id, self.first_index) from None
        if error is not None:
            segment.damage = self.corrupt(segment, error)

    def locate(self, index: int) -> tuple[Segment, int, int] | None:
        """Segment, byte position and ordinal of the first committed frame at or after index.

        Raises :class:`TopicTruncatedError` below the first retained index. Takes ``_lock``
        only to look at the segment list; file I/O happens outside it. None if there is no
        such frame yet.
        """
        with self._lock:
            if self._deleted_through and index <= self._deleted_through:
                raise self._deleted_error()
            if self._tombstone and index < self._tombstone:
                raise TopicTruncatedError(self.id, self._tombstone)
            segments = list(self._segments)
            i = max(bisect_right(self._firsts, index) - 1, 0)
        while i < len(segments):
            segment = segments[i]
            self.ensure_indexed(segment)
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
        with self._lock:
            if (not self._segments or index != self._committed_last + 1
                    or (self._deleted_through and index <= self._deleted_through)
                    or (self._tombstone and index < self._tombstone)):
                return None
            segment = self._segments[0]
            for later in reversed(self._segments):  # the last one holding committed frames
                if later.committed_size:
                    segment = later
                    break
            if not segment.indexed or segment.damage is not None:
                return None
            return segment, segment.committed_size, segment.committed_count

    def view(self, segment: Segment) -> SegmentView:
        """What readers may see of ``segment`` right now, consistently."""
        with self._lock:
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
        with self._lock:
            if 0 < segment.following_first < self._tombstone:
                raise TopicTruncatedError(self.id, self._tombstone)
            i = bisect_right(self._firsts, segment.first_index)
            following = self._segments[i] if i < len(self._segments) else None
        if following is not None:
            self.ensure_indexed(following)
        return following

    def corrupt(self, segment: Segment, error: Exception) -> CorruptDataError:
        """Describe damage found in ``segment`` (``error`` names the byte); counted and logged
        once per place."""
        damage = CorruptDataError(f"topic {self.id} segment {segment.path.name}: {error}")
        if str(damage) not in self._damage_logged:  # once per place, not once per reader
            self._damage_logged.add(str(damage))
            self.stats.add(corrupt_frames=1)
            log.error("%s", damage)
        return damage

    def _committed_of(self, segment: Segment) -> tuple[int, int]:
        """A consistent (committed count, committed last index) of a segment."""
        with self._lock:
            return segment.committed_count, segment.committed_last_index

    def _in_segment(self, segment: Segment, operation: Callable[[int], _T], arg: int) -> _T:
        """Run a segment read, turning what it finds into this topic's errors."""
        try:
            return operation(arg)
        except FileNotFoundError:
            raise TopicTruncatedError(self.id, self.first_index) from None
        except CorruptFrameError as err:
            raise self.corrupt(segment, err) from err

    def index_after(self, after: int, count: int) -> int | None:
        """The index of the ``count``-th committed message at or after ``after``.

        When fewer than ``count`` such messages exist, the index of the last one; None when
        there is none. O(log n) in segments and marks plus a short scan.
        """
        if count < 1:
            raise ValueError("count must be at least 1")
        located = self.locate(max(after, self.first_index))  # counting starts at what is kept
        if located is None:
            return None
        segment, _position, ordinal = located
        last_seen = self._committed_of(segment)[1]
        segments, ordinal = self._segments_from(segment, ordinal)
        target = ordinal + count - 1
        for segment in segments:
            self.ensure_indexed(segment)
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
        located = self.locate(max(after + 1, self.first_index))
        if located is None:
            return 0
        segment, _position, ordinal = located
        segments, ordinal = self._segments_from(segment, ordinal)
        total = -ordinal
        for segment in segments:
            self.ensure_indexed(segment)
            total += self._committed_of(segment)[0]
        return max(total, 0)

    def _segments_from(self, segment: Segment, ordinal: int) -> tuple[list[Segment], int]:
        """The segments from ``segment`` on, and where in the first one to start.

        :meth:`locate` looked at the segment list without keeping the lock; retention may
        have deleted ``segment`` since. It deletes only the oldest segments, so every kept
        one comes after it: counting starts at the first kept message then (what the
        caller counts are the messages kept).
        """
        with self._lock:
            try:
                start = self._segments.index(segment)
            except ValueError:
                return list(self._segments), 0
            return self._segments[start:], ordinal

    def index_before_end(self, count: int) -> int | None:
        """The index of the ``count``-th committed message counting back from the last one
        (the first kept when fewer are kept); None when the topic holds none."""
        return index_before_end(self, count)

    # -- time -------------------------------------------------------------------------------

    @property
    def last_time(self) -> int | None:
        """The append time of the newest committed message that has one (None: none has)."""
        for segment in reversed(self.segments()):
            last = segment.last_time()
            if last is not None:
                return last
        return None

    def _timed_view(self) -> list[tuple[Segment, int | None]]:
        """Each segment holding committed frames with the time of its newest committed
        message (None: unknown), all as of one commit: a commit that crosses a roll changes
        several segments, and a reader must not see half of it. Time files are read (once)
        before the lock is taken; under it only memory is looked at."""
        for segment in self.segments():
            if segment.times is not None:
                segment.times.ensure_loaded()
        with self._lock:
            return [(s, s.times.last_committed_time() if s.times is not None else None)
                    for s in self._segments if s.committed_size]

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
        return max(index, self.first_index)

    def time_of(self, index: int) -> int | None:
        """The append time of the message with ``index`` (None: unknown)."""
        runs = self.times(index, index)
        return runs[0][1] if runs else None

    def times(self, start: int, stop: int) -> list[tuple[int, int | None]]:
        """The append times of the committed messages with indexes ``start`` .. ``stop``:
        (first index, time) runs, each holding until the next one starts; time None for
        messages written before times existed."""
        with self._lock:
            segments = list(self._segments)
            i = max(bisect_right(self._firsts, start) - 1, 0)
            stop = min(stop, self._committed_last)
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

    # -- retention --------------------------------------------------------------------------

    def truncate(self, max_size: int, floor_index: int, older_than: int | None = None) -> int:
        """Delete oldest whole segments while the topic exceeds ``max_size``, and every
        segment up to the last one whose newest message was appended before ``older_than``
        (ms since the epoch; None: no age limit). Times never decrease along a topic, so
        the segments before that one are older still, also those whose times are unknown; a
        segment of unknown times with no old-enough one after it is left to the size limit.

        Keeps the active segment and every segment holding an index above ``floor_index``.
        Writes the tombstone before deleting. Returns the number of bytes deleted. Only the
        segments that may go are indexed (read), not every closed one.
        """
        segments = self.segments()
        closed = segments[:-1]
        aged = 0  # how many of the oldest segments are old enough
        if older_than is not None:
            for k, segment in enumerate(closed):
                newest = segment.last_time()
                if newest is not None:
                    if newest >= older_than:
                        break
                    aged = k + 1
        total = sum(s.size for s in segments)
        candidates = 0
        for k, segment in enumerate(closed):
            if total <= max_size and k >= aged:
                break
            candidates = k + 1
            total -= segment.size
        for older in closed[:candidates]:
            self.ensure_indexed(older)  # outside the lock: may read whole files
        too_old = {id(s) for s in closed[:aged]}
        with self._lock:
            doomed: list[Segment] = []
            total = sum(s.size for s in self._segments)
            for oldest, following in zip(self._segments, self._segments[1:], strict=False):
                if following.committed_size == 0:
                    break  # the writer is rolling into the next one now
                if total <= max_size and id(oldest) not in too_old:
                    break
                if not oldest.indexed or oldest.committed_last_index > floor_index \
                        or oldest.damage is not None:
                    break
                doomed.append(oldest)
                total -= oldest.size
            if not doomed:
                return 0
            # Indexes are shared by all topics, so this topic's are not contiguous: everything
            # up to the last deleted index is gone, and a read from just after it (a
            # subscriber resuming past its heartbeat) loses nothing.
            first_kept = doomed[-1].committed_last_index + 1
        try:
            write_json_atomic(self.path / TOMBSTONE, {"first_index": first_kept})
        except OSError as err:
            log.error("topic %d: retention could not write its tombstone (%s); nothing "
                      "deleted", self.id, err.strerror or err)
            return 0
        with self._lock:
            del self._segments[: len(doomed)]
            del self._firsts[: len(doomed)]
            self._tombstone = first_kept
        deleted = 0
        for segment in doomed:
            with contextlib.suppress(FileNotFoundError):
                segment.path.unlink()
            if segment.times is not None:
                segment.times.remove_file()
            deleted += segment.size
            self.stats.add(deleted_segments=1, deleted_bytes=segment.size)
            log.info("topic %d: retention deleted %s (%d bytes); first index now %d",
                     self.id, segment.path.name, segment.size, first_kept)
        fsync_dir(self.path)
        return deleted

    def cut_after(self, index: int) -> int:
        """Remove every frame above ``index`` from the files (at start-up, before any write).

        For frames a crash left behind that the catalog never accepted (they were never
        acknowledged). Closes this topic: open it again afterwards. Returns bytes removed.
        """
        located = self.locate(index + 1) if self.last_index > index else None
        self.close()
        if located is None:
            return 0
        segment, position, _ordinal = located
        removed = 0
        for later in self._segments[self._segments.index(segment) + 1:]:
            removed += later.size
            later.path.unlink()
            if later.times is not None:
                later.times.remove_file()
        removed += segment.size - position
        if position:
            truncate_durably(segment.path, position)
            if segment.times is not None:
                segment.times.cut_after(index)
        else:
            segment.path.unlink()
            if segment.times is not None:
                segment.times.remove_file()
        fsync_dir(self.path)
        log.warning("topic %d: removed %d bytes after index %d that were never acknowledged",
                    self.id, removed, index)
        return removed

    # -- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Sync, close the files (each exactly once) and wake every follower."""
        if self._closed:
            return
        try:
            if self._failed is None:
                self.write()
                self.sync()
        except MessagingError as err:
            log.error("topic %d: could not sync on close: %s", self.id, err)
        finally:
            with self._write_lock:
                fds = [*self._unsynced, *([self._fd] if self._fd is not None else [])]
                self._fd = self._fd_segment = None
                self._unsynced = []
                self._staged.clear()
                for fd in fds:
                    os.close(fd)
            with self._lock:
                self._closed = True
            self._notifier.notify()


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
