"""Kafka topics as the broker's topics: a topic NAME with P partitions is P topics of the broker,
each labelled (NAME, p) by the configure command that created it (see
:mod:`messaging.broker.topic_settings`), so the mapping is replicated, journaled and in
snapshots like any setting.

A partition's topic id is taken from :data:`KAFKA_TOPIC_BASE` up: one above every id of that
range the broker knows (existing, deleted or labelled), so a deleted Kafka topic's ids are not
handed out again; in a cluster of topic groups, every partition of NAME is in the group NAME
hashes to (:func:`messaging.placement.group_of_name`), its ids the ones of that group, so the
group's state machine alone decides the name. Creating takes one command per partition, in
order: a crash in the middle leaves a topic of fewer partitions, which a repeated CreateTopics
completes. Two nodes racing
for one id cannot both win: the state machine labels only an empty, unlabelled topic, and the
loser picks the next id.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import Any

from messaging.broker.commands import configure_command, delete_command
from messaging.broker.state import (
    MAX_MESSAGE_SIZE,
    MAX_SEGMENT_SIZE,
    MAX_TOPIC_SIZE,
    RETENTION_AGE,
    effective,
)
from messaging.broker.view import BrokerView
from messaging.errors import MessagingError, StreamConflictError
from messaging.kafka.errors import kafka_code
from messaging.log.base import Log
from messaging.placement import group_of_topic

log = logging.getLogger(__name__)

#: The first topic id a Kafka partition gets (ids below are left to HTTP users).
KAFKA_TOPIC_BASE = 1 << 62
#: The most partitions one Kafka topic may have here.
MAX_PARTITIONS = 1024
_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: Kafka's topic configs and the broker's per-topic settings they are.
CONFIGS = {"retention.bytes": MAX_TOPIC_SIZE, "retention.ms": RETENTION_AGE,
           "segment.bytes": MAX_SEGMENT_SIZE, "max.message.bytes": MAX_MESSAGE_SIZE}
_CREATE_ATTEMPTS = 8
_UNLIMITED = (1 << 63) - 1


class TopicError(Exception):
    """A CreateTopics/DeleteTopics/Metadata refusal: a Kafka error code and its message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_name(name: str) -> None:
    """Kafka's rule for topic names (INVALID_TOPIC_EXCEPTION, 17)."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise TopicError(17, f"invalid topic name {name!r}: 1 to 249 of a-z A-Z 0-9 . _ -")


def settings_of(configs: Mapping[str, str | None]) -> dict[str, int | None]:
    """The broker's settings that Kafka topic configs ask for (TopicError INVALID_CONFIG for
    one this broker does not have or a value it cannot take)."""
    settings: dict[str, int | None] = {}
    for key, text in configs.items():
        if key == "cleanup.policy":
            if text not in (None, "delete"):
                raise TopicError(40, f"cleanup.policy {text!r} is not supported: only delete")
            continue
        setting = CONFIGS.get(key)
        if setting is None:
            raise TopicError(40, f"config {key!r} is not supported (supported: cleanup.policy, "
                                 f"{', '.join(CONFIGS)})")
        if text is None:
            settings[setting] = None
            continue
        try:
            value = int(text)
        except ValueError:
            raise TopicError(40, f"invalid {key} {text!r}: expected a number") from None
        if setting == RETENTION_AGE:
            settings[setting] = 0 if value < 0 else value  # -1: keep forever
        elif value < 0 and setting == MAX_TOPIC_SIZE:
            settings[setting] = _UNLIMITED
        elif value <= 0:
            raise TopicError(40, f"invalid {key} {value}: must be above 0")
        else:
            settings[setting] = value
    return settings


class KafkaTopics:
    """Names to partitions to topic ids, and the commands that create and delete them."""

    def __init__(self, broker: BrokerView, log: Log, max_message_size: int,
                 home: tuple[int, int] = (0, 1)) -> None:
        self.broker = broker
        self.log = log
        self.max_message_size = max_message_size
        #: (group, groups): in a cluster of topic groups, the group whose topics these are
        #: (every partition id is one of that group's, see :func:`group_of_topic`).
        self.home = home
        self._creating = asyncio.Lock()

    def partitions(self, name: str) -> dict[int, int]:
        """A topic's partitions: the contiguous ones from 0 (partition -> topic id)."""
        found = self.broker.committed.kafka_topics().get(name, {})
        contiguous: dict[int, int] = {}
        while len(contiguous) in found:
            contiguous[len(contiguous)] = found[len(contiguous)]
        return contiguous

    def names(self) -> list[str]:
        """Every Kafka topic's name."""
        return sorted(name for name, found in self.broker.committed.kafka_topics().items()
                      if 0 in found)

    def topic_id(self, name: str, partition: int) -> int | None:
        """The topic id of one partition (None: no such partition)."""
        return self.partitions(name).get(partition)

    async def create(self, name: str, count: int, configs: Mapping[str, str | None],
                     *, validate_only: bool = False) -> None:
        """Create a topic of ``count`` partitions (TopicError when it cannot be)."""
        check_name(name)
        if not 0 < count <= MAX_PARTITIONS:
            raise TopicError(37, f"invalid number of partitions {count}: 1 to {MAX_PARTITIONS}")
        settings = settings_of(configs)
        limit = settings.get(MAX_MESSAGE_SIZE)
        if limit is not None and limit > self.max_message_size:
            raise TopicError(40, f"max.message.bytes {limit} is above this broker's maximum of "
                                 f"{self.max_message_size}")
        async with self._creating:
            existing = self.partitions(name)
            if existing and len(existing) >= count:
                raise TopicError(36, f"topic {name!r} already exists")
            if existing:
                log.info("Kafka topic %r has %d of %d partitions: creating the rest", name,
                         len(existing), count)
            if validate_only:
                return
            for partition in range(len(existing), count):
                await self._create_partition(name, partition, settings)
        log.info("Kafka topic %r created with %d partitions", name, count)

    async def _create_partition(self, name: str, partition: int,
                                settings: Mapping[str, int | None]) -> None:
        for _ in range(_CREATE_ATTEMPTS):
            if partition in self.partitions(name):
                return  # another node created it meanwhile
            topic_id = self._next_id()
            try:
                try:
                    await self.log.apply(configure_command(topic_id, settings,
                                                           kafka=(name, partition)))
                    return
                except StreamConflictError as err:  # another node took the id or partition
                    log.info("topic %d was not given partition %d of %r (%s): looking again",
                             topic_id, partition, name, err)
                await self.log.read_barrier()
            except MessagingError as err:  # no quorum, shutting down, disk: say so
                raise TopicError(kafka_code(err), f"creating partition {partition} of "
                                                  f"{name!r}: {err}") from err
        raise TopicError(-1, f"could not find a free topic id for partition {partition} of "
                             f"{name!r} in {_CREATE_ATTEMPTS} attempts")

    def _next_id(self) -> int:
        """The first id above every topic id from :data:`KAFKA_TOPIC_BASE` that the broker
        knows, of this group's (the group of a topic id is a hash of it)."""
        known = [*(t.id for t in self.broker.topics()), *self.broker.committed.known_topics()]
        taken = [i for i in known if KAFKA_TOPIC_BASE <= i < KAFKA_TOPIC_BASE << 1]
        candidate = max(taken, default=KAFKA_TOPIC_BASE - 1) + 1
        group, groups = self.home
        while group_of_topic(candidate, groups) != group:
            candidate += 1
        return candidate

    async def delete(self, name: str) -> None:
        """Delete every partition of a topic (TopicError UNKNOWN_TOPIC_OR_PARTITION when it
        has none)."""
        found = self.broker.committed.kafka_topics().get(name)
        if not found:
            raise TopicError(3, f"topic {name!r} does not exist")
        for partition, topic_id in sorted(found.items()):
            try:
                await self.log.apply(delete_command(topic_id))
            except MessagingError as err:
                raise TopicError(-1, f"deleting partition {partition} of {name!r}: {err}") from err
        log.info("Kafka topic %r deleted (%d partitions)", name, len(found))

    def configs(self, name: str) -> list[dict[str, Any]]:
        """DescribeConfigs' entries of a topic: each supported config, its value and whether
        it is the broker's default (TopicError when the topic does not exist)."""
        partitions = self.partitions(name)
        if not partitions:
            raise TopicError(3, f"topic {name!r} does not exist")
        broker = self.broker
        shown = effective(broker.settings(partitions[0]), {
            MAX_TOPIC_SIZE: broker.max_topic_size,
            RETENTION_AGE: (None if broker.retention_age is None
                            else round(broker.retention_age * 1000)),
            MAX_SEGMENT_SIZE: broker.max_segment_size,
            MAX_MESSAGE_SIZE: self.max_message_size})
        entries = [{"config_names": "cleanup.policy", "config_value": "delete",
                    "read_only": True, "is_default": True, "config_source": 5}]
        for key, setting in CONFIGS.items():
            value = shown[setting]["value"]
            if setting == RETENTION_AGE:
                value = value if value else -1  # 0: off, Kafka's -1
            topic_set = shown[setting]["source"] == "topic"
            entries.append({"config_names": key, "config_value": str(value),
                            "read_only": False, "is_default": not topic_set,
                            "config_source": 1 if topic_set else 5})
        return entries
