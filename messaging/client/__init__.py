"""The Python client: :class:`Client` (publish, read, heartbeat, consumers, failover),
:class:`Conn` (follow a topic), idempotent producers, transactional consumers and journals."""

from messaging.client.client import Client
from messaging.client.conn import Conn

__all__ = ["Client", "Conn"]
