"""``messaging.consumer``, the public path of :mod:`messaging.client.consumer`:
exactly-once processing with application state and positions committed together."""

from messaging.client.consumer import (
    Checkpoint,
    Consumer,
    Intent,
    JSONFileStore,
    SQLiteStore,
    Store,
    Transaction,
)
from messaging.errors import ConsumerError

__all__ = ["Checkpoint", "Consumer", "ConsumerError", "Intent", "JSONFileStore",
           "SQLiteStore", "Store", "Transaction"]
