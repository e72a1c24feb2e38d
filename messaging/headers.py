"""The HTTP header names of the broker's API, shared by the server (``messaging.http``) and the
clients (``messaging.client``, ``messaging.spark``): one table, so both sides spell them alike.

This module imports nothing from the package: every room may use it. The error answer's own
headers (``X-Broker-Error``, ``X-Broker-First-Index``, ``X-Broker-Topic``) stay with the error
hierarchy in :mod:`messaging.errors`, which also reads them back (``error_for_status``).
"""

from __future__ import annotations

#: The index a publish was stored at (the last of a batch); on a read, the topic's last
#: committed index when the read started.
INDEX_HEADER = "X-Broker-Index"
#: ``true`` on the answer to an idempotent publish that was already stored (a retry).
DUPLICATE_HEADER = "X-Broker-Duplicate"
#: On a read by consumer: the stored position the read started after (0: a new consumer).
CONSUMER_INDEX_HEADER = "X-Broker-Consumer-Index"

#: An idempotent producer: its id, epoch and sequence number (all three or none), on a
#: publish; the answer repeats the epoch and sequence it was stored under.
PRODUCER_ID_HEADER = "Producer-Id"
PRODUCER_EPOCH_HEADER = "Producer-Epoch"
PRODUCER_SEQ_HEADER = "Producer-Seq"
