"""A reader of a topic whose older segments are in the object store.

It reads from the store while the next index is below the local segments, verifying every
frame, then hands over to the local reader at exactly the next index (no gap, no repeat).
Should local retention delete a segment under the local reader (its object is verified and
recorded by then), it goes back to the store at the same index instead of answering 410.
Runs on worker threads, like :class:`~messaging.topic.reader.TopicReader`.
"""

from __future__ import annotations

from typing import Protocol

from messaging.errors import TopicTruncatedError
from messaging.objects.errors import ObjectNotFoundError
from messaging.tiered.manifest import Manifest, SegmentObject
from messaging.tiered.objects import SegmentObjectReader
from messaging.topic.reader import READ_CHUNK
from messaging.topic.segment import Segment
from messaging.topic.tail import TailChunk
from messaging.topic.view import ReaderView, TopicView


class StoreBackedTopic(TopicView, Protocol):
    """What a :class:`TieredReader` reads through: a topic whose older segments are in the
    object store (:class:`~messaging.tiered.view.TieredTopic` is one): the topic on the local
    disk, its segment objects read through the shared cache, and its manifest now."""

    @property
    def local(self) -> TopicView: ...
    @property
    def objects(self) -> SegmentObjectReader: ...
    def manifest(self) -> Manifest: ...


class TieredReader:
    """Reads committed frames of one topic from ``index``: the store, then the disk."""

    def __init__(self, topic: StoreBackedTopic, index: int, end: int | None = None,
                 limit: int | None = None) -> None:
        self._topic = topic
        self.next_index = max(index, 0)
        self._last_index = self.next_index - 1 if self.next_index else 0
        self._end = end
        self._remaining = limit
        self._delivered = 0
        self._done = (end is not None and self.next_index >= end) or limit == 0
        self._local: ReaderView | None = None
        self._object: SegmentObject | None = None
        self._position = 0  # byte position in _object of the next frame to deliver
        self._skip = False  # the next read passes over frames below next_index first

    # -- ReaderView ---------------------------------------------------------------------

    @property
    def topic(self) -> StoreBackedTopic:
        """The topic read."""
        return self._topic

    @property
    def done(self) -> bool:
        """Whether the reader reached its end or limit."""
        return self._local.done if self._local is not None else self._done

    @property
    def last_index(self) -> int:
        """The index of the last message delivered (or the one before the start)."""
        return self._local.last_index if self._local is not None else self._last_index

    @property
    def delivered(self) -> int:
        """Messages delivered so far."""
        return self._delivered + (self._local.delivered if self._local is not None else 0)

    @property
    def end(self) -> int | None:
        """The index the reader stops before (None: none)."""
        return self._end

    @property
    def remaining(self) -> int | None:
        """Messages still to deliver under a limit (None: no limit)."""
        return self._local.remaining if self._local is not None else self._remaining

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> TieredReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, max_bytes: int = READ_CHUNK) -> bytes:
        """The next chunk of whole, verified frames; ``b""`` when nothing more is committed."""
        for _attempt in range(3):
            if self._local is None:
                chunk = self._read_store(max_bytes)
                if chunk is not None:
                    return chunk
                self._local = self._topic.local.reader(self.next_index, self._end,
                                                       self._remaining)
            local = self._local
            try:
                return local.read(max_bytes)
            except TopicTruncatedError:
                # Local retention deleted what it was about to read: the store has it.
                if local.last_index + 1 >= self._topic.local.first_index \
                        or self._topic.manifest().find(local.last_index + 1) is None:
                    raise
                self._back_to_store(local)
        return b""

    def read_tail(self) -> bytes | memoryview | None:
        """The local reader's tail read (None while reading the store)."""
        return self._local.read_tail() if self._local is not None else None

    def tail_position(self) -> tuple[Segment, int] | None:
        """The local reader's tail position (None while reading the store)."""
        return self._local.tail_position() if self._local is not None else None

    def adopt_tail(self, chunk: TailChunk) -> int:
        """See :meth:`TopicReader.adopt_tail` (only once handed over to the disk)."""
        assert self._local is not None
        return self._local.adopt_tail(chunk)

    # -- the store ----------------------------------------------------------------------

    def _back_to_store(self, local: ReaderView) -> None:
        self._delivered += local.delivered
        self._last_index = local.last_index
        self.next_index = local.last_index + 1
        self._remaining = local.remaining
        self._done = local.done
        self._local = None
        self._object = None

    def _read_store(self, max_bytes: int) -> bytes | None:
        """Frames from the store, ``b""`` when done, None to hand over to the disk."""
        topic = self._topic
        while not self._done:
            if self._object is None:
                local_first = topic.local.first_index
                if local_first and self.next_index >= local_first:
                    return None
                manifest = topic.manifest()
                if manifest.expired and self.next_index <= manifest.expired:
                    raise TopicTruncatedError(topic.id, topic.first_index)
                found = manifest.find(self.next_index)
                if found is None:
                    return None
                self._object, self._position = found, 0
                self._skip = self.next_index > found.first
            obj = self._object
            if self._position >= obj.size or self.next_index > obj.last:
                if self._position >= obj.size and self._last_index < obj.last \
                        and (self._end is None or self._end > obj.last):
                    raise topic.objects.corrupt(obj, f"it ends before index {obj.last}")
                self._object = None
                continue
            return self._read_object(obj, max_bytes)
        return b""

    def _read_object(self, obj: SegmentObject, max_bytes: int) -> bytes:
        objects = self._topic.objects
        try:
            _start, frames = objects.frames(
                obj, self._position, self._last_index, max_bytes,
                skip_below=self.next_index if self._skip else 0, stop_index=self._end,
                max_count=self._remaining)
        except ObjectNotFoundError:
            if obj in self._topic.manifest().objects:
                raise  # recorded and gone: an error, never skipped
            # Total retention dropped it since (and the sweep deleted it): what was deleted.
            raise TopicTruncatedError(self._topic.id, self._topic.first_index) from None
        self._skip = False
        self._position = frames.end
        if frames.count:
            self._delivered += frames.count
            self._last_index = frames.last_index
            self.next_index = frames.last_index + 1
            if self._remaining is not None:
                self._remaining -= frames.count
                self._done = self._remaining <= 0
        if self._end is not None and (self.next_index >= self._end or (
                not frames.count and frames.end < obj.size)):
            self._done = True
        self._prefetch(obj)
        return frames.data

    def _prefetch(self, obj: SegmentObject) -> None:
        """Ask for what a sequential reader reads next: the rest of this object's next
        chunk, or the next object's first."""
        cache = self._topic.objects.cache
        if self._position < obj.size:
            cache.prefetch(self._topic.objects.name(obj), obj.size, self._position + cache.chunk)
            return
        following = self._topic.manifest().find(obj.last + 1)
        if following is not None:
            cache.prefetch(self._topic.objects.name(following), following.size, 0)
