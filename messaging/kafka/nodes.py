"""The Kafka brokers a client is told about: this node, and in a cluster every live node that
serves Kafka clients (each announces its address with its registration in etcd).

A node's broker id is a hash of its advertised address, the same whoever computes it. Every
node is the leader of every partition in its own Metadata answers: it can serve them all, so
clients spread over the nodes they bootstrap from, and a node's failure is a reconnect (in a
cluster of topic groups, of its own groups' partitions: :mod:`messaging.kafka.routing`). A
consumer group has one coordinator, the same for every node: the live address its name hashes
to; when the live nodes change, a group may move, and its members are told NOT_COORDINATOR and
find it again, as after a Kafka coordinator's failover (the offsets are in the log).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from messaging.config import parse_host_port, show_address

Broker = tuple[int, str, int]  # broker id, host, port


def broker_id(address: str) -> int:
    """The broker id of a Kafka address (``HOST:PORT``): non-negative, stable."""
    return zlib.crc32(address.encode()) & 0x7FFFFFFF


class Nodes:
    """This node's Kafka address and, in a cluster, its peers'."""

    def __init__(self, host: str, port: int,
                 peers: Callable[[], list[str]] | None = None) -> None:
        self.host = host
        self.port = port
        #: The live nodes' Kafka addresses (None: a single node).
        self.peers = peers

    @property
    def address(self) -> str:
        """This node's advertised Kafka address."""
        return show_address((self.host, self.port))

    @property
    def this(self) -> Broker:
        """This node as a broker."""
        return broker_id(self.address), self.host, self.port

    def _addresses(self) -> list[str]:
        found = set(self.peers()) if self.peers is not None else set()
        found.add(self.address)
        return sorted(found)

    def brokers(self) -> list[Broker]:
        """Every live broker, this one first."""
        others = []
        for address in self._addresses():
            if address != self.address:
                host, port = parse_host_port(address)
                others.append((broker_id(address), host, port))
        return [self.this, *others]

    def coordinator(self, group: str) -> Broker:
        """The broker that coordinates ``group``."""
        addresses = self._addresses()
        address = addresses[zlib.crc32(group.encode()) % len(addresses)]
        if address == self.address:
            return self.this
        host, port = parse_host_port(address)
        return broker_id(address), host, port

    def coordinates(self, group: str) -> bool:
        """Whether this node is ``group``'s coordinator."""
        return self.coordinator(group)[0] == self.this[0]
