"""Retention and expiry: the one place that decides which of a topic's data may be deleted.

:class:`Retention` reads the committed state (:class:`~messaging.broker.state.CommittedState`:
a topic's own settings, its manifest, the positions live subscribers hold) and the topics'
files, and deletes whole old segments: by size (``max-topic-size``), by age
(``retention-age``, from the append time of a segment's newest message), never past what a
live subscriber still needs. With an object store, local copies go only once they are in
the store (by ``--local-retention-size``/``-age``), and total retention is decided here
(:meth:`Retention.expiry`) but carried out as a command through the log, so every node and
the manifest agree.

Threads: a run is blocking file work. It runs on the service's own thread
(:meth:`Retention.run_now`), or on the caller's thread for the blocking methods; whoever runs
it holds :attr:`Retention.lock` for one topic at a time. The broker's writer thread takes
the same lock to delete topics' files or swap them for a snapshot's, and :meth:`close` takes
it to stop: a topic is never truncated while its directory is being deleted, or after it
was, and neither side waits for more than one topic's truncation.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from messaging.broker.metrics import BrokerMetrics
from messaging.broker.state import CommittedState
from messaging.broker.topic_settings import MAX_TOPIC_SIZE, RETENTION_AGE
from messaging.clock import now_ms
from messaging.topic.store import TopicStore
from messaging.topic.topic import Topic


@dataclass(slots=True)
class RetentionLimits:
    """The broker-wide limits (a topic's own settings override the first two); each run
    reads them afresh."""

    max_topic_size: int
    retention_age: float | None = None  # seconds; None: off
    #: With an object store: how much of what is in it stays on the disk too (None: as much
    #: as the total retention keeps; seconds for the age).
    local_retention_size: int | None = None
    local_retention_age: float | None = None


class Retention:
    """Deletes old segments of a broker's topics (see the module docstring)."""

    def __init__(self, store: TopicStore, state: CommittedState, limits: RetentionLimits,
                 metrics: BrokerMetrics, *, tiered: bool = False) -> None:
        self.store = store
        self.state = state
        self.limits = limits
        self.metrics = metrics
        #: Whether the broker has an object store (local copies then wait for the store).
        self.tiered = tiered
        #: What ages are measured against (ms since the epoch): this node's clock, or in a
        #: cluster the log's time, so that every holder deletes the same segments.
        self.clock: Callable[[], int] = now_ms
        #: Held by a run for one topic at a time, by the writer thread while it deletes or
        #: swaps topics' files (:meth:`exclusive`), and by :meth:`close`.
        self.lock = threading.Lock()
        self._closing = False
        self._thread: ThreadPoolExecutor | None = None

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No truncation while the caller (the writer thread) changes topics' directories."""
        with self.lock:
            yield

    def close(self) -> None:
        """Wait for a running truncation and stop: later runs delete nothing."""
        with self.lock:
            self._closing = True
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=False)

    async def run_now(self) -> int:
        """Run retention on every topic, on the service's own thread (one run at a time);
        the bytes deleted (0 once closed)."""
        if self._closing:
            return 0
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="messaging-retention")
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.run)

    def floor(self, topic_id: int, now: float | None = None) -> int:
        """The highest index retention may delete through for ``topic_id``: the smallest
        index a live subscriber heartbeated; unlimited with no live subscriber."""
        return self.state.retention_floor(topic_id, now)

    def run(self, now: float | None = None, wall_ms: int | None = None) -> int:
        """Delete old segments of every topic over its max-topic-size (its own setting, else
        the broker's), and those whose newest message is older than its retention-age (its
        own, else the broker's); returns bytes deleted. ``now`` (monotonic) is when
        subscribers are judged live, ``wall_ms`` the wall clock ages are measured from
        (defaults: the clocks now). Blocking."""
        deleted = 0
        for topic in self.store.all():
            freed = self._retain(topic, now, wall_ms)
            if freed is None:
                break
            deleted += freed
        return deleted

    def trim(self, topic_ids: Iterable[int]) -> int:
        """Run retention now on the given topics (with an object store: those whose
        manifest just grew, so local copies go as soon as they are in the store rather than
        at the next timed run); bytes deleted. Blocking."""
        deleted = 0
        for topic_id in topic_ids:
            topic = self.store.get(topic_id)
            freed = self._retain(topic, None, None) if topic is not None else 0
            if freed is None:
                break
            deleted += freed
        return deleted

    def _retain(self, topic: Topic, now: float | None, wall_ms: int | None) -> int | None:
        """Retention of one topic under the lock; bytes deleted (None: closing)."""
        with self.lock:
            if self._closing:
                return None
            if self.store.get(topic.id) is not topic:
                return 0  # deleted (or replaced by a snapshot) since the list was made
            settings = self.state.settings(topic.id).settings
            limit = settings.get(MAX_TOPIC_SIZE, self.limits.max_topic_size)
            older_than = self._age_limit(settings, wall_ms)
            before = topic.stats.deleted_segments
            if self.tiered:
                freed = self._truncate_local(topic, limit, older_than, wall_ms)
            elif topic.size <= limit and older_than is None:
                return 0
            else:
                freed = topic.truncate(limit, self.floor(topic.id, now), older_than)
        self.metrics.retention_deleted_bytes.inc(freed)
        self.metrics.retention_deleted_segments.inc(topic.stats.deleted_segments - before)
        return freed

    def _truncate_local(self, topic: Topic, limit: int, older_than: int | None,
                        wall_ms: int | None) -> int:
        """Retention of a topic's local copies with an object store: whatever total
        retention expired goes, and of the segments in the store (recorded in the manifest,
        so verified there) the oldest go while the disk holds more than the local limits.
        A segment not in the store never goes here, whatever the limits say: when the store
        fails, the disk fills instead (see :meth:`expiry` for total retention)."""
        manifest = self.state.manifest(topic.id)
        freed = topic.truncate(0, manifest.expired) if manifest.expired else 0
        if not manifest.offloaded:
            return freed
        limits = self.limits
        size = limit if limits.local_retention_size is None else limits.local_retention_size
        local_older = older_than
        if limits.local_retention_age is not None:
            local_older = ((now_ms() if wall_ms is None else wall_ms)
                           - round(limits.local_retention_age * 1000))
        return freed + topic.truncate(size, manifest.covered, local_older)

    def expiry(self, topic_id: int, now: float | None = None, wall_ms: int | None = None,
               ) -> int:
        """With an object store: the index through which total retention drops a topic
        (its objects first, then local segments not in the store), or 0 for nothing new.

        Total size is the store's objects plus the local segments above them; the oldest
        go while it is above max-topic-size, and everything up to the last piece whose
        newest message is older than retention-age; never past what a live subscriber or a
        stored consumer position still needs. The offloading node turns it into a command
        through the log, so every node and the manifest agree. Blocking."""
        topic = self.store.get(topic_id)
        if topic is None:
            return 0
        manifest = self.state.manifest(topic_id)
        settings = self.state.settings(topic_id).settings
        limit = settings.get(MAX_TOPIC_SIZE, self.limits.max_topic_size)
        older_than = self._age_limit(settings, wall_ms)
        floor = self.floor(topic_id, now)
        pieces = [(o.last, o.size, o.last_time) for o in manifest.objects]
        segments = topic.segments()
        for segment in segments[:-1]:
            topic.ensure_indexed(segment)
            if segment.committed_last_index > manifest.covered and segment.committed_count:
                pieces.append((segment.committed_last_index, segment.size,
                               segment.last_time()))
        total = sum(size for _last, size, _time in pieces) + (
            segments[-1].size if segments else 0)
        aged = 0
        if older_than is not None:
            for k, (_last, _size, newest) in enumerate(pieces):
                if newest is not None:
                    if newest >= older_than:
                        break
                    aged = k + 1
        through = 0
        for k, (last, size, _newest) in enumerate(pieces):
            if (total <= limit and k >= aged) or last > floor:
                break
            through = last
            total -= size
        return through if through > manifest.expired else 0

    def _age_limit(self, settings: Mapping[str, int | None], wall_ms: int | None,
                   ) -> int | None:
        """The append time (ms) before which a topic's segments are old enough to delete
        (None: no age limit). A topic's ``retention-age`` is in ms, 0 meaning off."""
        age_ms = settings.get(RETENTION_AGE)
        if age_ms is None and self.limits.retention_age is not None:
            age_ms = round(self.limits.retention_age * 1000)
        if not age_ms:
            return None
        return (self.clock() if wall_ms is None else wall_ms) - age_ms
