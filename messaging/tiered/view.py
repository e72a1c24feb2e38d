"""A topic as readers see it when its older segments are in the object store.

:class:`TieredTopic` wraps the local :class:`~messaging.topic.topic.Topic`: its first index
is the store's (410 only below that), its readers read the store below the local segments
(:class:`~messaging.tiered.reader.TieredReader`), and counts, seeks by time and times cover
both. Everything else (the end, the tail, waiting for commits) is the local topic's.
:class:`Tiered` holds what every such view of one broker shares: the store, the read cache
and the manifests.
"""

from __future__ import annotations

from collections.abc import Callable

from messaging.objects.store import ObjectStore
from messaging.tiered.cache import ObjectCache
from messaging.tiered.manifest import Manifest, SegmentObject
from messaging.tiered.metrics import StoreMetrics
from messaging.tiered.objects import SegmentObjectReader
from messaging.tiered.reader import TieredReader
from messaging.topic.read import index_before_end
from messaging.topic.tail import Tail
from messaging.topic.topic import Topic


class Tiered:
    """One broker's object store for reads: the store, the read cache and the manifests
    (``manifest_of(topic id)``, the committed state)."""

    def __init__(self, store: ObjectStore, cache: ObjectCache,
                 manifest_of: Callable[[int], Manifest], metrics: StoreMetrics) -> None:
        self.store = store
        self.cache = cache
        self.manifest_of = manifest_of
        self.metrics = metrics

    def view(self, topic: Topic) -> TieredTopic:
        """``topic`` as readers see it."""
        return TieredTopic(topic, self)


class TieredTopic:
    """A local topic with the segments of its manifest below it (see the module)."""

    def __init__(self, topic: Topic, tiered: Tiered) -> None:
        self.local = topic
        self.tiered = tiered
        self.objects = SegmentObjectReader(tiered.cache, topic.id)

    def manifest(self) -> Manifest:
        """The topic's manifest now."""
        return self.tiered.manifest_of(self.local.id)

    def _store_below(self) -> tuple[Manifest, int]:
        """The manifest, and the local first index (what is below it is read from the
        store; 0: no local segment)."""
        return self.manifest(), self.local.first_index

    # -- the local topic's -------------------------------------------------------------

    @property
    def id(self) -> int:
        """The topic id."""
        return self.local.id

    @property
    def committed_index(self) -> int:
        """The last committed index."""
        return self.local.committed_index

    @property
    def size(self) -> int:
        """Bytes of the local segments."""
        return self.local.size

    @property
    def segment_count(self) -> int:
        """Local segment files."""
        return self.local.segment_count

    @property
    def closed(self) -> bool:
        """Whether the local topic closed."""
        return self.local.closed

    @property
    def failure(self) -> Exception | None:
        """Why the local topic stopped taking writes (None: it takes them)."""
        return self.local.failure

    @property
    def tail(self) -> Tail:
        """The local topic's in-memory tail."""
        return self.local.tail

    async def wait_for(self, after_index: int) -> None:
        """Wait for a commit after ``after_index``."""
        await self.local.wait_for(after_index)

    def listen(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after every commit."""
        self.local.listen(callback)

    def unlisten(self, callback: Callable[[], None]) -> None:
        """Stop calling ``callback``."""
        self.local.unlisten(callback)

    # -- over the store and the disk ---------------------------------------------------

    @property
    def first_index(self) -> int:
        """The first index still readable: the store's first, else the local first."""
        manifest, local_first = self._store_below()
        stored = manifest.first_index
        if stored and (not local_first or stored < local_first):
            return stored
        return max(local_first, manifest.expired + 1) if local_first else local_first

    def reader(self, index: int, end: int | None = None,
               limit: int | None = None) -> TieredReader:
        """A reader from ``index`` (the store first when it is below the local segments)."""
        return TieredReader(self, index, end, limit)

    def _stored(self, start: int) -> list[SegmentObject]:
        """The objects holding indexes from ``start`` up to below the local segments."""
        manifest, local_first = self._store_below()
        found = manifest.find(start)
        if found is None:
            return []
        k = manifest.objects.index(found)
        return [o for o in manifest.objects[k:] if not local_first or o.first < local_first]

    def count_after(self, after: int) -> int:
        """How many committed messages have an index above ``after`` (of those kept)."""
        local_first = self.local.first_index
        total = 0
        for obj in self._stored(max(after + 1, self.first_index)):
            below = min(obj.last, local_first - 1) if local_first else obj.last
            total += self.objects.count(obj, below) - self.objects.count(obj, after)
        return total + self.local.count_after(after)

    def index_after(self, after: int, count: int) -> int | None:
        """The index of the ``count``-th committed message at or after ``after`` (the last
        one when fewer exist; None when there is none)."""
        if count < 1:
            raise ValueError("count must be at least 1")
        start = max(after, self.first_index)
        local_first = self.local.first_index
        # The last message passed over: an index, or (object, ordinal) to look up only if
        # nothing later is found. An object passed over whole ends at its manifest's last
        # index, so a count past it reads none of its bytes (planning a Spark read asks
        # where each batch ends: it reads no object it only passes).
        last_seen: int | tuple[SegmentObject, int] | None = None
        for obj in self._stored(start):
            through = min(obj.last, local_first - 1) if local_first else obj.last
            skipped = self.objects.count(obj, start - 1)
            here = self.objects.count(obj, through) - skipped
            if count <= here:
                return self.objects.index_at_ordinal(obj, skipped + count - 1)
            count -= here
            if here:
                last_seen = obj.last if through == obj.last else (obj, skipped + here - 1)
            start = through + 1
        found = self.local.index_after(max(start, local_first), count)
        if found is not None:
            return found
        if isinstance(last_seen, tuple):
            return self.objects.index_at_ordinal(*last_seen)
        return last_seen

    def index_before_end(self, count: int) -> int | None:
        """The index of the ``count``-th message counting back from the last one (the first
        kept when fewer are kept); None when none is kept."""
        return index_before_end(self, count)

    def index_at_time(self, time_ms: int) -> int | None:
        """The index of the first committed message appended at or after ``time_ms``."""
        first = self.first_index
        for obj in self._stored(first):
            if obj.last_time is not None and obj.last_time < time_ms:
                continue
            found = self.objects.first_index_at(obj, time_ms)
            if found is not None:
                return max(found, first)
            if obj.last_time is None:  # times unknown: it may be anywhere from here
                return max(obj.first, first)
        return self.local.index_at_time(time_ms)

    def time_of(self, index: int) -> int | None:
        """The append time of the message ``index`` (None: unknown)."""
        local_first = self.local.first_index
        if not local_first or index < local_first:
            found = self.manifest().find(index)
            if found is not None and found.first <= index:
                return self.objects.time_of(found, index)
        return self.local.time_of(index)

    def times(self, start: int, stop: int) -> list[tuple[int, int | None]]:
        """(first index, append time) runs covering ``start`` .. ``stop``."""
        local_first = self.local.first_index
        runs: list[tuple[int, int | None]] = []
        for obj in self._stored(max(start, self.first_index)):
            if obj.first > stop:
                break
            top = min(stop, obj.last, local_first - 1) if local_first else min(stop, obj.last)
            for first, time_ms in self.objects.runs(obj, start, top):
                if not runs or runs[-1][1] != time_ms:
                    runs.append((first, time_ms))
        if not local_first or stop >= local_first:
            for first, time_ms in self.local.times(max(start, local_first), stop):
                if not runs or runs[-1][1] != time_ms:
                    runs.append((first, time_ms))
        return runs
