"""Frames and times of one segment object, read through the cache (worker threads only).

Every frame delivered has its CRC verified and its index checked against the one before; an
object whose bytes do not hold what its manifest entry says is corrupt
(:class:`~messaging.objects.errors.ObjectCorruptError`, a 500 naming the object), never
delivered.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from messaging.frames import HEADER_SIZE, INDEX, frame_size, scan
from messaging.objects.errors import ObjectCorruptError
from messaging.tiered.cache import ObjectCache
from messaging.tiered.manifest import SegmentObject
from messaging.topic.times import decode_records


@dataclass(frozen=True, slots=True)
class Frames:
    """Whole verified frames read from an object: their bytes, how many, the last index and
    the byte position after them."""

    data: bytes
    count: int
    last_index: int
    end: int


class SegmentObjectReader:
    """Reads one topic's segment objects through a shared :class:`ObjectCache`."""

    def __init__(self, cache: ObjectCache, topic: int) -> None:
        self.cache = cache
        self.topic = topic

    def name(self, obj: SegmentObject) -> str:
        """The object's name in the store."""
        return obj.name(self.topic).name

    def corrupt(self, obj: SegmentObject, detail: str) -> ObjectCorruptError:
        """The error for an object that does not hold what the manifest says. Its cached
        chunks are dropped first: bytes found bad are fetched again by the next read (the
        object put right, or a bad answer of the store), never kept as the object's."""
        name = self.name(obj)
        self.cache.forget(name)
        times = obj.times_name(self.topic)
        if times is not None:
            self.cache.forget(times.name)
        return ObjectCorruptError(self.cache.store.url, name, detail)

    def frames(self, obj: SegmentObject, position: int, after: int, want: int, *,
               skip_below: int = 0, stop_index: int | None = None,
               max_count: int | None = None) -> tuple[int, Frames]:
        """Frames of ``obj`` from byte ``position``: the frames below ``skip_below`` are
        passed over (headers only), then about ``want`` bytes of whole frames are read and
        verified, stopping before ``stop_index`` and after ``max_count`` frames. ``after``
        is the index before the first one read (order check). Returns where the delivered
        frames start and them (an empty :class:`Frames` at the object's end)."""
        name = self.name(obj)
        if skip_below and position == 0:  # start at the mark nearest below, not at byte 0
            position = obj.mark_at_index(skip_below)[1]
        if skip_below:
            position, _passed = self._pass_over(obj, position, skip_below, want)
        start = position
        # The index sits outside a frame's CRC: only its place tells a damaged one, so every
        # index delivered must follow the one before and lie within the object's range.
        after = max(after, obj.first - 1)
        while position < obj.size:
            window = self.cache.read(name, obj.size, position, position + want)
            found = scan(window, after=after, stop_index=stop_index, max_count=max_count)
            if found.error is not None:
                raise self.corrupt(obj, f"at byte {position + found.end}: {found.error}")
            if found.count and found.last_index > obj.last:
                raise self.corrupt(obj, f"a frame before byte {position + found.end} has an "
                                   f"index above its last, {obj.last}")
            if found.count or found.stopped:
                return start, Frames(window[:found.end], found.count, found.last_index,
                                     position + found.end)
            length = frame_size(window) if len(window) >= HEADER_SIZE else None
            if length is None or position + length > obj.size:
                raise self.corrupt(obj, f"the frame at byte {position} is cut off")
            want = length  # one frame larger than ``want``: read it whole
        return start, Frames(b"", 0, after, position)

    def _pass_over(self, obj: SegmentObject, position: int, stop_index: int,
                   want: int) -> tuple[int, int]:
        """Read headers only from byte ``position`` up to the first frame whose index is
        ``stop_index`` or more: where that frame starts (the object's end when none is) and
        how many frames were passed over."""
        name = self.name(obj)
        passed = 0
        while position < obj.size:
            window = self.cache.read(name, obj.size, position,
                                     position + max(want, self.cache.chunk))
            found = scan(window, verify=False, stop_index=stop_index)
            if found.error is not None:
                raise self.corrupt(obj, f"at byte {position + found.end}: {found.error}")
            passed += found.count
            position += found.end
            if found.stopped:
                break
            if not found.count:  # one frame larger than the window
                length = frame_size(window)
                if length is None:
                    raise self.corrupt(obj, f"a frame is cut off at byte {position}")
                if INDEX.unpack_from(window)[0] >= stop_index:
                    break
                position += length
                passed += 1
        return position, passed

    def count(self, obj: SegmentObject, through: int) -> int:
        """How many of ``obj``'s messages have an index at most ``through``."""
        if through >= obj.last:
            return obj.count
        if through < obj.first:
            return 0
        _index, position, before = obj.mark_at_index(through)
        _position, passed = self._pass_over(obj, position, through + 1, self.cache.chunk)
        return before + passed

    def index_at_ordinal(self, obj: SegmentObject, ordinal: int) -> int:
        """The index of ``obj``'s ``ordinal``-th message (from 0): read from the mark before
        it, or none of the object when the manifest says (its last message, or a mark's)."""
        if ordinal == obj.count - 1:
            return obj.last
        index, position, before = obj.mark_at_ordinal(ordinal)
        if before == ordinal:
            return index
        last, left = index - 1, ordinal - before + 1
        while left > 0:
            _start, read = self.frames(obj, position, last, self.cache.chunk, max_count=left)
            if not read.count:
                raise self.corrupt(obj, f"it holds fewer than {ordinal + 1} messages")
            left -= read.count
            position, last = read.end, read.last_index
        return last

    def times(self, obj: SegmentObject) -> tuple[list[int], list[int]]:
        """The indexes and times of ``obj``'s time records (empty: it has none)."""
        named = obj.times_name(self.topic)
        if named is None:
            return [], []
        data = self.cache.read(named.name, obj.times_size, 0, obj.times_size)
        records, used = decode_records(data)
        if used != len(data):
            raise self.corrupt(obj, f"its time index is damaged at byte {used}")
        return [r[0] for r in records], [r[1] for r in records]

    def first_index_at(self, obj: SegmentObject, time_ms: int) -> int | None:
        """The first index of ``obj`` appended at or after ``time_ms`` (None: none is)."""
        indexes, times = self.times(obj)
        j = bisect_left(times, time_ms)
        return indexes[j] if j < len(indexes) else None

    def time_of(self, obj: SegmentObject, index: int) -> int | None:
        """The append time of ``index`` in ``obj`` (None: unknown)."""
        indexes, times = self.times(obj)
        j = bisect_right(indexes, index) - 1
        return times[j] if j >= 0 else None

    def runs(self, obj: SegmentObject, start: int, stop: int) -> list[tuple[int, int | None]]:
        """(first index, time) runs covering ``start`` .. ``stop`` within ``obj``."""
        indexes, times = self.times(obj)
        low = max(start, obj.first)
        j = max(bisect_right(indexes, low) - 1, 0)
        k = bisect_right(indexes, stop)
        found: list[tuple[int, int | None]] = [(max(indexes[i], low), times[i])
                                               for i in range(j, k)]
        if not found or found[0][0] > low:
            found.insert(0, (low, None))
        return found
