"""The watch of etcd's command log that feeds a node: one key watch, supervised.

The key watch runs on the node's watch stream to that etcd cluster, which it shares with the
logs of the other topic groups the node holds there
(:class:`~messaging.log.etcd.watch_stream.WatchStream`). One watch of the log key runs at a
time, from the revision after the last one received (or
after a stretch a quorum read saw empty). Each revision it brings is delivered to the apply
side (:meth:`messaging.log.etcd.apply.Applier.deliver`), whose full queue holds the watch
back. The watch is this node's lifeline: when it fails in any way but cancellation, the failure is
logged and the watch restarts, with a short back-off (a failed stream is opened again on the
next endpoint). The node's monitor cancels an attempt that is stuck (:func:`watch_stuck`):
the log moved on and the watch brought nothing for WATCH_STUCK seconds; its stream is then
restarted on the next endpoint, since a stuck watch means a stuck stream. When etcd
compacted the revision the watch needs, ``on_compacted`` (a snapshot install from a peer)
brings the node past it.

Everything here runs on the event loop: :class:`LogWatch` and its fields belong to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from messaging.aio import cancel_and_wait
from messaging.log.etcd.apply import Revision
from messaging.log.etcd.client import CompactedError, describe
from messaging.log.etcd.progress import Progress
from messaging.log.etcd.startup import Startup
from messaging.log.etcd.watch_stream import FellBehind, WatchStream

log = logging.getLogger(__name__)

#: The log moved on but the watch brought nothing for this long: restart the watch. The
#: time counts from the latest of the watch's last event, the start of its current attempt
#: and the moment this node first saw the log ahead of it (an idle watch is not a stuck one).
WATCH_STUCK = 3.0
_EVENT_PUT = 0


def watch_stuck(now: float, behind_since: float, last_event: float,
                attempt_started: float) -> bool:
    """Whether a watch attempt is stuck: the log has been ahead of it, with no event and no new
    attempt, for more than WATCH_STUCK seconds. A watch idle for long is judged from when the
    log moved on, and each attempt from its own start, so a fresh attempt gets a fair deadline.
    """
    return now - max(behind_since, last_event, attempt_started) > WATCH_STUCK


class LogWatch:
    """The supervised watch of one log key (on the loop).

    ``deliver`` takes each new revision (in order, each once); ``on_compacted`` is called
    with etcd's compaction revision when the next revision is gone, and returns the revision
    through which the node has caught up meanwhile (a snapshot install).
    """

    def __init__(self, streams: WatchStream, log_key: bytes, progress: Progress,
                 deliver: Callable[[Revision], None], room: Callable[[], Awaitable[None]],
                 on_compacted: Callable[[int], Awaitable[int]], startup: Startup) -> None:
        self.streams = streams
        self._log_key = log_key
        self._room = room
        self._progress = progress
        self._deliver = deliver
        self._on_compacted = on_compacted
        self._startup = startup
        #: The last revision delivered (or caught up to by an install).
        self.received = 0
        #: Whether the current attempt's stream is open and created by etcd.
        self.live = False
        #: Why the watch last failed (None once an attempt is live again).
        self.error: str | None = None
        self._attempt: asyncio.Task[None] | None = None
        self._event_at = 0.0
        self._attempt_at = 0.0
        self._behind_since: float | None = None
        self._restarts = 0
        self._from = 0
        self._reading = False  # the attempt waits on its stream (not on the apply queue)
        self._holding = False  # the attempt waits for room in the apply queue
        self._generation = 0  # the stream the attempt's watch runs on
        self._stuck_on: int | None = None  # the stream of an attempt judged stuck reading
        self._install_after: int | None = None  # install a snapshot at or after this

    def diagnostics(self) -> dict[str, Any]:
        """Whether the watch is live, from where, on which endpoint, how recent its last
        event is, how often it restarted, and why it last failed."""
        return {
            "live": self.live,
            "from_revision": self._from,
            "endpoint": self.streams.endpoint_url(),
            "last_event_age": (round(time.monotonic() - self._event_at, 3)
                               if self._event_at else None),
            "restarts": self._restarts,
            "error": self.error,
        }

    def restart_if_stuck(self, now: float, log_revision: int) -> None:
        """Cancel the current attempt if the log (last written at ``log_revision``) has been
        ahead of what it brought for WATCH_STUCK seconds of this attempt, with no event
        meanwhile: :meth:`run` restarts it, and its stream on the next endpoint when it was
        waiting on the stream. An attempt held back by a full apply queue is not stuck."""
        if self._attempt is None or log_revision <= self.received or self._holding:
            self._behind_since = None
            return
        if self._behind_since is None:
            self._behind_since = now
        if watch_stuck(now, self._behind_since, self._event_at, self._attempt_at):
            self._stuck_on = self._generation if self._reading else None
            self._attempt.cancel()

    def install_now(self, revision: int) -> None:
        """Catch up from a peer's snapshot at or after ``revision`` instead of waiting for
        it to apply: etcd's history is compacted past it and this node cannot apply it (an
        intake object it cannot fetch may be gone for good). The current attempt stops;
        :meth:`run` installs, then watches on from the snapshot."""
        attempt = self._attempt
        if attempt is not None and not attempt.done() and self._install_after is None:
            self._install_after = revision
            attempt.cancel()

    async def run(self) -> None:
        """Keep one watch running; anything but cancellation restarts it on the next endpoint."""
        failures = 0
        while True:
            attempt = asyncio.create_task(self._watch_once(), name="messaging-etcd-watch-once")
            self._attempt = attempt
            self._attempt_at = time.monotonic()
            try:
                await asyncio.wait([attempt])
            except asyncio.CancelledError:
                await cancel_and_wait(attempt)
                raise
            finally:
                self.live = False
                self._attempt = None
            error: BaseException | None
            install_after, self._install_after = self._install_after, None
            if attempt.cancelled() and install_after is not None:
                error = CompactedError(install_after)
            elif attempt.cancelled():
                error = TimeoutError(f"no event for {WATCH_STUCK:.0f}s while etcd's log moved "
                                     "on")
                if self._stuck_on is not None:
                    self.streams.restart(f"the watch of {self._log_key.decode()} is stuck: "
                                         f"{error}", self._stuck_on)
                self._stuck_on = None
            else:
                error = attempt.exception()
            if isinstance(error, CompactedError):
                log.warning("etcd compacted the log through revision %d, past this node's "
                            "revision %d: installing a snapshot from a peer",
                            error.compact_revision, self.received)
                self.error = f"revision {self.received + 1} compacted: installing a snapshot"
                self.received = await self._on_compacted(error.compact_revision)
                failures = 0
                continue
            reason = describe(error) if error is not None else "stream ended"
            self.error = reason
            self._restarts += 1
            # Every restart is logged: a watch that keeps failing over must show in the log
            # (at INFO while the node starts: etcd may be starting too; and when its apply
            # fell behind the stream, as it may while catching up).
            level = logging.INFO if isinstance(error, FellBehind) else self._startup.level()
            log.log(level, "watch of %s failed (%s); restarting from "
                    "revision %d on %s (restart %d)", self._log_key.decode(), reason,
                    self.received + 1, self.streams.endpoint_url(), self._restarts)
            if self._event_at and time.monotonic() - self._event_at < 1.0:
                failures = 0
            await asyncio.sleep(min(0.1 * 2 ** failures, 1.0))
            failures += 1

    async def _watch_once(self) -> None:
        start = await self._start_revision()
        self._from = start
        watch = await self.streams.open(self._log_key, start)
        self._generation = watch.generation
        try:
            while True:
                self._reading = True
                try:
                    response = await anext(watch)
                except StopAsyncIteration:
                    break
                finally:
                    self._reading = False
                self._event_at = time.monotonic()
                if response.created:
                    self._now_live(start)
                for event in response.events:
                    revision = int(event.kv.mod_revision)
                    if event.type != _EVENT_PUT or revision <= self.received:
                        continue
                    self._deliver(Revision(revision, bytes(event.kv.value), time.monotonic()))
                    self.received = revision  # queued: never delivered twice
                    self._holding = True
                    try:
                        await self._room()
                    finally:
                        self._holding = False
                    self._event_at = time.monotonic()  # a full queue is not a stuck watch
        finally:
            watch.close()
        raise ConnectionError("watch ended")

    def _now_live(self, start: int) -> None:
        self.live = True
        self.error = None
        log.info("watching %s from revision %d on %s", self._log_key.decode(), start,
                 self.streams.endpoint_url())

    async def _start_revision(self) -> int:
        """The revision to watch from: after what was received, skipping log-free history."""
        start = max(self.received, self._progress.idle_covered) + 1
        endpoint = self.streams.endpoint
        try:
            response = await self.streams.client.get(self._log_key, keys_only=True,
                                                     endpoint=endpoint)
        except grpc.aio.AioRpcError:
            self.streams.endpoint_failed(endpoint)  # the next attempt tries the next one
            raise
        head = int(response.header.revision)
        if not response.kvs:
            return max(start, head + 1)
        kv = response.kvs[0]
        if kv.mod_revision < start:
            return max(start, head + 1)  # no entry after what this node has
        if self.received == 0:
            return max(start, int(kv.create_revision))  # a new node: from the log's first entry
        return start
