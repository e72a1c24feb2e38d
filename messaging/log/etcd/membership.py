"""Cluster membership in etcd: registration under a lease, the live node list, compaction.

Each broker node keeps ``/messaging/<cluster>/nodes/<advertise URL>`` = ``{url,
durable_revision, entry_version}`` (and ``intake_store``, the object store it reads intake
objects from, when it has one; ``kafka``, the address of its Kafka listener, when it has
one) bound to a lease it keeps alive; the key vanishes a few seconds after the node dies (or
at once when it stops cleanly). The logs of the topic groups a node holds in one etcd
cluster share one lease (:class:`SharedLease`, kept alive once a second for all of them) and
read their node lists together (one request a tick). The live nodes are the ones registered.
The first live node by URL compacts etcd's history below the smallest durable revision of
every node registered in this etcd (compaction is etcd-wide, so every messaging cluster
counts): any node may do it, one at a time, and repeating it is harmless. The nodes'
announced entry formats move the cluster's active one
(:mod:`messaging.log.etcd.entry_format`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from messaging.aio import cancel_and_wait
from messaging.errors import MessagingError
from messaging.log.etcd import entry_format
from messaging.log.etcd.client import QUICK_TIMEOUT, EtcdClient
from messaging.log.etcd.quorum_reads import QuorumReads

log = logging.getLogger(__name__)

LEASE_TTL = 5
#: A changed durable revision is re-registered at most this often (each put is a revision).
REGISTER_INTERVAL = 5.0
_ROOT = b"/messaging/"
#: A shared lease is kept alive at most this often, however many registrations ask.
KEEP_EVERY = 0.5


class SharedLease:
    """One lease for every registration a node keeps in one etcd cluster (on the loop).

    Whoever asks for it while it was kept alive within KEEP_EVERY gets it at once; otherwise
    one keep-alive (or grant) runs for everyone who asks meanwhile. Registrations a log could
    not delete when it left are deleted again before each keep-alive, so none outlives its
    log by more than a second while the lease lives (it would pin compaction)."""

    def __init__(self, client: EtcdClient) -> None:
        self.client = client
        #: The lease (0: none yet, or it expired).
        self.id = 0
        self._kept_at = float("-inf")
        self._renewing: asyncio.Task[int] | None = None
        self._left: set[bytes] = set()  # registrations to delete again
        #: Keep-alives sent and leases granted so far.
        self.keep_alives = 0
        self.grants = 0

    async def current(self) -> int:
        """A live lease: kept alive now unless that was done within KEEP_EVERY; a new one
        when it expired (whoever holds keys under the old one registers again)."""
        if self.id and time.monotonic() - self._kept_at < KEEP_EVERY:
            return self.id
        if self._renewing is None:
            task = asyncio.get_running_loop().create_task(self._renew(),
                                                          name="messaging-etcd-lease")
            task.add_done_callback(_retrieved)  # a failure nobody waits for any more
            self._renewing = task
        return await asyncio.shield(self._renewing)

    def left_behind(self, key: bytes) -> None:
        """A registration its log could not delete: delete it again at the next renewal."""
        self._left.add(key)

    def keep(self, key: bytes) -> None:
        """``key`` is registered again (its group came back to this node): not to delete."""
        self._left.discard(key)

    async def _renew(self) -> int:
        try:
            lease = await self._kept_alive()
            for key in sorted(self._left):  # after the keep-alive: never delaying it
                if key not in self._left:
                    continue  # registered again meanwhile
                with contextlib.suppress(grpc.aio.AioRpcError, MessagingError):
                    await self.client.delete(key)
                    self._left.discard(key)
            return lease
        finally:
            self._renewing = None

    async def _kept_alive(self) -> int:
        if self.id:
            self.keep_alives += 1
            if await self.client.keep_alive(self.id) > 0:
                self._kept_at = time.monotonic()
                return self.id
            log.warning("this node's lease in etcd expired; registering again")
            self.id = 0
        self.id = await self.client.grant_lease(LEASE_TTL)
        self.grants += 1
        self._kept_at = time.monotonic()
        return self.id

    async def revoke(self) -> None:
        """Revoke the lease: every registration under it vanishes at once."""
        if self._renewing is not None:
            await cancel_and_wait(self._renewing)
            self._renewing = None  # (a task cancelled before it ran never reached its finally)
        self._left.clear()
        if self.id:
            lease, self.id = self.id, 0
            await self.client.revoke_lease(lease)


def _retrieved(task: asyncio.Task[int]) -> None:
    if not task.cancelled():
        task.exception()


class Membership:
    """This node's registration and what it knows of the others."""

    def __init__(self, client: EtcdClient, cluster: str, url: str,
                 durable_revision: Callable[[], int], compact_every: int, *,
                 kind: str = "nodes", lease: SharedLease | None = None,
                 reads: QuorumReads | None = None) -> None:
        """``kind``: ``nodes`` for the appliers of one command log (their durable revisions
        bound compaction); ``members`` for a cluster of topic groups' node list. ``lease``
        and ``reads``: the node's shared lease and gathered reads for this etcd cluster (None:
        a lease of its own, and reads alone)."""
        self.client = client
        self._shared_lease = lease
        self._reads = reads
        self.url = url
        self.compact_every = compact_every
        self._durable_revision = durable_revision
        self._prefix = nodes_prefix(cluster, kind)
        self._name = f"cluster {cluster}" if kind == "nodes" else f"cluster {cluster} {kind}"
        self._cluster = cluster
        self._kind = kind
        #: The log entry format the cluster writes (nodes of a log only; see entry_format).
        self.entry_version = entry_format.BASE_VERSION
        #: The object store this node reads intake objects from (announced; None: none).
        self.intake_store: str | None = None
        #: Where this node serves Kafka clients (announced; None: it does not).
        self.kafka: str | None = None
        self._key = self._prefix + url.encode()
        self.lease = 0
        self._registered: str | None = None
        self._registered_at = float("-inf")
        #: Live nodes of this cluster: URL → registered value.
        self.nodes: dict[str, dict[str, Any]] = {}
        #: The revision this node last compacted etcd at (0: not yet).
        self.compacted = 0
        self._orphans: list[bytes] = []  # group logs without a node, as last seen

    def urls(self) -> list[str]:
        """The live nodes' URLs, this one included."""
        return sorted({*self.nodes, self.url})

    async def step(self) -> None:
        """Keep the lease and registration, refresh the node list, move the entry format
        up when every node reads the newer one, compact when due."""
        await self.register()
        await self.refresh()
        if self._kind == "nodes" and self.entry_version < entry_format.ENTRY_VERSION:
            # Until the newest format is active (it never moves down): then nothing to read.
            active = await entry_format.active_version(self.client, self._cluster)
            self.entry_version = await entry_format.advance(
                self.client, self._cluster, max(active, self.entry_version),
                [*self.nodes.values(), self._announcement()])
        await self.maybe_compact()

    def _announcement(self) -> dict[str, Any]:
        """What this node registers."""
        found = {"url": self.url, "durable_revision": self._durable_revision(),
                 "entry_version": entry_format.ENTRY_VERSION}
        if self.intake_store is not None:
            found["intake_store"] = self.intake_store
        if self.kafka is not None:
            found["kafka"] = self.kafka
        return found

    def announce_kafka(self, address: str) -> None:
        """Announce this node's Kafka listener at its next registration (at once)."""
        self.kafka = address
        self._registered_at = float("-inf")

    def kafka_addresses(self) -> list[str]:
        """The Kafka listeners of the live nodes (this one's included once announced)."""
        found = {info["kafka"] for info in self.nodes.values() if info.get("kafka")}
        if self.kafka is not None:
            found.add(self.kafka)
        return sorted(found)

    def read_intake(self, store: str | None) -> bool:
        """Whether every live node announces that it reads intake objects from ``store``
        (the intake lane writes pointers only then); False until a read of the node list
        has shown this node's own registration (before, nobody is known)."""
        return store is not None and self.url in self.nodes and all(
            info.get("intake_store") == store for info in self.nodes.values())

    async def register(self) -> None:
        """Keep the lease alive (a new one if it expired) and the registration current."""
        if self._shared_lease is not None:
            self._shared_lease.keep(self._key)  # before the renewal that would delete it
            lease = await self._shared_lease.current()
            if lease != self.lease:
                self.lease, self._registered = lease, None
        elif self.lease:
            ttl = await self.client.keep_alive(self.lease)
            if ttl <= 0:
                log.warning("lease of %s expired; registering again", self.url)
                self.lease = 0
        if not self.lease:  # (a shared lease is never 0 here)
            self.lease = await self.client.grant_lease(LEASE_TTL)
            self._registered = None
        value = json.dumps(self._announcement(), sort_keys=True)
        now = time.monotonic()
        if value != self._registered and (self._registered is None
                                          or now - self._registered_at >= REGISTER_INTERVAL):
            await self.client.put(self._key, value.encode(), lease=self.lease,
                                  timeout=2 * QUICK_TIMEOUT)
            self._registered = value
            self._registered_at = now

    async def refresh(self) -> None:
        """Read the live nodes of this cluster (membership changes are logged)."""
        if self._reads is not None:
            nodes = registrations(await self._reads.read(self._prefix, prefix=True))
        else:
            nodes = await self._read_nodes(self._prefix)
        joined = sorted(set(nodes) - set(self.nodes) - {self.url})
        left = sorted(set(self.nodes) - set(nodes) - {self.url})
        if joined:
            log.info("%s: nodes joined: %s", self._name, ", ".join(joined))
        if left:
            log.info("%s: nodes left: %s", self._name, ", ".join(left))
        self.nodes = nodes

    async def maybe_compact(self) -> None:
        """If this is the first live node, compact below every node's durable revision."""
        live = sorted(self.nodes)
        if not live or live[0] != self.url:
            return
        # The target is the least durable revision of every node, this one's included: while
        # even this one's is not far enough past the last compaction, nothing can be due, and
        # the reads of every cluster's registrations (one per group log, every second) are
        # skipped. (They made an idle node's cost grow with the square of its groups.)
        if self._durable_revision() - self.compacted < self.compact_every:
            return
        floors = await self._durable_revisions()
        if not floors:
            return
        target = min(floors)
        if target - self.compacted < self.compact_every:
            return
        await self.client.compact(target)
        self.compacted = target
        log.info("compacted etcd's history below revision %d", target)

    async def leave(self) -> None:
        """Leave at once: revoke this registration's lease, or delete it from a shared one
        (which the node's other logs keep; one that cannot be deleted now is deleted at the
        lease's next renewal)."""
        if self._shared_lease is not None:
            self._registered = None
            self.lease = 0
            try:
                await self.client.delete(self._key)
            except (grpc.aio.AioRpcError, MessagingError):
                self._shared_lease.left_behind(self._key)
                raise
        elif self.lease:
            await self.client.revoke_lease(self.lease)
            self.lease = 0

    async def _durable_revisions(self) -> list[int]:
        """The durable revision of every node registered in this etcd, in any cluster; none
        (no compaction) while the log of a topic group has no node registered: its holders
        may all be gone, and whoever holds it next replays it from etcd."""
        keys = await self.client.get(_ROOT, keys_only=True, prefix=True)
        clusters = {parts[2] for kv in keys.kvs
                    if len(parts := kv.key.split(b"/")) > 4 and parts[3] == b"nodes"}
        orphans = sorted({parts[2] for kv in keys.kvs
                          if len(parts := kv.key.split(b"/")) == 4 and parts[3] == b"log"
                          and b"~g" in parts[2]} - clusters)
        if orphans:
            if orphans != self._orphans:
                log.warning("not compacting etcd: no node applies the log of %s now (a "
                            "removed cluster's keys: etcdctl del --prefix /messaging/NAME)",
                            ", ".join(o.decode() for o in orphans))
            self._orphans = orphans
            return []
        self._orphans = orphans
        floors: list[int] = []
        for cluster in sorted(clusters):
            nodes = await self._read_nodes(_ROOT + cluster + b"/nodes/")
            floors.extend(int(info["durable_revision"]) for info in nodes.values())
        return floors

    async def _read_nodes(self, prefix: bytes) -> dict[str, dict[str, Any]]:
        return await read_nodes(self.client, prefix)


def nodes_prefix(cluster: str, kind: str = "nodes") -> bytes:
    """Where the registrations of ``cluster``'s nodes (or members) are kept."""
    return _ROOT + cluster.encode() + b"/" + kind.encode() + b"/"


async def read_nodes(client: EtcdClient, prefix: bytes) -> dict[str, dict[str, Any]]:
    """The registrations under ``prefix``: URL → {url, durable_revision, entry_version,
    intake_store, kafka} (entry_format.BASE_VERSION for a node that announces none: an older
    release; intake_store None for a node without an object store)."""
    return registrations(await client.get(prefix, prefix=True))


def registrations(response: Any) -> dict[str, dict[str, Any]]:
    """The registrations in a range response of a nodes prefix (see :func:`read_nodes`)."""
    nodes = {}
    for kv in response.kvs:
        try:
            info = json.loads(kv.value)
            nodes[str(info["url"])] = {"url": str(info["url"]),
                                       "durable_revision": int(info["durable_revision"]),
                                       "entry_version": entry_format.announced(info),
                                       "intake_store": info.get("intake_store"),
                                       "kafka": info.get("kafka")}
        except (ValueError, KeyError, TypeError):
            continue  # not ours: ignore it
    return nodes
