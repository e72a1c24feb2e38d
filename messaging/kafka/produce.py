"""Produce: each partition's record batches become one publish command of the partition's topic.

An idempotent producer (InitProducerId) is one of the project's idempotent producers on each
partition: its id, epoch and a batch's base sequence, the batch taking one sequence number
per record; a batch sent again is stored once, across a crash too, since the producer table
is committed with the frames. Sequence numbers are taken as growing (Kafka's wrap after 2^31
per partition and producer is not handled).

``acks`` maps onto the project's one promise: the broker answers a publish once it is durable
(fsynced, or committed by etcd in a cluster) and applied, so acks=1 and acks=all both get that
answer, exactly an HTTP 200's; acks=0 gets no answer, as Kafka has it, but the records are
stored alike. The partitions of one request are published side by side, so they share the
log's group commits. A record's offset is its message's index: one publish's messages take
consecutive indexes, so the answer's base offset places every record of the batch.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from messaging.broker.commands import ApplyResult, produce
from messaging.broker.view import BrokerView
from messaging.errors import MessagingError
from messaging.kafka import protocol as p
from messaging.kafka.access import allowed
from messaging.kafka.errors import kafka_code
from messaging.kafka.records import (
    CodecError,
    ProducedBatch,
    RecordError,
    RecordsTooLarge,
    joined,
    produced_batches,
)
from messaging.kafka.topics import KafkaTopics, TopicError
from messaging.log.base import Log

log = logging.getLogger(__name__)


class Producing:
    """The Produce API over one broker and its log."""

    def __init__(self, broker: BrokerView, log_: Log, topics: KafkaTopics,
                 max_message_size: int, auto_create: bool) -> None:
        self.broker = broker
        self.log = log_
        self.topics = topics
        self.max_message_size = max_message_size
        self.auto_create = auto_create

    async def produce(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Store every partition's records; the response (None for acks=0)."""
        acks = request["required_acks"]
        parts = [(t["topic"], part) for t in request["topics"] for part in t["partitions"]]
        refusal = (f"invalid acks {acks}: 0, 1 or -1 (all)" if acks not in (0, 1, -1)
                   else "transactions are not supported"
                   if request.get("transactional_id") is not None else None)
        if refusal is not None:
            code = (p.INVALID_REQUIRED_ACKS if acks not in (0, 1, -1)
                    else p.UNSUPPORTED_FOR_MESSAGE_FORMAT)
            answers = [_failed(part["partition"], code, refusal) for _, part in parts]
        else:  # side by side: the partitions share the log's group commits
            answers = await asyncio.gather(*(
                self._partition(name, part["partition"], part["messages"])
                for name, part in parts))
        if acks == 0:
            return None
        return {"topics": p.by_topic([(name, answer) for (name, _), answer
                                      in zip(parts, answers, strict=True)])}

    async def _partition(self, name: str, partition: int, data: bytes | None,
                         ) -> dict[str, Any]:
        if not allowed("write", name):
            return _failed(partition, p.TOPIC_AUTHORIZATION_FAILED,
                           f"this token may not write to {name!r}")
        topic_id = self.topics.topic_id(name, partition)
        if topic_id is None:
            topic_id = await self._auto_create(name, partition)
        if topic_id is None:
            return _failed(partition, p.UNKNOWN_TOPIC_OR_PARTITION,
                           f"topic {name!r} has no partition {partition}")
        try:
            batches = produced_batches(data or b"", topic_id)
            commands = self._commands(topic_id, batches)
        except CodecError as err:
            return _failed(partition, p.UNSUPPORTED_COMPRESSION_TYPE, str(err))
        except RecordsTooLarge as err:
            return _failed(partition, p.MESSAGE_TOO_LARGE, str(err))
        except RecordError as err:
            return _failed(partition, p.CORRUPT_MESSAGE, str(err))
        except _TooLarge as err:
            return _failed(partition, p.MESSAGE_TOO_LARGE, str(err))
        first = -1
        for command, batch in commands:
            try:
                result = await self.log.apply(command)
            except MessagingError as err:
                code = kafka_code(err)
                if code not in _EXPECTED:
                    log.warning("Kafka produce to %s/%d (topic %d) failed: %s", name,
                                partition, topic_id, err)
                return _failed(partition, code, str(err))
            offset = _offset(result, batch)
            if offset is None:  # an older batch than the last one stored, sent again
                return _failed(partition, p.DUPLICATE_SEQUENCE_NUMBER,
                               "this batch was stored before")
            first = offset if first < 0 else first
        topic = self.broker.topic(topic_id)
        return {"partition": partition, "error_code": p.NONE, "offset": first,
                "timestamp": -1,
                "log_start_offset": topic.first_index if topic is not None else -1}

    async def _auto_create(self, name: str, partition: int) -> int | None:
        """Create a topic of one partition on its first produce (Kafka's default)."""
        if not self.auto_create or self.topics.partitions(name):
            return None
        try:
            await self.topics.create(name, 1, {})
        except TopicError as err:
            if err.code != p.TOPIC_ALREADY_EXISTS:
                log.info("Kafka topic %r not created on produce: %s", name, err)
                return None
        return self.topics.topic_id(name, partition)

    def _commands(self, topic_id: int, batches: list[ProducedBatch],
                  ) -> list[tuple[bytes, ProducedBatch | None]]:
        """The publish commands of one partition's batches: all in one, or one per batch of
        an idempotent producer (each deduplicated by its sequence numbers)."""
        if not batches:
            raise RecordError("a produce without records")
        largest = max(batch.largest for batch in batches)
        if largest > self.max_message_size:
            raise _TooLarge(f"a record of {largest} bytes exceeds the maximum of "
                            f"{self.max_message_size}")
        if all(b.producer_id < 0 for b in batches):
            return [(joined(topic_id, [b.frames for b in batches]), None)]
        now = time.time()
        commands: list[tuple[bytes, ProducedBatch | None]] = []
        for batch in batches:
            if batch.producer_id < 0:
                commands.append((batch.frames, None))
                continue
            producer = (str(batch.producer_id), batch.producer_epoch, batch.base_sequence)
            commands.append((produce(topic_id, producer, now, batch.frames, span=batch.count),
                             batch))
        return commands


def init_producer_id(request: dict[str, Any]) -> dict[str, Any]:
    """InitProducerId: a new idempotent producer, a fresh id (random 62 bits: unique without a
    registry, and never reused across restarts) at epoch 0. Transactions are not offered."""
    if request.get("transactional_id") is not None:
        return {"error_code": p.UNSUPPORTED_FOR_MESSAGE_FORMAT, "producer_id": -1,
                "producer_epoch": -1}
    return {"error_code": p.NONE, "producer_id": secrets.randbits(62) + 1,
            "producer_epoch": 0}


def _offset(result: ApplyResult, batch: ProducedBatch | None) -> int | None:
    """The base offset of a stored batch; None for a duplicate older than the last one stored
    (whose offsets the producer table no longer holds)."""
    outcome = result.stream
    if batch is None or outcome is None or not outcome.duplicate:
        return outcome.first if outcome is not None and batch is not None else result.first
    last_seq = batch.base_sequence + batch.count - 1
    if outcome.producer is not None and outcome.producer[1] == last_seq:
        return outcome.first
    return None


#: Errors a producer expects and acts on (logged at no level).
_EXPECTED = frozenset({p.OUT_OF_ORDER_SEQUENCE_NUMBER, p.INVALID_PRODUCER_EPOCH,
                       p.UNKNOWN_PRODUCER_ID, p.MESSAGE_TOO_LARGE})


class _TooLarge(Exception):
    pass


def _failed(partition: int, code: int, message: str) -> dict[str, Any]:
    return {"partition": partition, "error_code": code, "offset": -1, "timestamp": -1,
            "log_start_offset": -1, "error_message": message}
