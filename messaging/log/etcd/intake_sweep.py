"""The lifetime of intake objects: kept until no node can need them, then deleted.

Every intake object (:mod:`messaging.log.etcd.intake`) has a *ticket* in the etcd cluster of
the logs it serves, ``/messaging/<cluster>/intake/<object>``, created before the object is
written; a pointer to the object commits only while the ticket is as created (version 1).
Every node that uses the intake sweeps the tickets of its etcd clusters every few seconds:

1. a ticket is *closed* (written again, version 2, at revision C) by the node that wrote
   the object once each of its pointers is committed or refused, or by the sweep once it is
   older than ``--object-sweep-grace`` (that node died first): from then on no pointer to
   its object can commit, so every pointer there will ever be is below C;
2. once etcd's history is compacted past C, the object is deleted, then its ticket. etcd is
   compacted below the smallest durable revision of every node registered in it, so by then
   every holder has applied and fsynced past every pointer to the object, and a node that
   comes back from further behind installs a peer's snapshot instead of replaying them.

An object whose publishes were never committed (its node died between the upload and the
pointer, or etcd refused the pointer) goes the same way. Since the ticket is written before
the object, the store holds no intake object without one; objects of segments (tiering) live
under other names and never depend on these. Repeating a step is harmless, so every node may
sweep: closing is conditional, deleting twice is not an error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from messaging.clock import now_ms
from messaging.errors import MessagingError
from messaging.log.etcd.client import EtcdClient, describe
from messaging.objects.errors import ObjectStoreError
from messaging.objects.store import ObjectStore
from messaging.quiet_log import RECURRING_LOG_INTERVAL, QuietLog

log = logging.getLogger(__name__)

#: Where intake objects are, in the store and (after the cluster's prefix) in etcd.
INTAKE = "intake/"
#: The sweep runs this often at most, and at least every quarter of the grace.
SWEEP_INTERVAL_MAX = 30.0
SWEEP_INTERVAL_MIN = 0.5


def ticket_prefix(cluster: str) -> bytes:
    """Where the tickets of ``cluster``'s intake objects are (a group's log: its
    cluster's)."""
    return f"/messaging/{cluster.split('~')[0]}/".encode()


def ticket_key(cluster: str, name: str) -> bytes:
    """The ticket of intake object ``name`` of ``cluster``."""
    return ticket_prefix(cluster) + name.encode()


class IntakeSweep:
    """Closes old tickets and deletes the objects no node can need any more."""

    def __init__(self, store: ObjectStore, *, grace: float) -> None:
        self.store = store
        self.grace = grace
        self.interval = max(SWEEP_INTERVAL_MIN, min(grace / 4, SWEEP_INTERVAL_MAX))
        self._clusters: dict[int, tuple[bytes, EtcdClient, int]] = {}
        self._quiet = QuietLog(log, RECURRING_LOG_INTERVAL)
        #: Tickets closed and objects deleted by this node since start; open and closed
        #: tickets at the last sweep (diagnostics).
        self.closed = 0
        self.deleted = 0
        self.open_tickets = 0
        self.closed_tickets = 0
        self.last_run: float | None = None
        self.error: str | None = None

    def watch(self, cluster: str, client: EtcdClient) -> None:
        """Sweep the tickets of ``cluster``'s etcd (one more log of this node uses it)."""
        prefix, _client, uses = self._clusters.get(id(client), (ticket_prefix(cluster),
                                                                client, 0))
        self._clusters[id(client)] = (prefix, client, uses + 1)

    def forget(self, cluster: str, client: EtcdClient, still_used: bool) -> None:
        """A log of this node stopped using ``client``'s etcd."""
        found = self._clusters.get(id(client))
        if found is None:
            return
        prefix, _client, uses = found
        if uses <= 1 or not still_used:
            del self._clusters[id(client)]
        else:
            self._clusters[id(client)] = (prefix, client, uses - 1)

    async def run(self, also: Callable[[], None] = lambda: None) -> None:
        """Sweep every ``interval`` seconds until cancelled, calling ``also`` each time (the
        node's fetched objects expire)."""
        while True:
            await asyncio.sleep(self.interval)
            also()
            for prefix, client, _uses in list(self._clusters.values()):
                try:
                    await self.step(prefix, client)
                except (grpc.aio.AioRpcError, MessagingError, ValueError) as err:
                    self.error = describe(err)
                    self._quiet.log("sweep", logging.WARNING, "sweeping intake objects: %s",
                                    self.error)

    async def step(self, prefix: bytes, client: EtcdClient) -> None:
        """One sweep of the tickets under ``prefix`` in ``client``'s etcd."""
        response = await client.get(prefix + INTAKE.encode(), prefix=True)
        now = now_ms()
        opened = closed = 0
        for kv in response.kvs:
            name = bytes(kv.key)[len(prefix):].decode()
            if int(kv.version) == 1:
                opened += 1
                if now - _opened_at(bytes(kv.value)) >= self.grace * 1000:
                    await self._close(client, bytes(kv.key), name, bytes(kv.value))
            else:
                closed += 1
                if await client.compacted_past(bytes(kv.key), int(kv.mod_revision)):
                    await self._delete(client, bytes(kv.key), name)
        self.open_tickets, self.closed_tickets = opened, closed
        self.last_run = time.time()
        self.error = None

    async def close_ticket(self, client: EtcdClient, key: bytes, name: str) -> None:
        """Close the ticket of an object whose pointers were all committed or refused (by
        the node that wrote it; a failure leaves it to the sweep, after the grace)."""
        try:
            await client.put_when(key, json.dumps({"closed": now_ms()}).encode(),
                                  unchanged=key)
        except (grpc.aio.AioRpcError, MessagingError) as err:
            self._quiet.log("close", logging.INFO, "intake object %s: its ticket was not "
                            "closed (the sweep closes it after %gs): %s", name, self.grace,
                            describe(err))

    async def _close(self, client: EtcdClient, key: bytes, name: str, value: bytes) -> None:
        try:
            info = json.loads(value)
        except ValueError:
            info = {}
        info["closed"] = now_ms()
        revision = await client.put_when(key, json.dumps(info).encode(), unchanged=key)
        if revision is not None:
            self.closed += 1
            log.info("intake object %s is older than the sweep's grace (%gs), its pointers "
                     "never all answered: none commits from revision %d on; it is deleted "
                     "once etcd is compacted past that", name, self.grace, revision)

    async def _delete(self, client: EtcdClient, key: bytes, name: str) -> None:
        try:
            await self.store.delete(name)
        except ObjectStoreError as err:
            self._quiet.log("delete", logging.WARNING, "could not delete intake object %s "
                            "(tried again at the next sweep): %s", name, err)
            return
        await client.delete(key)
        self.deleted += 1
        log.info("deleted intake object %s from %s: every node is past its pointers",
                 name, self.store.url)

    def describe(self) -> dict[str, Any]:
        """Diagnostics."""
        return {"grace_seconds": self.grace, "open_tickets": self.open_tickets,
                "closed_tickets": self.closed_tickets, "closed": self.closed,
                "deleted": self.deleted, "last_run": self.last_run, "error": self.error}


def _opened_at(value: bytes) -> int:
    """When a ticket was opened (ms since the epoch; 0 for a value that is not a ticket's,
    which is then old enough)."""
    try:
        return int(json.loads(value)["at"])
    except (ValueError, KeyError, TypeError):
        return 0
