"""EtcdLog: the Log protocol on etcd. The command log is the revision history of one key.

Every key lives under ``/messaging/<cluster>/``: ``log`` (the command log) and
``nodes/<advertise URL>`` (membership, bound to a lease).

- Writes (:mod:`messaging.log.etcd.writer`): any node takes them. Concurrent commands are
  group-committed into one put of the log key (at most about 1 MiB); several puts may be in
  flight. A publisher is answered once etcd committed the revision its put created (fsynced
  on a majority of etcd's members: etcd is the write-ahead log) and *this* node has applied
  it (visible to readers here). A put that may have left is never resent: only one refused
  before it was sent moves on to the next endpoint.
- Watch (:mod:`messaging.log.etcd.watch`): one supervised watch of the log key from the last
  revision received, restarted on the next endpoint when it fails or is stuck.
- Apply (:mod:`messaging.log.etcd.apply`): each revision is decoded into its commands and
  applied in revision order by ``Broker.write_group`` on one writer thread, so every node
  assigns the same indexes and writes the same segment files.
- Sync and checkpoint (:mod:`messaging.log.etcd.checkpoint`): a node's segment files are its
  applied copy of etcd's log. It fsyncs them in groups, at most every
  ``--cluster-sync-interval`` (unless ``--fsync never``: then at checkpoints only), never on
  a publish's path; ``DATA/cluster.json`` holds the revision through which every log entry is
  durable here and the broker index after it, written only after that data is fsynced. A
  restart (a crash, or a power loss that took unfsynced tails) replays from it: replay
  reassigns identical indexes and topics skip the frames they already hold.
- Intake (:mod:`messaging.log.etcd.intake`): with an object store, a large publish goes to
  the store in an object the node's logs share, and the log carries a pointer to it, which
  holders apply as the commands it names.
- Membership (:mod:`messaging.log.etcd.membership`): each node registers ``{url,
  durable_revision}`` under a lease; the first live node (by URL) compacts etcd below the
  smallest durable revision of every registered node.
- Install (:mod:`messaging.log.etcd.install`): a node whose next revision was compacted
  installs a snapshot fetched from a live peer (verified, staged, renamed over its topics,
  never merged) and watches on from there.
- Clock (:mod:`messaging.log.etcd.clock_check`): every second the node reads its peers'
  clocks; one too far off (``--max-clock-offset``) takes no writes until it is back, and no
  command it forms gets a time further ahead of the cluster's than the bound. Retention by
  age measures against the log's time (the newest applied command's), so every node deletes
  the same segments whatever its own clock says.

This module is the lifecycle and the public face: :class:`EtcdLog` builds those parts, starts
and stops their tasks, supervises the periodic ones (the monitor: quorum, a stuck watch, an
idle checkpoint; membership) and answers for the node (ready, caught up, diagnostics). Its
own fields belong to the event loop; the node's writer thread (``_writer``, a SerialExecutor) owns
the broker and the checkpoint; the revisions both share are in
:class:`~messaging.log.etcd.progress.Progress`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from messaging.aio import cancel_and_wait
from messaging.broker.broker import Broker
from messaging.broker.commands import ApplyResult
from messaging.broker.snapshot import SnapshotStream
from messaging.config import FSYNC_MODES, EtcdSettings, FsyncMode
from messaging.errors import (
    BrokerClosedError,
    ClockOffsetError,
    ClusterUnavailableError,
    MessagingError,
)
from messaging.log.etcd import entry_format
from messaging.log.etcd.apply import Applier
from messaging.log.etcd.budget import DEFAULT_WINDOW
from messaging.log.etcd.checkpoint import CHECKPOINT, Checkpoints
from messaging.log.etcd.client import EtcdClient, describe, load_credentials
from messaging.log.etcd.clock_check import CHECK_INTERVAL, ClockCheck
from messaging.log.etcd.install import SnapshotInstaller
from messaging.log.etcd.intake import Intake, IntakeLane
from messaging.log.etcd.intake_metrics import IntakeMetrics
from messaging.log.etcd.intake_reads import LogReads
from messaging.log.etcd.membership import Membership
from messaging.log.etcd.progress import Progress
from messaging.log.etcd.quorum_reads import aligned_sleep
from messaging.log.etcd.share import EtcdShare
from messaging.log.etcd.startup import Startup
from messaging.log.etcd.watch import WATCH_STUCK, LogWatch, watch_stuck
from messaging.log.etcd.writer import LogWriter
from messaging.log.local import DeferredSync
from messaging.log.serial import SerialExecutor
from messaging.quiet_log import RECURRING_LOG_INTERVAL, QuietLog

log = logging.getLogger(__name__)

__all__ = ["CHECKPOINT", "WATCH_STUCK", "EtcdLog", "EtcdSettings", "watch_stuck"]

MONITOR_INTERVAL = 0.5
MEMBERSHIP_INTERVAL = 1.0
CLOSE_GRACE = 5.0
#: A read waits at most this long for this node to apply what etcd's log held when it came.
READ_BARRIER_TIMEOUT = 10.0


class EtcdLog:
    """The Log protocol over etcd: every node accepts writes and applies the same log."""

    def __init__(self, broker: Broker, url: str, settings: EtcdSettings,
                 fsync: FsyncMode = "always", *, peer_token: str | None = None,
                 peer_ca: str | None = None, clock: ClockCheck | None = None,
                 share: EtcdShare | None = None, intake: Intake | None = None) -> None:
        """``intake``: the node's intake lane (with an object store), shared by its logs."""
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
        # A node holding topic groups passes every group's log in one etcd cluster the same
        # share (client, watch stream, quorum reads: its own, closed by it); a log without
        # one makes its own, with its client made at start, when its TLS files are read.
        self._own_share = share is None
        self._share = (share if share is not None
                       else EtcdShare.over(EtcdClient(settings), list(settings.endpoints)))
        self._client = self._share.client
        self._writer = SerialExecutor("messaging-writer")
        self._unsynced = DeferredSync(broker)
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._startup = Startup(log, self._log_key.decode())
        self._progress = Progress()
        self._writes = LogWriter(self._client, self._log_key, os.urandom(8),
                                 self._quorum_read, broker.settled_result,
                                 startup=self._startup)
        self._checkpoints = Checkpoints(broker, self.cluster, self._progress, self._unsynced)
        self._intake = intake
        self._lane: IntakeLane | None = None
        pointers: LogReads | None = None
        if intake is not None:
            self._lane = IntakeLane(self._writes, self._log_key.decode(), self.cluster,
                                    IntakeMetrics(broker.metrics.registry))
            pointers = LogReads(intake.reads, self._lane.metrics)
        self._applier = Applier(broker, self._writer, self._writes, self._progress,
                                self._checkpoints, self._unsynced, self._log_key,
                                linger=settings.apply_linger, pointers=pointers)
        self._membership = Membership(self._client, self.cluster, url,
                                      lambda: self._progress.checkpointed,
                                      settings.compact_every, lease=self._share.lease,
                                      reads=self._share.quorum)
        if self._lane is not None:
            membership = self._membership
            self._lane.readers_ready = lambda: membership.read_intake(membership.intake_store)
        self._installer = SnapshotInstaller(broker, self.cluster, url, self._membership,
                                            self._writer, self._checkpoints, self._unsynced,
                                            peer_token=peer_token, peer_ca=peer_ca)
        # One check per node: a node holding topic groups passes its own to every group's
        # log (its peers are the cluster's members); a log without one checks for itself.
        self._own_clock = clock is None
        self._clock = clock if clock is not None else ClockCheck(
            url, settings.max_clock_offset_ms, self._membership.urls, ca=peer_ca)
        self._writes.clock = self._clock.command_time
        # Ages are measured by the log's time: the same on every node at the same revision.
        broker.retention.clock = lambda: broker.time
        self._writes.quorum_reads = self._share.quorum
        self._watch = LogWatch(self._share.streams, self._log_key, self._progress,
                               self._applier.deliver, self._applier.room,
                               self._catch_up_from_peer, self._startup)
        # as of the last quorum read (on the loop)
        self._etcd_revision = 0
        self._log_revision = 0  # the log key's last revision
        self._quorum_reads = 0  # quorum reads answered since start
        self._quiet = QuietLog(log, RECURRING_LOG_INTERVAL)

    @property
    def snapshots_installed(self) -> int:
        """Peers' snapshots this node installed since start."""
        return self._installer.installed

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the checkpoint, then start writing, watching, monitoring and registering."""
        loop = asyncio.get_running_loop()
        try:
            credentials, revision = await loop.run_in_executor(self._writer, self._load)
        except BaseException:
            await loop.run_in_executor(None, self._writer.shutdown)
            raise
        if self._own_share:
            self._client = EtcdClient(self.settings, credentials)
            self._share.use(self._client)
            self._membership.client = self._writes.client = self._client
        await self._check_entry_format()
        if self._own_clock:
            await self._first_clock_check()
        self._watch.received = revision
        log.info("cluster %s: node %s replays etcd's log from revision %d (broker index %d); "
                 "etcd %s", self.cluster, self.url, revision + 1, self.broker.index,
                 ",".join(self.settings.endpoints))
        self._tasks = [
            asyncio.create_task(self._writes.run(), name="messaging-etcd-puts"),
            asyncio.create_task(self._watch.run(), name="messaging-etcd-watch"),
            asyncio.create_task(self._supervised("etcd monitor", self._monitor,
                                                 MONITOR_INTERVAL, aligned=True),
                                name="messaging-etcd-monitor"),
            asyncio.create_task(self._supervised("membership", self._membership_step,
                                                 MEMBERSHIP_INTERVAL, aligned=True),
                                name="messaging-etcd-membership"),
        ]
        if self._own_clock:
            self._tasks.append(asyncio.create_task(
                self._supervised("clock check", self._clock.step, CHECK_INTERVAL),
                name="messaging-clock-check"))
        if self.fsync != "never":  # etcd is the WAL: files are fsynced in groups
            self._tasks.append(asyncio.create_task(
                self._unsynced.run(self._writer, self.settings.sync_interval),
                name="messaging-etcd-fsync"))
        if self._intake is not None and self._lane is not None:
            self._intake.join(self._lane)

    def _load(self) -> tuple[grpc.ChannelCredentials | None, int]:
        """TLS files and the checkpoint, restored (writer thread): the revision to replay
        after. Refuses foreign data directories."""
        credentials = load_credentials(self.settings)
        return credentials, self._checkpoints.load().revision

    async def _check_entry_format(self) -> None:
        """Refuse to start when the cluster writes an entry format this node cannot read;
        else write the active one from the first put. An etcd that does not answer yet is
        no reason to stop: the membership step reads it within a second."""
        try:
            active = await entry_format.active_version(self._client, self.cluster)
        except (grpc.aio.AioRpcError, MessagingError) as err:
            log.info("cluster %s: could not read the log entry format yet (%s)", self.cluster,
                     describe(err))
            return
        entry_format.check_supported(self.cluster, active)
        self._membership.entry_version = self._writes.entry_version = active

    async def _first_clock_check(self) -> None:
        """Register, read the live nodes and their clocks once before taking writes, so a
        node started with its clock far off never forms a command, and nodes started
        together see one another at once. Peers or an etcd that do not answer yet are no
        reason to stop: the periodic check follows within a second."""
        try:
            await self._membership.register()
            await self._membership.refresh()
            await self._clock.step()
        except (grpc.aio.AioRpcError, MessagingError, OSError) as err:
            log.info("cluster %s: could not check this node's clock yet (%s)", self.cluster,
                     describe(err))
        problem = self._clock.problem()
        if problem is not None:
            log.error("cluster %s: %s", self.cluster, problem)

    async def _membership_step(self) -> None:
        """The membership's step; puts follow the cluster's entry format it keeps; a node
        that joined has its clock read at once."""
        if self._intake is not None:  # announced once known: the store may be down
            self._membership.intake_store = self._intake.identity
        await self._membership.step()
        self._writes.entry_version = self._membership.entry_version
        if self._own_clock:
            await self._clock.meet()

    async def close(self) -> None:
        """Let in-flight writes apply (briefly), stop every task, fsync and checkpoint."""
        self._closing = True
        loop = asyncio.get_running_loop()
        if self._intake is not None and self._lane is not None:
            await self._intake.leave(self._lane)
        await self._writes.drain(CLOSE_GRACE)
        self._applier.close()
        for task in self._tasks:
            await cancel_and_wait(task)
        await self._writes.cancel_puts()
        if self._own_clock:
            await self._clock.close()
        # Runs after whatever the writer thread is still doing (a cancelled apply's job).
        await loop.run_in_executor(self._writer, self._final_checkpoint)
        try:
            await self._membership.leave()
        except (grpc.aio.AioRpcError, MessagingError) as err:
            log.info("could not leave the cluster's node list on close (the registration "
                     "is deleted again later, or lapses with its lease): %s", describe(err))
        if self._own_share:
            await self._share.close()
            await self._client.close()
        await loop.run_in_executor(None, self._writer.shutdown)

    def _final_checkpoint(self) -> None:
        if self._applier.failure is None:
            self._checkpoints.final()

    async def _catch_up_from_peer(self, compacted: int) -> int:
        """etcd compacted the log past this node (the watch's call): once what was received
        is applied, install a peer's snapshot; returns its revision, through which this node
        now holds the log. Revisions held back by a pointer whose object cannot be fetched
        are dropped instead: the snapshot covers them (its object may be gone for good)."""
        while True:  # held now, or once the drain under way fails to fetch: drop, install
            held = self._applier.held
            if held is not None:
                dropped = await self._applier.drop_held()
                log.warning("%s: dropped %d received revisions held back by an intake object "
                            "this node could not fetch (%s): a peer's snapshot covers them",
                            self._log_key.decode(), dropped, held)
            try:
                async with asyncio.timeout(MONITOR_INTERVAL):
                    await self._applier.drained()
                break
            except TimeoutError:
                continue
        revision = await self._installer.install(compacted)
        self._writes.snapshot_installed(revision)
        self._applier.wake()  # reads waiting for a revision the snapshot covers
        return revision

    # -- the Log protocol -------------------------------------------------------------------

    async def apply(self, command: bytes) -> ApplyResult:
        """Commit ``command`` through etcd and return what this node's state machine did."""
        if self._closing:
            raise BrokerClosedError("the broker is shutting down")
        if self._applier.failure is not None:
            raise self._applier.failure
        clock = self._clock.problem()
        if clock is not None:
            raise ClockOffsetError(clock)
        if self._lane is not None and self._intake is not None \
                and self._intake.takes(self._lane, command):
            future = self._intake.submit(self._lane, command)
        else:
            future = self._writes.submit(command)
        started = time.perf_counter()
        result = await future
        self.broker.metrics.publish_latency.observe(time.perf_counter() - started)
        return result

    async def read_barrier(self) -> None:
        """Return once this node has applied the log through the revision etcd holds now
        (a linearizable read, gathered with the node's other reads of this etcd cluster in
        this turn of the loop): a read that follows sees every publish acknowledged by any
        node before the call. While etcd has no quorum (nothing can be acknowledged then),
        it returns at once and the read is served from what this node holds. Raises
        ClusterUnavailableError when this node does not get that far within
        READ_BARRIER_TIMEOUT, the applier's failure when it stopped applying."""
        if self._closing:
            raise BrokerClosedError("the broker is shutting down")
        if self._applier.failure is not None:
            raise self._applier.failure
        if self._writes.quorum_lost:
            return  # known without quorum: no read to wait for, local data is what there is
        target = 0
        try:
            async with asyncio.timeout(READ_BARRIER_TIMEOUT):
                try:
                    response = await self._share.quorum.read(self._log_key)
                except ClusterUnavailableError:
                    return  # etcd cannot answer: served from local data, as above
                self._quorum_read(response)
                target = int(response.kvs[0].mod_revision) if response.kvs else 0
                await self._applier.applied_through(target)
        except TimeoutError:
            raise ClusterUnavailableError(
                f"this node has applied the log through revision {self._progress.applied}, "
                f"not through {target} where etcd has it, after {READ_BARRIER_TIMEOUT:g}s "
                f"({self.not_ready() or 'catching up'}): read through another node"
            ) from None

    def urls(self) -> list[str]:
        """The URLs of the live (registered) nodes, this one included."""
        return self._membership.urls()

    def announce_kafka(self, address: str) -> None:
        """Announce this node's Kafka listener (``HOST:PORT``) with its registration."""
        self._membership.announce_kafka(address)

    def kafka_addresses(self) -> list[str]:
        """The Kafka listeners of the live nodes, this one's included."""
        return self._membership.kafka_addresses()

    def not_ready(self) -> str | None:
        """Why this node cannot take writes: stopped, watch down, no etcd quorum."""
        if self._closing:
            return "shutting down"
        if self._applier.failure is not None:
            return str(self._applier.failure)
        if self._client.refused is not None:  # no retry gets past it: say it first
            return self._client.refused
        if not self._watch.live:
            return f"the watch of etcd's log is not live: {self._watch.error or 'starting'}"
        if not self._writes.quorum:
            return f"no etcd quorum: {self._writes.quorum_error or 'not checked yet'}"
        if self._applier.held is not None:
            return f"applying the log is held up: {self._applier.held}"
        return self._clock.problem()

    def caught_up(self) -> bool:
        """Whether this node may serve reads of its log: ready for writes, and it has applied
        every entry the log held at its last quorum read (taken after it started)."""
        if self.not_ready() is not None or not self._quorum_reads:
            return False
        return self._progress.applied >= self._log_revision

    def applied_revision(self) -> int:
        """The revision through which this node has applied the log (idle stretches that a
        quorum read saw empty included)."""
        return self._progress.covered

    def diagnostics(self, window: float = DEFAULT_WINDOW) -> dict[str, Any]:
        """etcd endpoints, revisions, lag, nodes, watch and quorum state, and where the time
        of the publishes answered in the last ``window`` seconds went."""
        progress = self._progress.view()
        failure = self._applier.failure
        return {
            "mode": "etcd",
            "role": "member",
            "leader": self.url,
            "peers": [u for u in self.urls() if u != self.url],
            "cluster": self.cluster,
            "endpoints": list(self.settings.endpoints),
            "endpoint": self._client.endpoint,
            "fsync": self.fsync,
            "applied_revision": progress.covered,
            "last_entry_applied": progress.applied,
            "durable_revision": progress.checkpointed,
            "etcd_revision": self._etcd_revision,
            "log_revision": self._log_revision,
            "lag": max(0, self._etcd_revision - progress.covered),
            "nodes": {url: info["durable_revision"]
                      for url, info in self._membership.nodes.items()},
            "watch": self._watch.diagnostics(),
            **self._writes.diagnostics(),
            "compacted_revision": self._membership.compacted,
            "snapshots_installed": self.snapshots_installed,
            "publish_budget": self._writes.budget.report(window),
            **self._applier.cost.report(window),
            "apply_error": self._applier.error,
            "entry_format": self._writes.entry_version,
            "intake_open": (self._lane is not None and self._intake is not None
                            and self._intake.open_for(self._lane)),
            "intake": self._intake.describe() if self._intake is not None else None,
            "failure": None if failure is None else str(failure),
            "clock": self._clock.diagnostics(),
        }

    async def open_snapshot(self) -> SnapshotStream:
        """This node's committed data at its applied revision, for a peer to install."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, self._capture_snapshot)

    def _capture_snapshot(self) -> SnapshotStream:
        return SnapshotStream.capture(self.broker, {"cluster": self.cluster,
                                                    "revision": self._progress.covered})

    def _quorum_read(self, response: Any) -> None:
        """A quorum read also tells how far etcd and the log key are (writer's callback)."""
        # Reads answer out of order (the monitor's and the read barriers'): never go back.
        self._etcd_revision = max(self._etcd_revision, int(response.header.revision))
        self._quorum_reads += 1
        if response.kvs:
            self._log_revision = max(self._log_revision, int(response.kvs[0].mod_revision))
        # Nothing in the log after what is applied: everything through here is covered.
        self._progress.cover_idle(self._log_revision, self._etcd_revision)
        if self._progress.applied < self._log_revision:
            self._applier.hurry()  # whether this node is caught up is judged by it: no linger

    # -- health, membership, compaction -----------------------------------------------------

    async def _supervised(self, what: str, step: Callable[[], Awaitable[None]],
                          interval: float, *, aligned: bool = False) -> None:
        """Run ``step`` every ``interval`` until cancelled; a failure is logged, never fatal.
        ``aligned``: at the multiples of ``interval`` on the loop's clock, as the same step
        of the node's other logs (their quorum reads then go to etcd as one)."""
        while True:
            await (aligned_sleep(interval) if aligned else asyncio.sleep(interval))
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, MessagingError, OSError, ValueError) as err:
                self._startup.log(self._quiet, what, logging.WARNING, "%s: %s", what,
                                  describe(err))
            except Exception:
                self._quiet.log(what, logging.ERROR, "%s failed", what, exc_info=True)

    async def _monitor(self) -> None:
        """Check quorum, restart a stuck watch, checkpoint an idle node."""
        with contextlib.suppress(ClusterUnavailableError):
            await self._writes.check_quorum()
        self._startup.check(self.not_ready())
        self._watch.restart_if_stuck(time.monotonic(), self._log_revision)
        held = self._applier.held_at
        if held and self._applier.failure is None \
                and await self._client.compacted_past(self._log_key, held):
            log.warning("%s: etcd's history is compacted past revision %d, which this node "
                        "cannot apply (%s): catching up from a peer's snapshot",
                        self._log_key.decode(), held, self._applier.held)
            self._watch.install_now(held + 1)
        if self._applier.failure is None and self._checkpoints.may_be_due():
            await asyncio.get_running_loop().run_in_executor(self._writer,
                                                             self._checkpoints.if_due)
