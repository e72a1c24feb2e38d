"""The manifest of one topic: which of its closed segments are in the object store.

It is state, changed only by commands through the log (:mod:`messaging.broker.topic_settings`
carries it in a topic's entry), so every node and every snapshot agree on it. Three things:

* ``objects``: the segments in the store, oldest first, each with its first and last index,
  size, SHA-256 (the object's name follows from them, :mod:`messaging.objects.naming`), its
  time index's object, and the newest append time it holds (age retention);
* ``offloaded``: the last index ever recorded (total retention may drop objects, never this);
* ``expired``: every index up to it is gone from the topic for good (total retention).

A local segment whose last index is at most ``covered`` (the larger of the two) may be
deleted from the disk: its bytes are in a verified object, or nobody may read them any more.
Pure values: no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from messaging.objects.naming import SEGMENT_KIND, TIMES_KIND, SegmentObjectName

#: An object's entry keeps a mark (index, byte position, ordinal) for the first frame at or
#: past every this many bytes, so a read, a count or a seek inside it starts near its place
#: instead of at the object's first byte.
MARK_STRIDE = 1 << 20

Mark = tuple[int, int, int]  # index, byte position, ordinal (messages before it)


@dataclass(frozen=True, slots=True)
class SegmentObject:
    """One closed segment in the store (and, when it had one, its time index)."""

    first: int
    last: int
    size: int
    count: int  # messages it holds
    sha256: str
    times_sha256: str | None = None
    times_size: int = 0
    last_time: int | None = None  # the newest append time it holds (ms), None: unknown
    marks: tuple[Mark, ...] = ()  # see MARK_STRIDE (sorted; none at byte 0)

    def mark_at_index(self, index: int) -> Mark:
        """The last mark at or below ``index`` (the object's start when none is)."""
        k = bisect_right(self.marks, (index, 1 << 64, 0))
        return self.marks[k - 1] if k else (self.first, 0, 0)

    def mark_at_ordinal(self, ordinal: int) -> Mark:
        """The last mark whose ordinal is at most ``ordinal`` (the object's start when none
        is)."""
        best: Mark = (self.first, 0, 0)
        for mark in self.marks:
            if mark[2] > ordinal:
                break
            best = mark
        return best

    def name(self, topic: int) -> SegmentObjectName:
        """The name of its frames' object."""
        return SegmentObjectName(topic, self.first, self.last, self.sha256, SEGMENT_KIND)

    def times_name(self, topic: int) -> SegmentObjectName | None:
        """The name of its time index's object (None: it has none)."""
        if self.times_sha256 is None:
            return None
        return SegmentObjectName(topic, self.first, self.last, self.times_sha256, TIMES_KIND)

    def saved(self) -> list[Any]:
        """The compact JSON form (a list)."""
        return [self.first, self.last, self.size, self.count, self.sha256, self.times_sha256,
                self.times_size, self.last_time, [list(m) for m in self.marks]]

    @classmethod
    def restore(cls, data: Sequence[Any]) -> SegmentObject:
        """The object from :meth:`saved` (ValueError/TypeError if malformed)."""
        first, last, size, count, sha256, times_sha256, times_size, last_time, *rest = data
        if len(rest) > 1:
            raise ValueError(f"object {data!r} has too many fields")
        marks = rest[0] if rest else []  # entries written before objects had marks
        made = cls(int(first), int(last), int(size), int(count), str(sha256),
                   None if times_sha256 is None else str(times_sha256), int(times_size),
                   None if last_time is None else int(last_time),
                   tuple((int(i), int(p), int(o)) for i, p, o in marks))
        made.name(0)  # checks indexes and checksum
        if made.times_sha256 is not None:
            made.times_name(0)
        if made.size <= 0 or made.count <= 0 or made.times_size < 0:
            raise ValueError(f"object {data!r} has an invalid size")
        if any(not (made.first < i <= made.last and 0 < p < made.size and 0 < o < made.count)
               for i, p, o in made.marks) or list(made.marks) != sorted(set(made.marks)):
            raise ValueError(f"object {data!r} has invalid marks")
        return made


@dataclass(frozen=True, slots=True)
class Manifest:
    """A topic's objects in the store (replaced whole, never changed in place)."""

    objects: tuple[SegmentObject, ...] = ()
    offloaded: int = 0
    expired: int = 0
    _lasts: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lasts", tuple(o.last for o in self.objects))

    @property
    def empty(self) -> bool:
        """Whether it says nothing (no object, nothing offloaded or expired)."""
        return not self.objects and not self.offloaded and not self.expired

    @property
    def covered(self) -> int:
        """Local segments ending at or below this may be deleted from the disk."""
        return max(self.offloaded, self.expired)

    @property
    def first_index(self) -> int:
        """The first index readable from the store (0: none)."""
        if not self.objects:
            return 0
        return max(self.objects[0].first, self.expired + 1)

    @property
    def size(self) -> int:
        """Bytes of every segment object."""
        return sum(o.size for o in self.objects)

    def find(self, index: int) -> SegmentObject | None:
        """The object holding ``index``, or the first one after it (None: neither)."""
        k = bisect_right(self._lasts, index - 1)
        return self.objects[k] if k < len(self.objects) else None

    def offload(self, obj: SegmentObject, after: int) -> Manifest | None:
        """The manifest with ``obj`` recorded, given it was uploaded as the segment right
        after ``after`` (the manifest's ``offloaded`` its uploader saw); None when that is
        no longer so (recorded already, or another upload got there first): nothing
        changes then."""
        if after != self.offloaded or obj.first <= self.covered:
            return None
        return Manifest((*self.objects, obj), obj.last, self.expired)

    def expire(self, through: int) -> Manifest | None:
        """The manifest with everything up to ``through`` gone (None: nothing changes)."""
        if through <= self.expired:
            return None
        kept = tuple(o for o in self.objects if o.last > through)
        return Manifest(kept, self.offloaded, through)

    def dropped(self, newer: Manifest) -> list[SegmentObject]:
        """The objects this manifest holds that ``newer`` does not (to delete from the
        store)."""
        kept = set(newer.objects)
        return [o for o in self.objects if o not in kept]

    def saved(self) -> dict[str, Any]:
        """The JSON form."""
        return {"objects": [o.saved() for o in self.objects], "offloaded": self.offloaded,
                "expired": self.expired}

    @classmethod
    def restore(cls, data: dict[str, Any] | None) -> Manifest:
        """The manifest from :meth:`saved`."""
        if not data:
            return cls()
        return cls(tuple(SegmentObject.restore(o) for o in data.get("objects", [])),
                   int(data.get("offloaded", 0)), int(data.get("expired", 0)))

