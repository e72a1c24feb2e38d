"""TopicReader: reads a topic's committed frames through the topic's read side
(:class:`~messaging.topic.read.TopicReads`) and, once caught up, from its in-memory tail.

A reader never sees a frame that is not committed (a crash, a failed write or a failed fsync
could still take it back), verifies every CRC it has not verified before and the order of
indexes, and holds no file open between reads.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from typing import Protocol

from messaging.errors import CorruptDataError, CorruptFrameError, TopicTruncatedError
from messaging.frames import HEADER_SIZE, frame_size, scan
from messaging.topic.segment import Segment, SegmentView
from messaging.topic.tail import TailChunk
from messaging.topic.view import TopicView


class CommittedReads(Protocol):
    """What a reader reads through: a topic's committed positions and segment views
    (:class:`messaging.topic.read.TopicReads` provides them)."""

    def locate(self, index: int) -> tuple[Segment, int, int] | None: ...
    def next_position(self, index: int) -> tuple[Segment, int, int] | None: ...
    def view(self, segment: Segment) -> SegmentView: ...
    def following(self, segment: Segment) -> Segment | None: ...
    def corrupt(self, segment: Segment, error: Exception) -> CorruptDataError: ...

#: Default size of one read.
READ_CHUNK = 256 << 10


class TopicReader:
    """Reads committed frames of one topic, verifying every CRC and the index order.

    :meth:`read` returns the next chunk of whole frames as bytes (empty at the current end).
    No file stays open between reads: each read opens, reads and closes, so an idle reader
    holds no descriptor and a file retention deleted meanwhile is reported (410), never read.
    Damage on disk is raised as :class:`CorruptDataError` after the good frames before it.

    ``topic`` is the topic read (its id, first index, closed flag and tail), ``reads`` its
    committed positions and segment views.
    """

    def __init__(self, topic: TopicView, reads: CommittedReads, index: int,
                 end: int | None = None, limit: int | None = None) -> None:
        self.topic = topic
        self._reads = reads
        self.next_index = max(index, 0)
        self.last_index = self.next_index - 1 if self.next_index else 0
        self.end = end
        self.remaining = limit
        self.done = (end is not None and self.next_index >= end) or limit == 0
        self.delivered = 0
        self._segment: Segment | None = None
        self._position = 0
        self._ordinal = 0  # message number of _position within the segment
        self._damage: CorruptDataError | None = None  # raised by the read after the good part

    def close(self) -> None:
        """Nothing to release (kept so readers work as context managers)."""

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _position_at_start(self) -> bool:
        """Find where to start; False if nothing at or after next_index can be placed yet.

        A reader of the next index to commit starts at the end of the committed frames, so
        that it reads that commit from the in-memory tail when it follows the topic.
        """
        located = (self._reads.locate(self.next_index)
                   or self._reads.next_position(self.next_index))
        if located is None:
            return False
        self._segment, self._position, self._ordinal = located
        return True

    def read(self, max_bytes: int = READ_CHUNK) -> bytes:
        """The next chunk of whole, verified frames; ``b""`` when nothing more is committed."""
        topic, reads = self.topic, self._reads
        while not self.done:
            if self._damage is not None:
                raise self._damage
            if topic.closed:
                return b""
            if self._segment is None and not self._position_at_start():
                return b""
            segment = self._segment
            assert segment is not None
            view = reads.view(segment)
            if self._position >= view.size:
                following = reads.following(segment) if view.complete else None
                if following is None:
                    return b""
                self._segment, self._position, self._ordinal = following, 0, 0
                continue
            chunk = self._read_verified(view, max_bytes)
            if chunk is None:
                chunk = self._read_frames(view.size, max_bytes)
            if chunk:
                return chunk
        return b""

    def read_tail(self) -> bytes | memoryview | None:
        """The frames after this reader's position from the topic's in-memory tail.

        No I/O, no thread, no lock: callable on the event loop. Everything the tail holds
        from there up to its end (or a gap), as a view when it is one chunk's. None when the
        tail does not hold this reader's position (read with :meth:`read` then), or when
        ``end``/``limit`` need the frame-by-frame path.
        """
        position = self.tail_position()
        found = None if position is None else self.topic.tail.after(*position)
        if found is None:
            return None
        parts, _first, last = found
        self.adopt_tail(last)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def tail_position(self) -> tuple[Segment, int] | None:
        """Where this reader stands in the tail (see :meth:`Tail.after`); None when it cannot.

        Readers at the same position read the same bytes of the tail and end in the same
        state, so a fan-out prepares those bytes once for all of them (see :meth:`adopt_tail`).
        """
        if (self.end is not None or self.remaining is not None or self._segment is None
                or self._damage is not None):
            return None
        return self._segment, self._position

    def adopt_tail(self, chunk: TailChunk) -> int:
        """Move past ``chunk``'s end after its bytes were sent; how many messages that was.

        Only for bytes from the tail's ``after`` at this reader's :meth:`tail_position`.
        """
        delivered = chunk.count - self._ordinal
        self.delivered += delivered
        self._ordinal = chunk.count
        self._position = chunk.end
        self.last_index = chunk.last_index
        self.next_index = chunk.last_index + 1
        return delivered

    def _read_at(self, size: int, position: int) -> bytes:
        segment = self._segment
        assert segment is not None
        try:
            fd = os.open(segment.path, os.O_RDONLY)
        except FileNotFoundError:
            raise TopicTruncatedError(self.topic.id, self.topic.first_index) from None
        try:
            data = os.pread(fd, size, position)
        finally:
            os.close(fd)
        if len(data) < size:
            # A short read of a regular file means it shrank under us: corruption.
            raise self._reads.corrupt(segment, CorruptFrameError(
                f"short read at byte {position}: {len(data)} of {size} bytes"))
        return data

    def _read_verified(self, view: SegmentView, max_bytes: int) -> bytes | None:
        """Read already-verified frames cut at a sparse-index mark: no per-frame work.

        None when this read needs the frame-by-frame path (a limit, unverified bytes, or the
        chunk would reach ``end``).
        """
        segment = self._segment
        assert segment is not None
        start = self._position
        if self.remaining is not None or segment.verified_size <= start:
            return None
        visible = view.size
        bound = min(visible, start + max_bytes)
        if bound == visible and visible <= segment.verified_size:
            cut, next_index, ordinal = visible, view.last_index + 1, view.messages
        else:
            j = bisect_right(segment.mark_positions, min(bound, segment.verified_size)) - 1
            if j < 0 or segment.mark_positions[j] <= start:
                return None
            cut = segment.mark_positions[j]
            next_index, ordinal = segment.mark_indexes[j], segment.mark_ordinals[j]
        if self.end is not None and next_index > self.end:
            return None  # every frame before the cut has an index below next_index
        data = self._read_at(cut - start, start)
        self.delivered += ordinal - self._ordinal
        self._ordinal = ordinal
        self._position = cut
        self.next_index = next_index
        self.last_index = next_index - 1
        if self.end is not None and next_index >= self.end:
            self.done = True
        return data

    def _read_frames(self, visible: int, max_bytes: int) -> bytes:
        segment = self._segment
        assert segment is not None
        # At least a whole header, so that a frame larger than max_bytes is read whole below
        # (with less, its size is unknown and the read would return nothing, forever).
        want = min(visible - self._position, max(max_bytes, HEADER_SIZE))
        data = self._read_at(want, self._position)
        verify = self._position + want > segment.verified_size
        result = scan(data, after=self.last_index, stop_index=self.end, max_count=self.remaining,
                      verify=verify, mark_base=self._position)
        if result.count == 0 and result.incomplete:
            need = frame_size(data) or HEADER_SIZE
            if self._position + need > visible:
                result.error = CorruptFrameError(
                    f"frame at byte {self._position} of {need} bytes runs past the end")
            else:
                data = self._read_at(need, self._position)
                result = scan(data, after=self.last_index, stop_index=self.end,
                              max_count=self.remaining, verify=verify, mark_base=self._position)
        if result.error is not None:
            damage = self._reads.corrupt(segment, result.error)
            if not result.count:
                raise damage
            self._damage = damage  # deliver the good frames first; the next read raises
        if result.count:
            if verify and self._position <= segment.verified_size:
                segment.verified_size = max(segment.verified_size, self._position + result.end)
            self.delivered += result.count
            self._ordinal += result.count
            self.last_index = result.last_index
            self.next_index = result.last_index + 1
            self._position += result.end
            if self.remaining is not None:
                self.remaining -= result.count
        if result.stopped or (self.end is not None and self.next_index >= self.end):
            self.done = True
        return data[: result.end] if result.end < len(data) else data

    def read_all(self, max_bytes: int = READ_CHUNK) -> bytes:
        """Every committed frame from here to the end (or ``end``/``limit``), as one buffer."""
        parts = []
        while chunk := self.read(max_bytes):
            parts.append(chunk)
        return b"".join(parts)
