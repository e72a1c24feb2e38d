"""What a node's command logs in one etcd cluster share: one client (an HTTP/2 connection
per etcd member), one watch stream (:mod:`messaging.log.etcd.watch_stream`), one gathered
quorum read per tick (:mod:`messaging.log.etcd.quorum_reads`), and one lease for their
registrations (:class:`~messaging.log.etcd.membership.SharedLease`).

A single-group cluster's log has one of its own; a node holding topic groups keeps one per
etcd cluster for the logs of every group it holds there (:class:`~messaging.cluster.node.
GroupNode`), so its cost in connections, streams and polling does not grow with its groups.
Whoever makes a share closes it, and its client.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import grpc

from messaging.errors import MessagingError
from messaging.log.etcd.client import EtcdClient
from messaging.log.etcd.membership import SharedLease
from messaging.log.etcd.quorum_reads import QuorumReads
from messaging.log.etcd.watch_stream import WatchStream


@dataclass(eq=False)
class EtcdShare:
    """The client, watch stream and quorum reads of one etcd cluster, for a node's logs."""

    client: EtcdClient
    streams: WatchStream
    quorum: QuorumReads
    lease: SharedLease

    @classmethod
    def over(cls, client: EtcdClient, endpoints: list[str]) -> EtcdShare:
        """A share over ``client`` (whose etcd cluster has ``endpoints``)."""
        return cls(client, WatchStream(client, endpoints), QuorumReads(client),
                   SharedLease(client))

    def use(self, client: EtcdClient) -> None:
        """Go on with ``client`` (a log that makes its share before it read its TLS files)."""
        self.client = self.streams.client = self.quorum.client = self.lease.client = client

    def diagnostics(self) -> dict[str, Any]:
        """The etcd endpoints; the watch stream (where, how many opened, its watches); the
        quorum read requests sent and the key reads they carried."""
        return {"endpoints": list(self.client.endpoints),
                "watch_stream": {"endpoint": self.streams.endpoint_url(),
                                 "opened": self.streams.generation,
                                 "watches": self.streams.watches()},
                "quorum_reads": {"requests": self.quorum.requests,
                                 "keys_read": self.quorum.keys_read},
                "lease": {"id": self.lease.id, "keep_alives": self.lease.keep_alives,
                          "grants": self.lease.grants}}

    async def close(self) -> None:
        """End the watch stream and the reads under way, revoke the lease (any registration
        left under it vanishes); the client stays open."""
        await self.streams.close()
        await self.quorum.close()
        with contextlib.suppress(grpc.aio.AioRpcError, MessagingError):
            await self.lease.revoke()
