"""RaftLog: the Log protocol on pysyncobj, for a replicated cluster.

A Raft command is a whole publish batch (a buffer of frames); pysyncobj commits it on a
majority and every node applies it to its own Broker in the same order, so every node assigns
the same indexes and holds the same topic files. pysyncobj runs its own thread; results come
back to asyncio through ``call_soon_threadsafe``, so the event loop never blocks on Raft.

Log compaction snapshots the broker (``Broker.write_snapshot``) through pysyncobj's
serializer hooks; a new or far-behind node installs that snapshot, then replays the rest.
A restarting node replays its journal from its last snapshot: indexes are reassigned
identically and frames its topics already hold are skipped as stale.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from messaging.broker import ApplyResult, Broker, heartbeat_command
from messaging.errors import BadRequestError, CommitUnknownError, MessagingError, NoLeaderError
from messaging.local_log import DeferredSync
from messaging.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: How long a write may wait for its commit before the outcome is reported unknown.
COMMIT_TIMEOUT = 10.0
HEARTBEAT_FLUSH_INTERVAL = 0.5
_LENGTH = struct.Struct(">Q")
# Outcomes after which the command is certainly not in the log (safe to retry elsewhere).
_NOT_APPENDED = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.REQUEST_DENIED}

Callback = Callable[[Any, int], None]


class _Node(SyncObj):  # type: ignore[misc]
    """The replicated object: its ``@replicated`` methods run on every node, in log order."""

    def __init__(self, owner: RaftLog, self_address: str, partners: list[str],
                 conf: SyncObjConf) -> None:
        self._owner = owner  # set first: pysyncobj may replay the journal inside __init__
        super().__init__(self_address, partners, conf)

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, command: bytes) -> tuple[int, int]:
        return self._owner._apply_committed(command)

    @replicated  # type: ignore[untyped-decorator]
    def register_url(self, raft_address: str, url: str) -> None:
        self._owner._urls[raft_address] = url


class RaftLog:
    """The Log protocol over a pysyncobj Raft cluster."""

    def __init__(self, broker: Broker, url: str, raft_bind: str, peers: list[str], *,
                 data: Path, snapshot_entries: int = 20_000,
                 heartbeat_interval: float = HEARTBEAT_FLUSH_INTERVAL) -> None:
        self.broker = broker
        self.url = url
        self.address = raft_bind
        self.peers = [p for p in peers if p != raft_bind]
        self.data = data
        self.snapshot_entries = snapshot_entries
        self.heartbeat_interval = heartbeat_interval
        self.snapshots_written = 0
        self.snapshots_restored = 0
        self._urls: dict[str, str] = {}
        self._unsynced = DeferredSync(broker)
        self._pending_heartbeats: dict[tuple[int, str], int] = {}
        self._node: _Node | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the Raft node (its own thread) and the periodic tasks."""
        self._loop = asyncio.get_running_loop()
        self.data.mkdir(parents=True, exist_ok=True)
        # Replay starts from the snapshot (the deserializer sets the index) or from nothing.
        self.broker.index = 0
        conf = SyncObjConf(
            journalFile=str(self.data / "journal"),
            fullDumpFile=str(self.data / "snapshot"),
            serializer=self._serialize,
            deserializer=self._deserialize,
            dynamicMembershipChange=True,
            commandsWaitLeader=False,
            logCompactionMinEntries=self.snapshot_entries,
            logCompactionMinTime=300,
            appendEntriesUseBatch=False,  # send each publish batch at once: latency
            appendEntriesBatchSizeBytes=1 << 20,
            raftMinTimeout=0.4,
            raftMaxTimeout=1.0,
            connectionTimeout=3.5,
            connectionRetryTime=0.5,
            leaderFallbackTimeout=3.0,
            sendBufferSize=4 << 20,  # publish batches are large: fewer, larger socket writes
            recvBufferSize=4 << 20,
        )
        loop = self._loop
        self._node = await loop.run_in_executor(
            None, lambda: _Node(self, self.address, self.peers, conf))
        self._tasks = [
            asyncio.create_task(self._register_loop(), name="messaging-raft-register"),
            asyncio.create_task(self._heartbeat_loop(), name="messaging-raft-heartbeats"),
            asyncio.create_task(self._unsynced.run(), name="messaging-raft-fsync"),
        ]
        log.info("raft node %s started with peers %s", self.address, self.peers)

    async def close(self) -> None:
        """Stop the periodic tasks and the Raft node, then fsync."""
        for task in self._tasks:
            await cancel_and_wait(task)
        loop = asyncio.get_running_loop()
        node = self._node
        if node is not None:
            await loop.run_in_executor(None, node.destroy_synchronous)
        await loop.run_in_executor(None, self._unsynced.flush)

    # -- the Log protocol -------------------------------------------------------------------

    async def apply(self, command: bytes) -> ApplyResult:
        """Commit ``command`` on a majority and apply it; the result comes from this node."""
        first, last = await self._call(lambda cb: self._require_node().apply_command(
            command, callback=cb))
        return ApplyResult(first, last, frozenset())

    async def heartbeat(self, topic: int, index: int, url: str) -> None:
        """Coalesced: one Raft command per interval carries every subscriber's progress."""
        key = (topic, url)
        self._pending_heartbeats[key] = max(index, self._pending_heartbeats.get(key, 0))

    def is_leader(self) -> bool:
        """Whether this node leads the cluster right now."""
        return self._node is not None and bool(self._node._isLeader())

    def leader_url(self) -> str | None:
        """The leader's advertised URL, if a leader is known and has registered."""
        node = self._node
        if node is None:
            return None
        leader = node._getLeader()
        if leader is None:
            return None
        address = leader if isinstance(leader, str) else leader.id
        return self._urls.get(address)

    def urls(self) -> list[str]:
        """Every member's advertised URL, the leader's first."""
        leader = self.leader_url()
        others = sorted(u for u in self._urls.values() if u != leader)
        return [leader, *others] if leader else others

    def diagnostics(self) -> dict[str, Any]:
        """Role, term, leader, peers, commit and applied positions."""
        node = self._node
        status: dict[str, Any] = node.getStatus() if node is not None else {}
        peers = sorted(k[len("partner_node_status_server_"):] for k in status
                       if k.startswith("partner_node_status_server_"))
        return {
            "role": "leader" if self.is_leader() else "follower",
            "leader": self.leader_url(),
            "raft_address": self.address,
            "raft_leader": str(status.get("leader")),
            "term": status.get("raft_term"),
            "commit_index": status.get("commit_idx"),
            "applied_index": status.get("last_applied"),
            "log_length": status.get("log_len"),
            "has_quorum": status.get("has_quorum"),
            "peers": peers,
            "urls": dict(self._urls),
            "snapshots_written": self.snapshots_written,
            "snapshots_restored": self.snapshots_restored,
        }

    # -- membership -------------------------------------------------------------------------

    async def add_node(self, address: str) -> None:
        """Add a Raft member (it should already be running with the members as peers)."""
        _check_address(address)
        await self._call(lambda cb: self._require_node().addNodeToCluster(address, callback=cb))

    async def remove_node(self, address: str) -> None:
        """Remove a Raft member."""
        _check_address(address)
        await self._call(lambda cb: self._require_node().removeNodeFromCluster(
            address, callback=cb))
        self._urls.pop(address, None)

    # -- internals --------------------------------------------------------------------------

    def _require_node(self) -> _Node:
        if self._node is None:
            raise NoLeaderError("the raft node is not running")
        return self._node

    async def _call(self, submit: Callable[[Callback], None]) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def done(result: Any, error: int) -> None:  # runs on the pysyncobj thread
            loop.call_soon_threadsafe(_settle, future, result, error)

        submit(done)
        try:
            return await asyncio.wait_for(future, COMMIT_TIMEOUT)
        except TimeoutError:
            raise CommitUnknownError(
                f"no commit within {COMMIT_TIMEOUT:.0f}s; the write may still be committed"
            ) from None

    def _apply_committed(self, command: bytes) -> tuple[int, int]:
        """On the pysyncobj thread, every node: apply to the broker and make it visible."""
        try:
            result = self.broker.apply(command)
        except MessagingError:
            log.exception("could not apply a committed command")
            raise
        self.broker.commit(result.topics)
        self._unsynced.add(result.topics)
        return result.first, result.last

    async def _register_loop(self) -> None:
        """Until the cluster knows this node's URL, ask the leader to record it."""
        while self._urls.get(self.address) != self.url:
            node = self._node
            if node is not None and node._getLeader() is not None:
                try:
                    await self._call(lambda cb: self._require_node().register_url(
                        self.address, self.url, callback=cb))
                except MessagingError as err:
                    log.debug("registering %s failed: %s", self.url, err)
            await asyncio.sleep(0.2)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            if not self._pending_heartbeats or not self.is_leader():
                continue
            pending, self._pending_heartbeats = self._pending_heartbeats, {}
            command = b"".join(heartbeat_command(topic, index, url)
                               for (topic, url), index in pending.items())
            try:
                await self.apply(command)
            except MessagingError as err:
                log.info("heartbeats not committed (%s); keeping them for the next round", err)
                for key, index in pending.items():
                    self._pending_heartbeats[key] = max(index,
                                                        self._pending_heartbeats.get(key, 0))

    def _serialize(self, path: str, raft_state: Any) -> None:
        """pysyncobj's serializer hook: its own state, our URL map, then the broker."""
        started = time.perf_counter()
        with open(path, "wb") as f:
            _write_blob(f, pickle.dumps((raft_state, dict(self._urls))))
            self.broker.write_snapshot(f)
        self.snapshots_written += 1
        log.info("raft snapshot written at index %d in %.2fs", self.broker.index,
                 time.perf_counter() - started)

    def _deserialize(self, path: str) -> Any:
        """pysyncobj's deserializer hook: restore the broker, hand back pysyncobj's state."""
        with open(path, "rb") as f:
            raft_state, urls = pickle.loads(_read_blob(f))
            copied = self.broker.read_snapshot(f)
        self._urls.update(urls)
        if copied:
            self.snapshots_restored += 1
        return raft_state


def _settle(future: asyncio.Future[Any], result: Any, error: int) -> None:
    if future.done():
        return
    if error == FAIL_REASON.SUCCESS:
        future.set_result(result)
    elif error in _NOT_APPENDED:
        future.set_exception(NoLeaderError(f"no leader to commit the write (raft: {error})"))
    else:
        future.set_exception(CommitUnknownError(
            f"leadership changed before the write was known to commit (raft: {error}); "
            "it may still be committed"))


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise BadRequestError(f"invalid raft address {address!r}: expected HOST:PORT")


def _write_blob(f: BinaryIO, blob: bytes) -> None:
    f.write(_LENGTH.pack(len(blob)))
    f.write(blob)


def _read_blob(f: BinaryIO) -> bytes:
    (length,) = _LENGTH.unpack(f.read(_LENGTH.size))
    return f.read(length)
