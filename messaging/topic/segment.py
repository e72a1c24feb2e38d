"""One segment file and its sparse in-memory index.

A segment is ``<first index, 20 digits>.seg``: frames appended one after another. The sparse
index keeps, for the first frame past every MARK_EVERY bytes, its index, byte position and
ordinal (message number in the segment), so "seek to index I" and "the N-th message after
I" cost a bisect plus a short scan of headers, never a whole-file scan.

Segments know nothing of topics: errors they find are returned or raised as they are
(:class:`CorruptFrameError`, :class:`FileNotFoundError` for a file retention deleted), and
the topic says which topic they belong to.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from messaging.errors import CorruptDataError, CorruptFrameError
from messaging.frames import HEADER_SIZE, INDEX, frame_size, scan
from messaging.topic.times import SegmentTimes

SEGMENT_SUFFIX = ".seg"
#: The sparse index keeps the position of the first frame past every MARK_EVERY bytes.
MARK_EVERY = 4096


def segment_name(first_index: int) -> str:
    """The file name of the segment whose first frame has ``first_index``."""
    return f"{first_index:020d}{SEGMENT_SUFFIX}"


@dataclass(eq=False)
class Segment:
    """One segment file and its sparse in-memory index.

    ``size``/``count``/``last_index`` count every frame appended; the ``committed_*`` fields
    bound what readers see. ``mark_*`` are parallel lists: for the first frame past every
    MARK_EVERY bytes, its index, byte position and ordinal.
    """

    path: Path
    first_index: int
    size: int = 0
    count: int = 0
    last_index: int = 0
    committed_size: int = 0
    committed_count: int = 0
    committed_last_index: int = 0
    verified_size: int = 0
    following_first: int = 0  # first index of the segment that came next (0: the last one)
    indexed: bool = False
    created: bool = False  # started in memory; its file is created by the next write
    damage: CorruptDataError | None = None  # frames from committed_size on cannot be read
    times: SegmentTimes | None = None  # its time index (None: written before times existed)
    index_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    mark_indexes: list[int] = field(default_factory=list)
    mark_positions: list[int] = field(default_factory=list)
    mark_ordinals: list[int] = field(default_factory=list)

    # -- the index --------------------------------------------------------------------------

    def add_mark(self, index: int, position: int, ordinal: int) -> None:
        """Record a sparse index entry."""
        self.mark_indexes.append(index)
        self.mark_positions.append(position)
        self.mark_ordinals.append(ordinal)

    def next_mark_position(self) -> int:
        """The byte position from which the next frame gets a mark."""
        return self.mark_positions[-1] + MARK_EVERY if self.mark_positions else 0

    def build_index(self, data: bytes, *, verify: bool) -> CorruptFrameError | None:
        """Index the frames in ``data`` (the whole file); returns the error that stopped it."""
        result = scan(data, after=self.first_index - 1, verify=verify, mark_every=MARK_EVERY)
        self.mark_indexes.clear()
        self.mark_positions.clear()
        self.mark_ordinals.clear()
        for index, position, ordinal in result.marks:
            self.add_mark(index, position, ordinal)
        self.size = self.committed_size = result.end
        self.count = self.committed_count = result.count
        self.last_index = self.committed_last_index = result.last_index
        self.verified_size = result.end if verify else 0
        self.indexed = True
        if result.error is not None:
            return result.error
        if result.incomplete:
            return CorruptFrameError(f"incomplete frame at byte {result.end}")
        return None

    def ensure_indexed(self) -> CorruptFrameError | None:
        """Index a segment recovery did not read (older segments never change).

        Needs only this segment's own lock, never the topic's, and holds it only to install
        the index it built, not across reading the file: two readers that meet here may both
        read it, and the first to finish indexes it. Returns the damage found the first time
        (the good frames before it stay readable); raises FileNotFoundError if retention
        deleted the file.
        """
        if self.indexed:
            return None
        with self.path.open("rb") as f:
            data = f.read()
        with self.index_lock:
            if self.indexed:
                return None
            return self.build_index(data, verify=False)

    # -- appending --------------------------------------------------------------------------

    def commit(self) -> None:
        """Make everything written so far visible to readers."""
        self.committed_size = self.size
        self.committed_count = self.count
        self.committed_last_index = self.last_index

    def last_time(self) -> int | None:
        """The append time of its newest committed message (None: unknown, or none yet)."""
        return self.times.last_committed_time() if self.times is not None else None

    def rollback(self) -> None:
        """Forget everything appended since the last :meth:`commit`."""
        self.size = self.committed_size
        self.count = self.committed_count
        self.last_index = self.committed_last_index
        self.verified_size = min(self.verified_size, self.committed_size)
        self.following_first = 0
        keep = bisect_left(self.mark_positions, self.committed_size)
        del self.mark_indexes[keep:]
        del self.mark_positions[keep:]
        del self.mark_ordinals[keep:]

    # -- seeking ----------------------------------------------------------------------------

    def seek(self, index: int) -> tuple[int, int]:
        """Byte position and ordinal of the first committed frame at or after ``index``."""
        j = bisect_right(self.mark_indexes, index) - 1
        position = self.mark_positions[j] if j >= 0 else 0
        ordinal = self.mark_ordinals[j] if j >= 0 else 0
        return self._scan_forward(position, ordinal, stop_index=index)

    def index_at_ordinal(self, ordinal: int) -> int:
        """The index of the ``ordinal``-th committed frame (from 0)."""
        j = bisect_right(self.mark_ordinals, ordinal) - 1
        position = self.mark_positions[j] if j >= 0 else 0
        start = self.mark_ordinals[j] if j >= 0 else 0
        position, _ = self._scan_forward(position, start, count=ordinal - start)
        with self.path.open("rb") as f:
            f.seek(position)
            (index,) = INDEX.unpack_from(f.read(HEADER_SIZE))
        return int(index)

    def _scan_forward(self, position: int, ordinal: int, *, stop_index: int | None = None,
                      count: int | None = None) -> tuple[int, int]:
        """Walk frame headers from ``position`` until ``stop_index`` or ``count`` frames."""
        with self.path.open("rb") as f:
            while position < self.committed_size:
                want = min(self.committed_size - position, 2 * MARK_EVERY)
                f.seek(position)
                data = f.read(want)
                result = scan(data, verify=False, stop_index=stop_index, max_count=count,
                              mark_base=position)
                if result.error is not None:
                    raise result.error
                position += result.end
                ordinal += result.count
                if count is not None:
                    count -= result.count
                if result.stopped:
                    break
                if result.count == 0:
                    need = frame_size(data) or HEADER_SIZE
                    f.seek(position)
                    data = f.read(need)
                    result = scan(data, verify=False, stop_index=stop_index, max_count=1)
                    if result.count == 0:
                        break
                    position += result.end
                    ordinal += 1
                    if count is not None:
                        count -= 1
        return position, ordinal


class SegmentView(NamedTuple):
    """What readers may see of a segment at one moment (see
    :meth:`messaging.topic.read.TopicReads.view`)."""

    size: int  # committed bytes
    last_index: int
    messages: int
    complete: bool  # nothing appended beyond what is committed
