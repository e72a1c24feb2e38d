"""The offload loop of one broker: upload rolled segments, record them, apply total retention
to the store, sweep.

Only the node chosen to upload for its log does the work (``is_uploader``: the first live node
of a single log, the first holder of a topic group); every other node learns the result
through the log, since the manifest changes only by commands. Two nodes that both believe
they are chosen for a moment do no harm: an upload is a conditional PUT of the same bytes
under the same name, and a record is accepted only as the segment right after what the
manifest covers (``after``), so the second is ignored and its object is the same one.

A segment is uploaded once rolled and committed (fsynced again here, whatever ``--fsync``
says), then verified by reading it back (size and SHA-256); only then is it recorded, and
only once recorded may local retention delete the local copy. A store that fails stops none
of that from being safe: uploads are retried with exponential backoff and jitter per topic,
nothing is deleted locally meanwhile, and the backlog grows where the metrics show it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from messaging.aio import cancel_and_wait
from messaging.broker.broker import Broker
from messaging.broker.commands import ApplyResult
from messaging.broker.topic_settings import expire_command, offload_command
from messaging.clock import now_ms
from messaging.errors import MessagingError
from messaging.frames import scan
from messaging.objects.checksum import Digest, digest_bytes
from messaging.objects.errors import ObjectStoreError
from messaging.objects.naming import TIMES_KIND, SegmentObjectName, name_segment_object
from messaging.objects.store import ObjectStore
from messaging.offload.candidates import Candidate, candidates
from messaging.offload.sweep import Sweep
from messaging.quiet_log import QuietLog
from messaging.tiered.cache import ObjectCache
from messaging.tiered.manifest import SegmentObject
from messaging.tiered.metrics import StoreMetrics, error_kind

log = logging.getLogger(__name__)

#: Seconds between two passes of the loop.
INTERVAL = 1.0
#: Backoff of a topic whose upload failed: from the first delay, doubling, up to the last.
FIRST_BACKOFF, MAX_BACKOFF = 1.0, 60.0
#: Seconds between two log lines about the same kind of failure.
_LOG_INTERVAL = 30.0

Apply = Callable[[bytes], Awaitable[ApplyResult]]


class DamagedSegmentError(MessagingError):
    """A segment's frames are not what its index says (a CRC or an index out of place): it
    is never uploaded, so its local copy is never deleted for an object of bad bytes."""


def _check_segment(candidate: Candidate) -> Digest:
    """fsync the segment file and verify every frame of it (CRC, indexes in order within
    its range, the count committed): the store must get what readers got, never a disk's
    damage made durable (a recorded object lets every node delete its own copy). Returns
    the digest of the bytes checked (the file read once for both)."""
    fd = os.open(candidate.path, os.O_RDONLY)
    try:
        os.fsync(fd)
        data = os.pread(fd, candidate.size + 1, 0)
    finally:
        os.close(fd)
    found = scan(data, after=candidate.first - 1)
    problem = None
    if found.error is not None:
        problem = str(found.error)
    elif len(data) != candidate.size or found.end != candidate.size:
        problem = (f"{len(data)} bytes on disk, {found.end} of whole frames, "
                   f"{candidate.size} committed")
    elif found.count != candidate.count or found.first_index != candidate.first \
            or found.last_index != candidate.last:
        problem = (f"{found.count} frames {found.first_index}-{found.last_index}, not "
                   f"{candidate.count} frames {candidate.first}-{candidate.last}")
    if problem is not None:
        raise DamagedSegmentError(f"topic {candidate.topic}: segment {candidate.path.name} is "
                                  f"damaged ({problem}): not uploaded; its topic's later "
                                  "segments wait, and its local copy stays")
    return digest_bytes(data)


class Offloader:
    """Uploads, records, expires and sweeps for one broker and its log."""

    def __init__(self, broker: Broker, apply: Apply, store: ObjectStore, cache: ObjectCache,
                 metrics: StoreMetrics, is_uploader: Callable[[], bool], *,
                 concurrency: int = 4, sweep_grace: float = 600.0,
                 sweep_interval: float = 60.0, interval: float = INTERVAL) -> None:
        self.broker = broker
        self.apply = apply
        self.store = store
        self.cache = cache
        self.metrics = metrics
        self.is_uploader = is_uploader
        self.interval = interval
        self.sweep = Sweep(broker, store, metrics, sweep_grace)
        #: The sweep runs this often (more often when its grace is shorter).
        self.sweep_interval = min(sweep_interval, max(sweep_grace / 2, INTERVAL))
        self.concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._retry_at: dict[int, float] = {}  # topic → monotonic time of its next try
        self._failures: dict[int, int] = {}  # topic → failed tries in a row
        self._next_sweep = 0.0
        self._task: asyncio.Task[None] | None = None
        self._quiet = QuietLog(log, _LOG_INTERVAL)
        self.backlog: list[Candidate] = []
        self._trimmed: dict[int, int] = {}  # topic → what its manifest covered at the last trim
        self.last_error: str | None = None
        self.last_error_at: float | None = None  # wall clock, seconds

    async def start(self) -> None:
        """Start the loop."""
        self._task = asyncio.create_task(self._run(), name="messaging-offload")

    async def close(self) -> None:
        """Stop the loop (an upload in flight is abandoned; its object, if made, is found
        again by the next upload or the sweep)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception as err:  # a bug, or the broker closing: logged, tried again
                self._quiet.log("offload", logging.ERROR, "offload pass failed: %s", err,
                                exc_info=not isinstance(err, MessagingError))
            await asyncio.sleep(self.interval)

    async def step(self) -> None:
        """One pass: the backlog, then (when chosen) uploads, total retention and sweep."""
        found = await asyncio.to_thread(self._find_backlog)
        self.backlog = [c for group in found for c in group]
        self._export_backlog()
        if not self.is_uploader():
            return
        now = time.monotonic()
        due = [group for group in found
               if group and self._retry_at.get(group[0].topic, 0.0) <= now]
        await asyncio.gather(*(self._offload_topic(group) for group in due))
        await self._expire()
        if now >= self._next_sweep:
            self._next_sweep = now + self.sweep_interval
            try:
                await self.sweep.run(delete=True)
            except ObjectStoreError as err:
                self._failed("list", err)

    def _find_backlog(self) -> list[list[Candidate]]:
        """Every topic's segments waiting for upload (a thread: may index segments); first,
        local retention on the topics whose manifest grew since the last pass (on every
        node: each learns of new objects through the log), so local copies go as soon as
        their objects are recorded."""
        grown = []
        for topic in self.broker.topics():
            covered = self.broker.manifest(topic.id).covered
            if covered > self._trimmed.get(topic.id, 0):
                self._trimmed[topic.id] = covered
                grown.append(topic.id)
        if grown:
            self.broker.retention.trim(grown)
        found = []
        for topic in self.broker.topics():
            try:
                group = candidates(topic, self.broker.manifest(topic.id))
            except (MessagingError, OSError):  # deleted or damaged meanwhile: next pass
                continue
            if group:
                found.append(group)
        return found

    def _export_backlog(self) -> None:
        backlog = self.backlog
        self.metrics.backlog_segments.set(len(backlog))
        self.metrics.backlog_bytes.set(sum(c.size for c in backlog))
        times = [c.last_time for c in backlog if c.last_time is not None]
        self.metrics.backlog_oldest_seconds.set(
            max(0.0, (now_ms() - min(times)) / 1000) if times else 0.0)

    # -- uploads ------------------------------------------------------------------------

    async def _offload_topic(self, group: list[Candidate]) -> None:
        """Upload a topic's waiting segments ``concurrency`` at a time, recording each batch
        in order, each as the segment right after the one before it."""
        for start in range(0, len(group), self.concurrency):
            if not await self._offload_batch(group[start:start + self.concurrency]):
                return

    async def _offload_batch(self, batch: list[Candidate]) -> bool:
        """Upload segments of one topic at once, then record them in order; whether all
        were recorded."""
        topic = batch[0].topic
        uploaded = await asyncio.gather(*(self._upload(c) for c in batch),
                                        return_exceptions=True)
        for candidate, result in zip(batch, uploaded, strict=True):
            if isinstance(result, ObjectStoreError | OSError | DamagedSegmentError):
                self._back_off(topic, result)
                return False
            if isinstance(result, BaseException):
                raise result
            try:
                recorded = await self._record(candidate, result)
            except MessagingError as err:  # the log did not take the record: next pass
                self._quiet.log(f"record {topic}", logging.WARNING, "topic %d: could not "
                                "record segment %d-%d in the manifest: %s", topic,
                                candidate.first, candidate.last, err)
                return False
            if not recorded:
                return False  # the manifest moved on meanwhile: the next pass looks again
            self._failures.pop(topic, None)
            self._retry_at.pop(topic, None)
        return True

    async def _upload(self, candidate: Candidate) -> SegmentObject:
        """Upload and verify one segment and its time index; their manifest entry."""
        async with self._slots:
            digest = await asyncio.to_thread(_check_segment, candidate)
            named = SegmentObjectName(candidate.topic, candidate.first, candidate.last,
                                      digest.sha256)
            await self.store.put_if_absent(named.name, candidate.path, sha256=digest.sha256)
            times_sha256, times_size = None, 0
            if candidate.times_path is not None:
                times_named, times_digest = await name_segment_object(
                    candidate.topic, candidate.first, candidate.last, candidate.times_path,
                    TIMES_KIND)
                await self.store.put_if_absent(times_named.name, candidate.times_path,
                                               sha256=times_digest.sha256)
                times_sha256, times_size = times_digest.sha256, times_digest.size
        return SegmentObject(candidate.first, candidate.last, digest.size, candidate.count,
                             digest.sha256, times_sha256, times_size, candidate.last_time,
                             candidate.marks)

    async def _record(self, candidate: Candidate, obj: SegmentObject) -> bool:
        """Record an uploaded segment through the log; whether the manifest holds it now."""
        await self.apply(offload_command(candidate.topic, obj, candidate.after))
        recorded = obj in self.broker.manifest(candidate.topic).objects
        if recorded:
            self.metrics.uploaded_segments.inc()
            self.metrics.uploaded_bytes.inc(obj.size + obj.times_size)
            log.info("topic %d: segment %d-%d (%d bytes) is in %s as %s", candidate.topic,
                     candidate.first, candidate.last, obj.size, self.store.url,
                     obj.name(candidate.topic).name)
        return recorded

    def _back_off(self, topic: int, error: Exception) -> None:
        failures = self._failures.get(topic, 0) + 1
        self._failures[topic] = failures
        delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (failures - 1))
        delay *= random.uniform(0.5, 1.5)
        self._retry_at[topic] = time.monotonic() + delay
        self._failed("upload", error, f"topic {topic}: upload failed (try {failures}, next "
                     f"in {delay:.1f} s)")

    def _failed(self, operation: str, error: Exception, what: str = "") -> None:
        damaged = isinstance(error, DamagedSegmentError)
        kind = "damaged_segment" if damaged else error_kind(error)
        self.metrics.error(operation, kind)
        self.last_error = f"{what + ': ' if what else ''}{error}"
        self.last_error_at = time.time()
        self._quiet.log(f"{operation} {kind}", logging.ERROR if damaged else logging.WARNING,
                        "%s", self.last_error)

    # -- total retention in the store ---------------------------------------------------

    async def _expire(self) -> None:
        """Drop, through the log, what total retention deletes of topics with objects. The
        objects it dropped stay in the store until the sweep's grace has passed: a reader
        in the middle of one (here, or on a node that has not applied the command yet)
        finishes it rather than finding it gone."""
        for topic in self.broker.topics():
            try:
                through = await asyncio.to_thread(self.broker.retention.expiry, topic.id)
            except (MessagingError, OSError) as err:  # deleted or damaged meanwhile
                self._quiet.log(f"expiry {topic.id}", logging.WARNING, "topic %d: total "
                                "retention skipped this pass: %s", topic.id, err)
                continue
            if not through:
                continue
            before = self.broker.manifest(topic.id)
            try:
                await self.apply(expire_command(topic.id, through))
            except MessagingError as err:
                self._quiet.log(f"expire {topic.id}", logging.WARNING, "topic %d: could not "
                                "expire through %d: %s", topic.id, through, err)
                continue
            dropped = before.dropped(self.broker.manifest(topic.id))
            log.info("topic %d: total retention dropped everything through index %d (%d "
                     "objects, deleted from the store by the sweep after %g s)", topic.id,
                     through, len(dropped), self.sweep.grace)

    # -- diagnostics --------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What diagnostics show of the object store."""
        backlog = self.backlog
        times = [c.last_time for c in backlog if c.last_time is not None]
        return {
            "url": self.store.url,
            "uploader": self.is_uploader(),
            "backlog": {"segments": len(backlog), "bytes": sum(c.size for c in backlog),
                        "oldest_age_s": round((now_ms() - min(times)) / 1000, 3)
                        if times else None},
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "retrying_topics": sorted(self._retry_at),
            "cache": {"bytes": self.cache.size, "max_bytes": self.cache.max_bytes},
            "missing_objects": list(self.sweep.missing),
            "orphans_waiting": len(self.sweep.seen),
            "last_sweep_at": self.sweep.last_run,
        }
