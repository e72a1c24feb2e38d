"""The in-memory tail: a topic's newest committed bytes, which caught-up followers read.

The writer thread adds one chunk per commit to a :class:`TailBuffer`; followers on the event
loop read the immutable :class:`Tail` it hands out, without a lock. Adding a chunk costs
O(1) amortised and finding a follower's position O(log n). That matters for a topic taking
one-message commits: at 1,000 commits a second the tail holds thousands of small chunks, and
rebuilding or scanning all of them on every commit cost more CPU than the fdatasync.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from messaging.topic.segment import Segment

#: Bytes of committed frames a topic keeps in memory for its followers.
TAIL_BYTES = 256 << 10


@dataclass(frozen=True, slots=True, eq=False)
class TailChunk:
    """Bytes of the active segment a recent commit made visible, kept for followers.

    ``count`` and ``last_index`` describe the segment up to the chunk's end; ``visible_at``
    is when the commit became visible (``time.perf_counter``), for the fan-out's lag figure.
    """

    segment: Segment
    start: int
    data: bytearray
    count: int
    last_index: int
    visible_at: float = field(default_factory=time.perf_counter)

    @property
    def end(self) -> int:
        """The byte position after the chunk."""
        return self.start + len(self.data)


class TailRead(NamedTuple):
    """What :meth:`Tail.after` found: views of the bytes, the chunk they start in and the
    chunk they end in."""

    parts: list[memoryview]
    first: TailChunk
    last: TailChunk


class Tail:
    """A snapshot of the tail: chunks of one segment, oldest first, with gaps allowed.

    It never changes once made: the lists it looks into are only ever appended to past its
    end (a :class:`TailBuffer` starts new lists rather than cut old ones).
    """

    __slots__ = ("_chunks", "_ends", "_hi", "_lo")

    def __init__(self, chunks: list[TailChunk], ends: list[int], lo: int, hi: int) -> None:
        self._chunks = chunks
        self._ends = ends
        self._lo = lo
        self._hi = hi

    def __len__(self) -> int:
        return self._hi - self._lo

    def __iter__(self) -> Iterator[TailChunk]:
        chunks = self._chunks
        return (chunks[i] for i in range(self._lo, self._hi))

    def after(self, segment: Segment, position: int) -> TailRead | None:
        """The bytes after ``position`` of ``segment``, up to the tail's end or first gap.

        As views of the chunks (no copy) with the first and last chunk they reach; None when
        the tail does not hold ``position`` or holds nothing after it.
        """
        chunks, lo, hi = self._chunks, self._lo, self._hi
        if lo == hi or chunks[hi - 1].segment is not segment:
            return None
        i = bisect_right(self._ends, position, lo, hi)  # the first chunk ending past it
        if i == hi or chunks[i].start > position:
            return None  # past the end, before the oldest chunk, or in a gap
        first = last = chunks[i]
        parts = [memoryview(last.data)[position - last.start:]]
        for j in range(i + 1, hi):
            newer = chunks[j]
            if newer.start != last.end:
                break  # a gap: the rest next time, or from the files
            parts.append(memoryview(newer.data))
            last = newer
        return TailRead(parts, first, last)


EMPTY_TAIL = Tail([], [], 0, 0)


class TailBuffer:
    """The writer's side of a topic's tail: at most ``budget`` bytes of one segment.

    Chunks leave from the front as new ones come in. The lists are copied (without the
    chunks that left) once as many chunks have left as remain, or a budget's worth of bytes
    has: the copy costs O(1) per added chunk, amortised, and at most about twice the budget
    stays referenced.
    """

    def __init__(self, budget: int = TAIL_BYTES) -> None:
        self.budget = budget
        self._chunks: list[TailChunk] = []
        self._ends: list[int] = []
        self._lo = 0
        self._size = 0  # bytes from _lo on
        self._gone = 0  # bytes before _lo

    def push(self, chunk: TailChunk) -> Tail:
        """Add the newest committed chunk; the tail followers should see from now on."""
        if len(chunk.data) > self.budget:
            return self.clear()  # too big to keep: followers read it from the file
        chunks, ends = self._chunks, self._ends
        if len(chunks) > self._lo and chunks[-1].segment is not chunk.segment:
            self.clear()  # a new segment: the old one's bytes are for the files now
            chunks, ends = self._chunks, self._ends
        chunks.append(chunk)
        ends.append(chunk.end)
        self._size += len(chunk.data)
        lo = self._lo
        while self._size > self.budget:  # never the new chunk: it fits the budget alone
            left = len(chunks[lo].data)
            self._size -= left
            self._gone += left
            lo += 1
        if lo and (2 * lo >= len(chunks) or self._gone >= self.budget):
            self._chunks, self._ends = chunks[lo:], ends[lo:]
            lo = self._gone = 0
        self._lo = lo
        return Tail(self._chunks, self._ends, lo, len(self._chunks))

    @property
    def held(self) -> int:
        """How many chunks the lists still reference, those that left included."""
        return len(self._chunks)

    def clear(self) -> Tail:
        """Forget every chunk (fresh lists: tails handed out before keep theirs)."""
        self._chunks, self._ends = [], []
        self._lo = self._size = self._gone = 0
        return EMPTY_TAIL
