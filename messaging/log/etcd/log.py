"""EtcdLog: the Log protocol on etcd. The command log is the revision history of one key.

Every key lives under ``/messaging/<cluster>/``: ``log`` (the command log) and
``nodes/<advertise URL>`` (membership, bound to a lease).

- Writes (:mod:`messaging.log.etcd.writer`): any node takes them. Concurrent commands are
  group-committed into one put of the log key (at most about 1 MiB); several puts may be in
  flight. A publisher is answered once *this* node has applied the revision its put created
  (fsynced under ``--fsync always``). A put that may have left is never resent: only one
  refused before it was sent moves on to the next endpoint.
- Apply: one supervised watch of the log key from the last revision received; each revision is
  decoded into its commands and applied in revision order by ``Broker.write_group`` on one
  writer thread, so every node assigns the same indexes and writes the same segment files.
- Checkpoint: ``DATA/cluster.json`` holds the revision through which every log entry is
  durable here and the broker index after it; written only after that data is fsynced. A
  restart replays from it: replay reassigns identical indexes and topics skip stale frames.
- Membership (:mod:`messaging.log.etcd.membership`): each node registers ``{url,
  durable_revision}`` under a lease; the first live node (by URL) compacts etcd below the
  smallest durable revision of every registered node.
- A node whose next revision was compacted installs a snapshot fetched from a live peer
  (verified, staged, renamed over its topics, never merged) and watches on from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from messaging.aio import cancel_and_wait
from messaging.broker.broker import Broker
from messaging.broker.commands import ApplyResult
from messaging.broker.snapshot import FORMAT, SnapshotStream
from messaging.config import FSYNC_MODES, EtcdSettings, FsyncMode
from messaging.errors import (
    BrokerClosedError,
    ClusterUnavailableError,
    CommitUnknownError,
    DataDirectoryError,
    MessagingError,
    StorageError,
    StorageFailedError,
)
from messaging.files import read_json, write_json_atomic
from messaging.log.etcd.budget import DEFAULT_WINDOW
from messaging.log.etcd.client import (
    CompactedError,
    EtcdClient,
    describe,
    load_credentials,
)
from messaging.log.etcd.membership import Membership
from messaging.log.etcd.snapshot_fetch import fetch_snapshot
from messaging.log.etcd.startup import Startup
from messaging.log.etcd.writer import ApplyTiming, LogWriter, decode_entry
from messaging.log.local import DeferredSync
from messaging.quiet_log import RECURRING_LOG_INTERVAL, QuietLog

log = logging.getLogger(__name__)

__all__ = ["CHECKPOINT", "EtcdLog", "EtcdSettings"]

CHECKPOINT = "cluster.json"
APPLY_BATCH_BYTES = 32 << 20
CHECKPOINT_REVISIONS = 100
CHECKPOINT_INTERVAL = 1.0
MONITOR_INTERVAL = 0.5
MEMBERSHIP_INTERVAL = 1.0
#: A checkpoint that only records log-free revisions (nothing applied) waits this long.
IDLE_CHECKPOINT_INTERVAL = 10.0
#: The log moved on but the watch brought nothing for this long: restart the watch. The
#: time counts from the latest of the watch's last event, the start of its current attempt
#: and the moment this node first saw the log ahead of it (an idle watch is not a stuck one).
WATCH_STUCK = 3.0
CLOSE_GRACE = 5.0
_EVENT_PUT = 0


@dataclass(frozen=True, slots=True)
class _Revision:
    revision: int
    value: bytes
    received: float  # when the watch delivered it (time.monotonic)


class _GroupFailed(Exception):
    """Nothing of a batch of revisions was applied (local disk trouble): try it again."""


class _Diverged(Exception):
    """Part of a batch applied and part failed locally: this node can no longer follow."""


@dataclass(slots=True)
class _Applied:
    spans: list[tuple[_Revision, bytes, int, int, int]]  # node, seq, first command, count
    results: list[ApplyResult | MessagingError]
    touched: set[int]
    started: float  # time.monotonic, on the writer thread
    finished: float


def watch_stuck(now: float, behind_since: float, last_event: float,
                attempt_started: float) -> bool:
    """Whether a watch attempt is stuck: the log has been ahead of it, with no event and no new
    attempt, for more than WATCH_STUCK seconds. A watch idle for long is judged from when the
    log moved on, and each attempt from its own start, so a fresh attempt gets a fair deadline.
    """
    return now - max(behind_since, last_event, attempt_started) > WATCH_STUCK


class EtcdLog:
    """The Log protocol over etcd: every node accepts writes and applies the same log."""

    def __init__(self, broker: Broker, url: str, settings: EtcdSettings,
                 fsync: FsyncMode = "always", *, peer_token: str | None = None,
                 peer_ca: str | None = None) -> None:
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_MODES)}")
        self.broker = broker
        self.url = url
        self.settings = settings
        self.cluster = settings.cluster
        self.fsync = fsync
        self.peer_token = peer_token  # peers that require tokens serve snapshots to admins
        self.peer_ca = peer_ca
        prefix = f"/messaging/{settings.cluster}/".encode()
        self._log_key = prefix + b"log"
        self._checkpoint_path = broker.path / CHECKPOINT
        self._client = EtcdClient(settings)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="messaging-writer")
        self._unsynced = DeferredSync(broker)
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._startup = Startup(log, self._log_key.decode())
        self._writes = LogWriter(self._client, self._log_key, os.urandom(8),
                                 self._quorum_read, broker.settled_result,
                                 startup=self._startup)
        # apply: the applied fields below are written on the writer thread, except that the
        # loop's quorum reads raise ``_idle_covered``; both sides touch the three under
        # ``_progress_lock`` (held for a few assignments, never across I/O).
        self._progress_lock = threading.Lock()
        self._queue: asyncio.Queue[_Revision] = asyncio.Queue(maxsize=64)
        self._received = 0
        self._applied = 0
        self._applied_index = 0
        self._idle_covered = 0  # no log entry in (applied, this]: seen by a quorum read
        self._checkpointed = 0
        self._checkpoint_at = 0.0
        self._since_checkpoint = 0
        self._apply_error: str | None = None
        self._failure: MessagingError | None = None
        # watch
        self._watch_endpoint = 0
        self._watch_attempt: asyncio.Task[None] | None = None
        self._watch_live = False
        self._watch_event_at = 0.0
        self._watch_attempt_at = 0.0
        self._behind_since: float | None = None
        self._watch_restarts = 0
        self._watch_error: str | None = None
        self._watch_from = 0
        self._etcd_revision = 0  # as of the last quorum read
        self._log_revision = 0  # the log key's last revision, as of the last quorum read
        self._quorum_reads = 0  # quorum reads answered since start
        self._membership = Membership(self._client, self.cluster, url,
                                      self._durable_revision, settings.compact_every)
        self.snapshots_installed = 0
        self._quiet = QuietLog(log, RECURRING_LOG_INTERVAL)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the checkpoint, then start writing, watching, monitoring and registering."""
        loop = asyncio.get_running_loop()
        try:
            credentials, checkpoint = await loop.run_in_executor(self._writer, self._load)
        except BaseException:
            await loop.run_in_executor(None, self._writer.shutdown)
            raise
        self._client = EtcdClient(self.settings, credentials)
        self._membership.client = self._writes.client = self._client
        revision = int(checkpoint["revision"])
        self._received = self._applied = self._checkpointed = revision
        self._applied_index = self.broker.index = int(checkpoint["index"])
        # The broker's time as of that revision: replaying from it gives every command the
        # same append time as on every other node (0 in a checkpoint from before times).
        self.broker.time = int(checkpoint.get("time", 0))
        self._checkpoint_at = time.monotonic()
        log.info("cluster %s: node %s replays etcd's log from revision %d (broker index %d); "
                 "etcd %s", self.cluster, self.url, revision + 1, self.broker.index,
                 ",".join(self.settings.endpoints))
        self._tasks = [
            asyncio.create_task(self._writes.run(), name="messaging-etcd-puts"),
            asyncio.create_task(self._apply_loop(), name="messaging-etcd-apply"),
            asyncio.create_task(self._watch_loop(), name="messaging-etcd-watch"),
            asyncio.create_task(self._supervised("etcd monitor", self._monitor,
                                                 MONITOR_INTERVAL),
                                name="messaging-etcd-monitor"),
            asyncio.create_task(self._supervised("membership", self._membership.step,
                                                 MEMBERSHIP_INTERVAL),
                                name="messaging-etcd-membership"),
        ]
        if self.fsync == "interval":
            self._tasks.append(asyncio.create_task(self._unsynced.run(self._writer),
                                                   name="messaging-etcd-fsync"))

    def _load(self) -> tuple[grpc.ChannelCredentials | None, dict[str, Any]]:
        """TLS files and the checkpoint (writer thread); refuses foreign data directories."""
        credentials = load_credentials(self.settings)
        path = self._checkpoint_path
        if not path.exists():
            if self.broker.topics():
                raise DataDirectoryError(
                    f"{self.broker.path} holds topics but no {CHECKPOINT}: it was not written "
                    f"by a node of cluster {self.cluster!r}. Start this node with an empty data "
                    "directory; it catches up from etcd or from a peer's snapshot")
            # From now on this directory belongs to the cluster: a crash before the first
            # periodic checkpoint replays from the start.
            self._write_checkpoint(0, 0, time_ms=0)
            return credentials, {"revision": 0, "index": 0}
        try:
            checkpoint: dict[str, Any] = read_json(path)
        except (OSError, ValueError) as err:
            raise DataDirectoryError(f"{path} is unreadable: {err}") from err
        if checkpoint.get("cluster") != self.cluster:
            raise DataDirectoryError(f"{path} belongs to cluster {checkpoint.get('cluster')!r}, "
                                     f"not {self.cluster!r}")
        if checkpoint.get("installing"):
            # A snapshot install was interrupted: the topics may be half old, half new.
            log.warning("an interrupted snapshot install left %s; discarding local topics and "
                        "catching up again", self.broker.path)
            empty = {"format": FORMAT, "index": 0, "subscribers": {}, "topics": []}
            self.broker.install_snapshot(io.BytesIO(json.dumps(empty).encode() + b"\n"))
            checkpoint = {"revision": 0, "index": 0}
            self._write_checkpoint(0, 0, time_ms=0)
        self.broker.catalog.restore(checkpoint.get("catalog"))
        return credentials, checkpoint

    async def close(self) -> None:
        """Let in-flight writes apply (briefly), stop every task, fsync and checkpoint."""
        self._closing = True
        loop = asyncio.get_running_loop()
        await self._writes.drain(CLOSE_GRACE)
        for task in self._tasks:
            await cancel_and_wait(task)
        await self._writes.cancel_puts()
        # Runs after whatever the writer thread is still doing (a cancelled apply's job).
        await loop.run_in_executor(self._writer, self._final_checkpoint)
        try:
            await self._membership.leave()
        except (grpc.aio.AioRpcError, MessagingError) as err:
            log.info("could not revoke this node's lease on close: %s", describe(err))
        await self._client.close()
        await loop.run_in_executor(None, self._writer.shutdown)

    def _final_checkpoint(self) -> None:
        if self._failure is None:
            self._unsynced.flush()
            self._checkpoint(force=True)

    # -- the Log protocol -------------------------------------------------------------------

    async def apply(self, command: bytes) -> ApplyResult:
        """Commit ``command`` through etcd and return what this node's state machine did."""
        if self._closing:
            raise BrokerClosedError("the broker is shutting down")
        if self._failure is not None:
            raise self._failure
        future = self._writes.submit(command)
        started = time.perf_counter()
        result = await future
        self.broker.metrics.publish_latency.observe(time.perf_counter() - started)
        return result

    def urls(self) -> list[str]:
        """The URLs of the live (registered) nodes, this one included."""
        return self._membership.urls()

    def not_ready(self) -> str | None:
        """Why this node cannot take writes: stopped, watch down, no etcd quorum."""
        if self._closing:
            return "shutting down"
        if self._failure is not None:
            return str(self._failure)
        if self._client.refused is not None:  # no retry gets past it: say it first
            return self._client.refused
        if not self._watch_live:
            return f"the watch of etcd's log is not live: {self._watch_error or 'starting'}"
        if not self._writes.quorum:
            return f"no etcd quorum: {self._writes.quorum_error or 'not checked yet'}"
        return None

    def caught_up(self) -> bool:
        """Whether this node may serve reads of its log: ready for writes, and it has applied
        every entry the log held at its last quorum read (taken after it started)."""
        if self.not_ready() is not None or not self._quorum_reads:
            return False
        with self._progress_lock:
            return self._applied >= self._log_revision

    def applied_revision(self) -> int:
        """The revision through which this node has applied the log (idle stretches that a
        quorum read saw empty included)."""
        with self._progress_lock:
            return max(self._applied, self._idle_covered)

    def diagnostics(self, window: float = DEFAULT_WINDOW) -> dict[str, Any]:
        """etcd endpoints, revisions, lag, nodes, watch and quorum state, and where the time
        of the publishes answered in the last ``window`` seconds went."""
        now = time.monotonic()
        with self._progress_lock:
            applied, checkpointed = self._applied, self._checkpointed
            covered = max(applied, self._idle_covered)
        return {
            "mode": "etcd",
            "role": "member",
            "leader": self.url,
            "peers": [u for u in self.urls() if u != self.url],
            "cluster": self.cluster,
            "endpoints": list(self.settings.endpoints),
            "endpoint": self._client.endpoint,
            "fsync": self.fsync,
            "applied_revision": covered,
            "last_entry_applied": applied,
            "durable_revision": checkpointed,
            "etcd_revision": self._etcd_revision,
            "log_revision": self._log_revision,
            "lag": max(0, self._etcd_revision - covered),
            "nodes": {url: info["durable_revision"]
                      for url, info in self._membership.nodes.items()},
            "watch": {
                "live": self._watch_live,
                "from_revision": self._watch_from,
                "endpoint": self.settings.endpoints[self._watch_endpoint],
                "last_event_age": (round(now - self._watch_event_at, 3)
                                   if self._watch_event_at else None),
                "restarts": self._watch_restarts,
                "error": self._watch_error,
            },
            **self._writes.diagnostics(),
            "compacted_revision": self._membership.compacted,
            "snapshots_installed": self.snapshots_installed,
            "publish_budget": self._writes.budget.report(window),
            "apply_error": self._apply_error,
            "failure": None if self._failure is None else str(self._failure),
        }

    async def open_snapshot(self) -> SnapshotStream:
        """This node's committed data at its applied revision, for a peer to install."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, self._capture_snapshot)

    def _capture_snapshot(self) -> SnapshotStream:
        with self._progress_lock:
            revision = max(self._applied, self._idle_covered)
        return SnapshotStream.capture(self.broker, {"cluster": self.cluster,
                                                    "revision": revision})

    def _quorum_read(self, response: Any) -> None:
        """A quorum read also tells how far etcd and the log key are (writer's callback)."""
        self._etcd_revision = int(response.header.revision)
        self._quorum_reads += 1
        if response.kvs:
            self._log_revision = int(response.kvs[0].mod_revision)
        with self._progress_lock:
            if self._log_revision <= self._applied:
                # Nothing in the log after what is applied: everything through here is covered.
                self._idle_covered = max(self._idle_covered, self._etcd_revision)

    # -- applying the log -------------------------------------------------------------------

    async def _apply_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            size = len(batch[0].value)
            while size < APPLY_BATCH_BYTES and not self._queue.empty():
                item = self._queue.get_nowait()
                batch.append(item)
                size += len(item.value)
            delay = 0.1
            while True:
                try:
                    applied = await loop.run_in_executor(self._writer, self._apply_revisions,
                                                         batch)
                    break
                except _GroupFailed as err:
                    if any(t.failure is not None for t in self.broker.topics()):
                        # An fsync failed: the topic takes no more writes until a restart
                        # re-verifies its files, so retrying cannot succeed.
                        await self._stop_applying(batch, err)
                    self._apply_error = str(err)
                    self._quiet.log("apply", logging.ERROR, "applying revisions %d..%d failed "
                                   "(retrying): %s", batch[0].revision, batch[-1].revision, err)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                except _Diverged as err:
                    await self._stop_applying(batch, err)
            self._apply_error = None
            self._answer(applied)
            for _ in batch:
                self._queue.task_done()

    async def _stop_applying(self, batch: list[_Revision], err: Exception) -> None:
        """Stop for good: nothing of ``batch`` is visible, publishes are refused (503) and the
        ones waiting are told their outcome is unknown here (504, committed in etcd). A
        restart re-verifies the files and replays from the checkpoint, which never covers
        data that was not fsynced. Never returns; close() cancels it."""
        self._failure = StorageFailedError(
            f"this node stopped applying the log at revision {batch[0].revision}: {err}; "
            "restart it (it re-verifies its files and replays from its checkpoint)")
        self._apply_error = str(err)
        log.critical("%s", self._failure)
        self._writes.fail_waiting(CommitUnknownError(
            f"committed in etcd, but this node stopped applying the log: {err}; the other "
            "nodes have it"), self._failure)
        for _ in batch:
            self._queue.task_done()
        await asyncio.Event().wait()

    def _apply_revisions(self, batch: list[_Revision]) -> _Applied:
        """Apply revisions in order as one group (writer thread)."""
        started = time.monotonic()
        commands: list[bytes] = []
        times: list[int | None] = []
        spans: list[tuple[_Revision, bytes, int, int, int]] = []
        for item in batch:
            try:
                entry = decode_entry(item.value)
            except ValueError as err:
                # Every node sees the same bytes and skips them alike.
                log.warning("revision %d of %s is not a log entry (%s); skipped",
                            item.revision, self._log_key.decode(), err)
                continue
            spans.append((item, entry.node, entry.seq, len(commands), len(entry.commands)))
            commands.extend(entry.commands)
            times.extend([entry.time] * len(entry.commands))
        durable = self.fsync == "always"
        results = (self.broker.write_group(commands, durable=durable, notify=False, times=times)
                   if commands else [])
        local = [r for r in results if isinstance(r, (StorageError, BrokerClosedError))]
        if local:
            if len(local) == len(results) and all(r is local[0] for r in local):
                raise _GroupFailed(str(local[0]))  # nothing was applied: the index is back
            raise _Diverged(str(local[0]))
        touched = {t for r in results if isinstance(r, ApplyResult) for t in r.topics}
        if not durable:
            self._unsynced.add(touched)
        self._applied_index = self.broker.index
        with self._progress_lock:
            self._applied = batch[-1].revision
        self._since_checkpoint += len(batch)
        self.broker.metrics.group_commits.inc(len(commands))
        finished = time.monotonic()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("applied revisions %d..%d of %s: %d commands, %d bytes, %.3f ms",
                      batch[0].revision, batch[-1].revision, self._log_key.decode(),
                      len(commands), sum(len(item.value) for item in batch),
                      (finished - started) * 1000)
        self._checkpoint_if_due()
        return _Applied(spans, results, touched, started, finished)

    def _answer(self, applied: _Applied) -> None:
        """Answer this node's publishers, then wake the followers (on the loop)."""
        for item, node, seq, first, count in applied.spans:
            self._writes.answer(node, seq, applied.results[first:first + count],
                                ApplyTiming(item.received, applied.started, applied.finished))
        self.broker.notify(applied.touched)

    # -- checkpoints ------------------------------------------------------------------------

    def _durable_revision(self) -> int:
        """The revision through which this node's data is durable (any thread)."""
        with self._progress_lock:
            return self._checkpointed

    def _checkpoint_if_due(self) -> None:
        """Checkpoint after enough revisions or time, or after a while idle (writer thread)."""
        age = time.monotonic() - self._checkpoint_at
        with self._progress_lock:
            applied, idle, checkpointed = (self._applied, self._idle_covered,
                                           self._checkpointed)
        if applied > checkpointed:
            due = self._since_checkpoint >= CHECKPOINT_REVISIONS or age >= CHECKPOINT_INTERVAL
        else:
            due = idle > checkpointed and age >= IDLE_CHECKPOINT_INTERVAL
        if due:
            self._checkpoint()

    def _checkpoint(self, *, force: bool = False) -> None:
        """Write cluster.json for what is durable here (writer thread)."""
        with self._progress_lock:
            revision = max(self._applied, self._idle_covered)
            checkpointed = self._checkpointed
        if revision <= checkpointed and not force:
            return
        if self.fsync != "always":
            self._unsynced.flush()
        if any(topic.failure is not None for topic in self.broker.topics()):
            return  # an fsync failed: what it covered is not known to be durable
        self._write_checkpoint(revision, self._applied_index)
        with self._progress_lock:
            self._checkpointed = revision
        self._since_checkpoint = 0
        self._checkpoint_at = time.monotonic()

    def _write_checkpoint(self, revision: int, index: int, *, installing: bool = False,
                          time_ms: int | None = None) -> None:
        # The catalog as of this revision: replaying the log from here must decide every
        # stream command (a retried append, a fenced producer) exactly as the first time.
        state: dict[str, Any] = {"format": FORMAT, "cluster": self.cluster,
                                 "revision": revision, "index": index,
                                 "time": self.broker.time if time_ms is None else time_ms,
                                 "catalog": self.broker.catalog.saved()}
        if installing:
            state["installing"] = True
        write_json_atomic(self._checkpoint_path, state)

    # -- the watch --------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        """Keep one watch running; anything but cancellation restarts it on the next endpoint."""
        failures = 0
        while True:
            attempt = asyncio.create_task(self._watch_once(), name="messaging-etcd-watch-once")
            self._watch_attempt = attempt
            self._watch_attempt_at = time.monotonic()
            try:
                await asyncio.wait([attempt])
            except asyncio.CancelledError:
                await cancel_and_wait(attempt)
                raise
            finally:
                self._watch_live = False
                self._watch_attempt = None
            error: BaseException | None
            if attempt.cancelled():
                error = TimeoutError(f"no event for {WATCH_STUCK:.0f}s while etcd's log moved "
                                     "on")
            else:
                error = attempt.exception()
            if isinstance(error, CompactedError):
                await self._install_from_peer(error.compact_revision)
                failures = 0
                continue
            reason = describe(error) if error is not None else "stream ended"
            self._watch_error = reason
            self._watch_restarts += 1
            # Every restart is logged: a watch that keeps failing over must show in the log
            # (at INFO while the node starts: etcd may be starting too).
            log.log(self._startup.level(), "watch of %s on %s failed (%s); restarting from "
                    "revision %d on the next endpoint (restart %d)", self._log_key.decode(),
                    self.settings.endpoints[self._watch_endpoint], reason,
                    self._received + 1, self._watch_restarts)
            self._watch_endpoint = (self._watch_endpoint + 1) % len(self.settings.endpoints)
            if self._watch_event_at and time.monotonic() - self._watch_event_at < 1.0:
                failures = 0
            await asyncio.sleep(min(0.1 * 2 ** failures, 1.0))
            failures += 1

    async def _watch_once(self) -> None:
        start = await self._watch_start()
        self._watch_from = start
        call = await self._client.watch(self._log_key, start, self._watch_endpoint)
        try:
            async for response in call:
                self._watch_event_at = time.monotonic()
                if response.compact_revision:
                    raise CompactedError(int(response.compact_revision))
                if response.canceled:
                    raise ConnectionError(response.cancel_reason or "watch canceled by etcd")
                if response.created:
                    self._watch_live = True
                    self._watch_error = None
                    log.info("watching %s from revision %d on %s", self._log_key.decode(), start,
                             self.settings.endpoints[self._watch_endpoint])
                for event in response.events:
                    revision = int(event.kv.mod_revision)
                    if event.type != _EVENT_PUT or revision <= self._received:
                        continue
                    await self._queue.put(_Revision(revision, bytes(event.kv.value),
                                                    time.monotonic()))
                    self._received = revision
                    self._watch_event_at = time.monotonic()  # a full queue is not a stuck watch
        finally:
            call.cancel()
        raise ConnectionError("watch stream ended")

    async def _watch_start(self) -> int:
        """The revision to watch from: after what was received, skipping log-free history."""
        with self._progress_lock:
            start = max(self._received, self._idle_covered) + 1
        response = await self._client.get(self._log_key, keys_only=True,
                                          endpoint=self._watch_endpoint)
        head = int(response.header.revision)
        if not response.kvs:
            return max(start, head + 1)
        kv = response.kvs[0]
        if kv.mod_revision < start:
            return max(start, head + 1)  # no entry after what this node has
        if self._received == 0:
            return max(start, int(kv.create_revision))  # a new node: from the log's first entry
        return start

    # -- snapshots --------------------------------------------------------------------------

    async def _install_from_peer(self, compacted: int) -> None:
        """Replace local data with a live peer's snapshot at or after ``compacted`` - 1."""
        log.warning("etcd compacted the log through revision %d, past this node's revision %d: "
                    "installing a snapshot from a peer", compacted, self._received)
        self._watch_error = f"revision {self._received + 1} compacted: installing a snapshot"
        await self._queue.join()  # everything received before is applied first
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._membership.refresh()
            except (grpc.aio.AioRpcError, MessagingError) as err:
                log.info("listing peers failed: %s", describe(err))
            for url in [u for u in self._membership.urls() if u != self.url]:
                try:
                    header = await loop.run_in_executor(self._writer, self._install_snapshot,
                                                        url, compacted)
                except (OSError, ValueError, KeyError, MessagingError) as err:
                    log.warning("snapshot from %s not installed: %s", url, describe(err))
                    continue
                self.snapshots_installed += 1
                self._received = int(header["revision"])
                self._writes.snapshot_installed(self._received)
                log.info("installed the snapshot of %s at revision %d (broker index %d)", url,
                         self._received, self.broker.index)
                return
            self._quiet.log("no snapshot", logging.WARNING, "no live peer served a snapshot "
                           "at or after revision %d yet; retrying", compacted - 1)
            await asyncio.sleep(MEMBERSHIP_INTERVAL)

    def _install_snapshot(self, url: str, compacted: int) -> dict[str, Any]:
        """Fetch, verify and install a peer's snapshot; then checkpoint it (writer thread)."""
        self._unsynced.flush()  # the topics it names are about to be replaced

        def accept(header: dict[str, Any]) -> None:
            if header.get("cluster") != self.cluster:
                raise DataDirectoryError(f"{url} serves cluster {header.get('cluster')!r}")
            revision = int(header["revision"])
            if revision + 1 < compacted:
                raise DataDirectoryError(f"its snapshot is at revision {revision}, before the "
                                         f"compaction at {compacted}")
            self._write_checkpoint(self._checkpointed, self._applied_index, installing=True)

        previous = (self._checkpointed, self._applied_index)
        try:
            with fetch_snapshot(url, self.cluster, token=self.peer_token,
                                ca=self.peer_ca) as stream:
                header = self.broker.install_snapshot(stream, accept)
        except BaseException:
            if self._checkpoint_path.exists():
                self._write_checkpoint(*previous)  # local data untouched: keep its checkpoint
            raise
        revision = int(header["revision"])
        self._applied_index = self.broker.index
        self._write_checkpoint(revision, self._applied_index)
        with self._progress_lock:
            self._applied = self._checkpointed = revision
            self._idle_covered = 0
        self._since_checkpoint = 0
        self._checkpoint_at = time.monotonic()
        return header

    # -- health, membership, compaction -----------------------------------------------------

    async def _supervised(self, what: str, step: Callable[[], Awaitable[None]],
                          interval: float) -> None:
        """Run ``step`` every ``interval`` until cancelled; a failure is logged, never fatal."""
        while True:
            await asyncio.sleep(interval)
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, MessagingError, OSError, ValueError) as err:
                self._startup.log(self._quiet, what, logging.WARNING, "%s: %s", what,
                                  describe(err))
            except Exception:
                self._quiet.log(what, logging.ERROR, "%s failed", what, exc_info=True)

    def _watch_stuck(self, now: float) -> bool:
        """Whether the log has been ahead of what the watch brought for WATCH_STUCK seconds
        of this attempt, with no event meanwhile (the monitor's judgement, on the loop)."""
        if self._watch_attempt is None or self._log_revision <= self._received:
            self._behind_since = None
            return False
        if self._behind_since is None:
            self._behind_since = now
        return watch_stuck(now, self._behind_since, self._watch_event_at, self._watch_attempt_at)

    async def _monitor(self) -> None:
        """Check quorum, restart a stuck watch, checkpoint an idle node."""
        with contextlib.suppress(ClusterUnavailableError):
            await self._writes.check_quorum()
        self._startup.check(self.not_ready())
        if self._watch_stuck(time.monotonic()):
            assert self._watch_attempt is not None
            self._watch_attempt.cancel()  # the supervisor restarts it on the next endpoint
        if self._failure is None:
            await asyncio.get_running_loop().run_in_executor(self._writer,
                                                             self._checkpoint_if_due)




