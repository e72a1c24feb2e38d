"""OffsetCommit, OffsetFetch and FindCoordinator: a Kafka group's committed offsets are the
project's consumer positions.

A group's offset in a partition is the consumer position named after the group in the
partition's topic, so ``messaging consumers`` and the console show a Kafka group's lag, an
HTTP read with ``consumer=GROUP`` starts where the group will, and a position reset over HTTP
moves the group. Kafka commits the next offset to read; a position is the last index
processed: the position is the offset less one. Any node can store and read them; the group
protocol's commits go to the group's coordinator (:mod:`messaging.kafka.nodes`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from messaging.broker.commands import reset_consumer
from messaging.broker.view import BrokerView
from messaging.errors import MessagingError
from messaging.kafka import protocol as p
from messaging.kafka.access import allowed
from messaging.kafka.errors import kafka_code
from messaging.kafka.groups import Coordinator
from messaging.kafka.nodes import Nodes
from messaging.kafka.topics import KafkaTopics
from messaging.log.base import Log

log = logging.getLogger(__name__)

#: The longest group id kept as a consumer name (the HTTP API's limit).
MAX_GROUP_ID = 200


class Offsets:
    """Committed offsets over the consumer positions, and FindCoordinator."""

    def __init__(self, broker: BrokerView, log_: Log, topics: KafkaTopics,
                 coordinator: Coordinator, nodes: Nodes) -> None:
        self.broker = broker
        self.log = log_
        self.topics = topics
        self.coordinator = coordinator
        self.nodes = nodes

    async def commit(self, request: dict[str, Any]) -> dict[str, Any]:
        """Store each partition's offset as the group's position (one command each, applied
        side by side)."""
        return await self.commit_checked(request, commit_check(self.coordinator, self.nodes,
                                                               request))

    async def commit_checked(self, request: dict[str, Any], code: int) -> dict[str, Any]:
        """:meth:`commit` once the group's member and generation were checked: ``code``, the
        outcome of :func:`commit_check` (not NONE: every partition's answer)."""
        group = request["consumer_group"]
        jobs = []
        for topic in request["topics"]:
            for part in topic["partitions"]:
                jobs.append((topic["topic"], part["partition"],
                             self._commit_one(group, topic["topic"], part["partition"],
                                              part["offset"], code)))
        codes = await asyncio.gather(*(job for _, _, job in jobs))
        return {"topics": p.by_topic([(name, {"partition": partition, "error_code": answer})
                                      for (name, partition, _), answer
                                      in zip(jobs, codes, strict=True)])}

    async def _commit_one(self, group: str, name: str, partition: int, offset: int,
                          code: int) -> int:
        if code != p.NONE:
            return code
        if not allowed("read", name):
            return p.TOPIC_AUTHORIZATION_FAILED
        topic_id = self.topics.topic_id(name, partition)
        if topic_id is None:
            return p.UNKNOWN_TOPIC_OR_PARTITION
        # Offsets 0 and 1 both mean "from the first message" (no index is 0): position 0.
        try:
            await self.log.apply(reset_consumer(topic_id, group, max(offset - 1, 0)))
        except MessagingError as err:
            log.warning("committing %s/%d for group %r failed: %s", name, partition, group, err)
            return kafka_code(err)
        return p.NONE

    async def fetch(self, request: dict[str, Any]) -> dict[str, Any]:
        """Each partition's committed offset (-1: none); every Kafka topic's for a null
        topic list (v2 and later)."""
        group = request["consumer_group"]
        code = _check_group(group)
        if code == p.NONE and not allowed("consume", group):
            code = p.GROUP_AUTHORIZATION_FAILED
        asked = request.get("topics")
        if asked is None:
            asked = [{"topic": name, "partitions": sorted(self.topics.partitions(name))}
                     for name in self.topics.names() if allowed("read", name)]
        topics = []
        for topic in asked:
            parts = []
            for partition in topic["partitions"]:
                parts.append(self._fetch_one(group, topic["topic"], partition, code))
            if parts or request.get("topics") is not None:
                topics.append({"topic": topic["topic"], "partitions": parts})
        return {"topics": topics, "error_code": code}

    def _fetch_one(self, group: str, name: str, partition: int, code: int) -> dict[str, Any]:
        answer = {"partition": partition, "offset": -1, "metadata": "", "error_code": code}
        if code != p.NONE:
            return answer
        if not allowed("read", name):
            answer["error_code"] = p.TOPIC_AUTHORIZATION_FAILED
            return answer
        topic_id = self.topics.topic_id(name, partition)
        if topic_id is None:
            answer["error_code"] = p.UNKNOWN_TOPIC_OR_PARTITION
            return answer
        position = self.broker.subscribers(topic_id).get(group)
        if position is not None:
            answer["offset"] = position + 1
        return answer


def find_coordinator(nodes: Nodes, request: dict[str, Any]) -> dict[str, Any]:
    """FindCoordinator: the node that coordinates a group (see :mod:`messaging.kafka.nodes`)."""
    key = request.get("coordinator_key", request.get("consumer_group"))
    if not key:
        return {"error_code": p.INVALID_GROUP_ID, "error_message": "an empty group id",
                "coordinator_id": -1, "host": "", "port": -1}
    if not allowed("consume", key):
        return {"error_code": p.GROUP_AUTHORIZATION_FAILED, "coordinator_id": -1,
                "error_message": f"this token may not consume as {key!r}", "host": "",
                "port": -1}
    node_id, host, port = nodes.coordinator(key)
    return {"error_code": p.NONE, "coordinator_id": node_id, "host": host, "port": port}


def commit_check(coordinator: Coordinator, nodes: Nodes, request: dict[str, Any]) -> int:
    """Whether an OffsetCommit may store anything: a valid group the token may consume as,
    and (in the group protocol) this node its coordinator and the member in its
    generation."""
    group = request["consumer_group"]
    code = _check_group(group)
    if code == p.NONE and not allowed("consume", group):
        code = p.GROUP_AUTHORIZATION_FAILED
    generation = request.get("consumer_group_generation_id", -1)
    if code == p.NONE and generation >= 0 and not nodes.coordinates(group):
        code = p.NOT_COORDINATOR
    if code == p.NONE:
        code = coordinator.check_commit(group, generation, request.get("consumer_id", ""))
    return code


def _check_group(group: str | None) -> int:
    return p.NONE if group and len(group) <= MAX_GROUP_ID else p.INVALID_GROUP_ID
