"""Produce: each partition's record batches become one publish command of the partition's topic.

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
from array import array
from typing import Any

from messaging.broker.commands import Command
from messaging.broker.view import BrokerView
from messaging.errors import MessagingError
from messaging.frames import HEADER_SIZE, encode
from messaging.kafka import protocol as p
from messaging.kafka.errors import kafka_code
from messaging.kafka.records import CodecError, RecordError, produced_batches
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
        if request.get("transactional_id") is not None:
            code: int | None = p.UNSUPPORTED_FOR_MESSAGE_FORMAT
        else:
            code = None if acks in (0, 1, -1) else p.INVALID_REQUIRED_ACKS
        jobs: list[tuple[str, int, asyncio.Future[dict[str, Any]]]] = []
        for topic in request["topics"]:
            for part in topic["partitions"]:
                if code is not None:
                    done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop(
                    ).create_future()
                    done.set_result(_failed(part["partition"], code, "transactions are not "
                                            "supported" if acks in (0, 1, -1) else
                                            f"invalid acks {acks}: 0, 1 or -1 (all)"))
                    jobs.append((topic["topic"], part["partition"], done))
                    continue
                jobs.append((topic["topic"], part["partition"], asyncio.ensure_future(
                    self._partition(topic["topic"], part["partition"], part["messages"]))))
        answers = await asyncio.gather(*(job for _, _, job in jobs))
        if acks == 0:
            return None
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (name, _, _), answer in zip(jobs, answers, strict=True):
            by_topic.setdefault(name, []).append(answer)
        return {"topics": [{"topic": name, "partitions": parts}
                           for name, parts in by_topic.items()]}

    async def _partition(self, name: str, partition: int, data: bytes | None,
                         ) -> dict[str, Any]:
        topic_id = self.topics.topic_id(name, partition)
        if topic_id is None:
            topic_id = await self._auto_create(name, partition)
        if topic_id is None:
            return _failed(partition, p.UNKNOWN_TOPIC_OR_PARTITION,
                           f"topic {name!r} has no partition {partition}")
        try:
            command = self._command(topic_id, data or b"")
        except CodecError as err:
            return _failed(partition, p.UNSUPPORTED_COMPRESSION_TYPE, str(err))
        except RecordError as err:
            return _failed(partition, p.CORRUPT_MESSAGE, str(err))
        except _TooLarge as err:
            return _failed(partition, p.MESSAGE_TOO_LARGE, str(err))
        if command is None:
            return _failed(partition, p.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                           "idempotent produce is not offered by this broker: set "
                           "enable.idempotence=false")
        try:
            result = await self.log.apply(command)
        except MessagingError as err:
            log.warning("Kafka produce to %s/%d (topic %d) failed: %s", name, partition,
                        topic_id, err)
            return _failed(partition, kafka_code(err), str(err))
        topic = self.broker.topic(topic_id)
        return {"partition": partition, "error_code": p.NONE, "offset": result.first,
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

    def _command(self, topic_id: int, data: bytes) -> Command | None:
        """The publish command of one partition's records (None: idempotent batches)."""
        parts: list[bytes] = []
        offsets: array[int] = array("q")
        at = 0
        for batch in produced_batches(data):
            if batch.producer_id >= 0:
                return None
            for record in batch.records:
                type_, message = record.message()
                if len(message) > self.max_message_size:
                    raise _TooLarge(f"a record of {len(message)} bytes exceeds the maximum "
                                    f"of {self.max_message_size}")
                offsets.append(at)
                parts.append(encode(type_, topic_id, message))
                at += HEADER_SIZE + len(message)
        if not parts:
            raise RecordError("a produce without records")
        return Command.of(b"".join(parts), offsets, topic_id)


class _TooLarge(Exception):
    pass


def _failed(partition: int, code: int, message: str) -> dict[str, Any]:
    return {"partition": partition, "error_code": code, "offset": -1, "timestamp": -1,
            "log_start_offset": -1, "error_message": message}
