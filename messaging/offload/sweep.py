"""Objects in the store that no manifest records, and manifest entries the store lost.

An object is uploaded, verified, then recorded by a command through the log: a crash (or a
lost race with another uploader, or a deletion that failed) in between leaves an object that
no manifest names. If it could still be recorded (above what the manifest covers) the
uploader records it on its next try, whose conditional PUT finds the same bytes there; if it
never can (at or below what the manifest covers, or of a deleted topic) it is deleted, once it
has been seen so for ``grace`` seconds, so that a sweep never races an upload in flight.

A manifest entry whose object the store no longer lists is an error shown in diagnostics and
metrics (and a read that needs it answers 500 naming it): never skipped silently.
"""

from __future__ import annotations

import logging
import time

from messaging.broker.broker import Broker
from messaging.objects.errors import ObjectNameError, ObjectStoreError
from messaging.objects.naming import parse_object_name
from messaging.objects.store import ObjectStore
from messaging.tiered.metrics import StoreMetrics, error_kind

log = logging.getLogger(__name__)


class Sweep:
    """Finds orphans (and deletes them after ``grace`` seconds) and missing objects."""

    def __init__(self, broker: Broker, store: ObjectStore, metrics: StoreMetrics,
                 grace: float) -> None:
        self.broker = broker
        self.store = store
        self.metrics = metrics
        self.grace = grace
        self.seen: dict[str, float] = {}  # orphan name → when first seen (monotonic)
        self.missing: list[str] = []
        self.last_run: float | None = None  # wall clock, seconds

    def _topics(self) -> list[int]:
        """The topics this broker knows: on disk, or in its table (deleted ones too)."""
        known = self.broker.committed.known_topics()
        return sorted({t.id for t in self.broker.topics()} | set(known))

    def _never_recorded(self, topic: int, last: int) -> bool:
        """Whether an object of ``topic`` ending at ``last`` that no manifest records never
        will be, so it may go: at or below what its manifest covers, of a deleted topic, or
        of a stream's topic this catalog gave out and freed since (deleted, expired: its id
        never comes back). An object of a topic this broker never knew is left alone (of
        another group of the cluster, or of something else that shares the prefix)."""
        if self.broker.committed.freed_stream_topic(topic):
            return True
        entry = self.broker.settings(topic)
        if entry.deleted_at is not None and last <= entry.deleted_at:
            return True
        return last <= entry.manifest.covered

    async def run(self, *, delete: bool) -> list[str]:
        """One sweep; returns the orphans it deleted."""
        listed = {info.name: info.size for info in await self.store.list("")}
        expected: set[str] = set()
        for topic in self._topics():  # after the listing: a record made meanwhile counts
            for obj in self.broker.manifest(topic).objects:
                expected.add(obj.name(topic).name)
                times = obj.times_name(topic)
                if times is not None:
                    expected.add(times.name)
        missing = sorted(expected - listed.keys())
        for name in set(missing) - set(self.missing):
            log.error("object %s in %s is recorded in the manifest but the store does not "
                      "have it: reads that need it fail", name, self.store.url)
        self.missing = missing
        self.metrics.missing_objects.set(len(missing))
        now = time.monotonic()
        doomed = []
        for name in listed.keys() - expected:
            try:
                parsed = parse_object_name(name)
            except ObjectNameError:
                continue  # not ours: left alone
            if not self._never_recorded(parsed.topic, parsed.last_index):
                continue  # may still be recorded (the uploader's next try), or not ours
            first_seen = self.seen.setdefault(name, now)
            if delete and now - first_seen >= self.grace:
                doomed.append(name)
        for name in set(self.seen) - listed.keys():
            del self.seen[name]
        deleted_now = []
        for name in sorted(doomed):
            try:
                await self.store.delete(name)
            except ObjectStoreError as err:
                self.metrics.error("delete", error_kind(err))
                continue
            self.seen.pop(name, None)
            self.metrics.deleted_objects.inc()
            deleted_now.append(name)
            log.info("deleted %s from %s: no manifest records it and none ever will",
                     name, self.store.url)
        self.last_run = time.time()
        return deleted_now
