"""The broker's errors as Kafka error codes."""

from __future__ import annotations

from messaging.errors import (
    BrokerClosedError,
    ClusterNoSpaceError,
    ClusterUnavailableError,
    CommitUnknownError,
    CorruptFrameError,
    MessageTooLargeError,
    MessagingError,
    NoLeaderError,
    NotFoundError,
    ProducerFencedError,
    ProducerSequenceGapError,
    StorageError,
    TopicTruncatedError,
)
from messaging.kafka import protocol as p

#: Most specific first: the first class an error is an instance of decides.
_CODES: tuple[tuple[type[MessagingError], int], ...] = (
    (ProducerFencedError, p.INVALID_PRODUCER_EPOCH),
    (ProducerSequenceGapError, p.OUT_OF_ORDER_SEQUENCE_NUMBER),
    (MessageTooLargeError, p.MESSAGE_TOO_LARGE),
    (CorruptFrameError, p.CORRUPT_MESSAGE),
    (TopicTruncatedError, p.OFFSET_OUT_OF_RANGE),
    (NotFoundError, p.UNKNOWN_TOPIC_OR_PARTITION),
    (StorageError, p.KAFKA_STORAGE_ERROR),
    (ClusterNoSpaceError, p.KAFKA_STORAGE_ERROR),
    (CommitUnknownError, p.REQUEST_TIMED_OUT),
    (NoLeaderError, p.NOT_ENOUGH_REPLICAS),
    (ClusterUnavailableError, p.NOT_ENOUGH_REPLICAS),
    (BrokerClosedError, p.LEADER_NOT_AVAILABLE),
)


def kafka_code(err: MessagingError) -> int:
    """The Kafka error code a client acts on for a broker error (retriable ones where the
    broker's are: storage, cluster, shutting down)."""
    if isinstance(err, ProducerSequenceGapError) and err.expected == 0:
        return p.UNKNOWN_PRODUCER_ID  # the partition has no state for it (new, or forgotten)
    for cls, code in _CODES:
        if isinstance(err, cls):
            return code
    return p.UNKNOWN_SERVER_ERROR
