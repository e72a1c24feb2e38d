"""The Kafka APIs over one command log: its topics, Produce, Fetch, metadata and offsets.

A single node or a cluster of one group has one face; a node of a cluster of topic groups has
one for each group it holds (:mod:`messaging.kafka.routing` sends each topic's requests to
its group's).
"""

from __future__ import annotations

from concurrent.futures import Executor

from messaging.broker.view import BrokerView
from messaging.kafka.admin import Admin
from messaging.kafka.fetch import Fetching
from messaging.kafka.groups import Coordinator
from messaging.kafka.nodes import Nodes
from messaging.kafka.offsets import Offsets
from messaging.kafka.produce import Producing
from messaging.kafka.topics import KafkaTopics
from messaging.log.base import Log


class Face:
    """One log's Kafka handlers (the coordinator and the nodes are the listener's, shared)."""

    def __init__(self, broker: BrokerView, log_: Log, *, nodes: Nodes,
                 coordinator: Coordinator, reads: Executor, max_message_size: int,
                 auto_create: bool, home: tuple[int, int] = (0, 1)) -> None:
        self.broker = broker
        self.log = log_
        self.topics = KafkaTopics(broker, log_, max_message_size, home)
        self.producing = Producing(broker, log_, self.topics, max_message_size, auto_create)
        self.fetching = Fetching(broker, self.topics, reads)
        self.admin = Admin(self.topics, nodes, auto_create)
        self.offsets = Offsets(broker, log_, self.topics, coordinator, nodes)
