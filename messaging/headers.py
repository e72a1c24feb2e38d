"""The HTTP header names of the broker's API, shared by the server (``messaging.http``) and the
clients (``messaging.client``, ``messaging.spark``): one table, so both sides spell them alike.

This module imports nothing from the package: every room may use it (the error hierarchy in
:mod:`messaging.errors` too, which writes the error answer's headers and reads them back).
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
#: On a 409 for a sequence gap: the sequence expected and the one received.
PRODUCER_EXPECTED_SEQ_HEADER = "Producer-Expected-Seq"
PRODUCER_RECEIVED_SEQ_HEADER = "Producer-Received-Seq"

#: Every error answer: the error message (also the text/plain body).
ERROR_HEADER = "X-Broker-Error"
#: A 410 answer: the first index still available, and the topic.
FIRST_INDEX_HEADER = "X-Broker-First-Index"
TOPIC_HEADER = "X-Broker-Topic"
#: A 410 for a deleted topic: the broker index its deletion took.
DELETED_AT_HEADER = "X-Broker-Deleted-At"

#: Durable Streams: a closed stream, and the offset to read from next.
STREAM_CLOSED_HEADER = "Stream-Closed"
STREAM_NEXT_OFFSET_HEADER = "Stream-Next-Offset"
#: Durable Streams: a read's cursor (for caches to collapse readers) and whether it reached
#: the tail; an append's writer sequence; a create's expiry (seconds to live, or a time) and
#: fork (the source stream, its offset and a sub-offset inside one append); how SSE data of a
#: binary stream is encoded.
STREAM_CURSOR_HEADER = "Stream-Cursor"
STREAM_UP_TO_DATE_HEADER = "Stream-Up-To-Date"
STREAM_SEQ_HEADER = "Stream-Seq"
STREAM_TTL_HEADER = "Stream-TTL"
STREAM_EXPIRES_AT_HEADER = "Stream-Expires-At"
STREAM_FORKED_FROM_HEADER = "Stream-Forked-From"
STREAM_FORK_OFFSET_HEADER = "Stream-Fork-Offset"
STREAM_FORK_SUB_OFFSET_HEADER = "Stream-Fork-Sub-Offset"
STREAM_SSE_DATA_ENCODING_HEADER = "Stream-SSE-Data-Encoding"
#: A read's entity tag, spelled as the Durable Streams protocol spells it.
ETAG_HEADER = "ETag"

#: A cluster node's snapshot: the etcd revision it reflects.
REVISION_HEADER = "X-Messaging-Revision"
#: A cluster of topic groups: the node that served a request (its advertised URL), and the
#: mark of a request one node forwarded to another (never forwarded again).
NODE_HEADER = "X-Messaging-Node"
FORWARDED_HEADER = "X-Messaging-Forwarded"

#: Standard HTTP headers the clients set or read by name (``messaging.client``, ``messaging.cli``).
CONTENT_TYPE_HEADER = "Content-Type"
#: Where a 307 sends a request (the leader).
LOCATION_HEADER = "Location"
#: ``Bearer TOKEN`` on every request of a client given a token.
AUTHORIZATION_HEADER = "Authorization"
