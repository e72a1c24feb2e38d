"""Metadata, CreateTopics, DeleteTopics and DescribeConfigs.

A node answers Metadata with itself as the leader (and only replica) of every partition of its
log: it serves all of them, whatever node a client asks (:mod:`messaging.kafka.nodes`; in a
cluster of topic groups, of the groups it holds, see :mod:`messaging.kafka.routing`). A topic that
does not exist is created with one partition on the first Metadata or Produce that names it
(Kafka's defaults), unless the broker runs with ``--kafka-auto-create off`` or the client
asks not to.
"""

from __future__ import annotations

import logging
from typing import Any

from messaging.kafka import protocol as p
from messaging.kafka.access import allowed
from messaging.kafka.nodes import Nodes
from messaging.kafka.topics import KafkaTopics, TopicError, check_name

log = logging.getLogger(__name__)

CLUSTER_ID = "messaging"
#: DescribeConfigs resource types.
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4


def cluster_metadata(nodes: Nodes) -> dict[str, Any]:
    """The brokers, cluster id and controller of a Metadata answer."""
    return {"brokers": [{"node_id": node_id, "host": host, "port": port, "rack": None}
                        for node_id, host, port in nodes.brokers()],
            "cluster_id": CLUSTER_ID, "controller_id": nodes.this[0]}


class Admin:
    """The topic and metadata APIs over :class:`KafkaTopics`."""

    def __init__(self, topics: KafkaTopics, nodes: Nodes, auto_create: bool) -> None:
        self.topics = topics
        self.nodes = nodes
        self.auto_create = auto_create

    async def metadata(self, version: int, request: dict[str, Any]) -> dict[str, Any]:
        """This node, and the topics asked for (every one for none, or null from v1)."""
        asked = request.get("topics")
        if asked is None or (version == 0 and not asked):
            names = [name for name in self.topics.names() if allowed("read", name)]
            create = False
        else:
            names = list(asked)
            create = self.auto_create and request.get("allow_auto_topic_creation", True)
        topics = [await self.topic_metadata(name, create) for name in names]
        return {**cluster_metadata(self.nodes), "topics": topics}

    async def topic_metadata(self, name: str, create: bool) -> dict[str, Any]:
        """One topic's entry in a Metadata answer (created first when ``create`` and it does
        not exist): this node leads every partition."""
        if not allowed("read", name):
            return {"error_code": p.TOPIC_AUTHORIZATION_FAILED, "topic": name,
                    "is_internal": False, "partitions": []}
        partitions = self.topics.partitions(name)
        code = p.NONE
        if not partitions:
            try:
                check_name(name)
                if not create or not allowed("write", name):
                    raise TopicError(p.UNKNOWN_TOPIC_OR_PARTITION,
                                     f"topic {name!r} does not exist")
                await self.topics.create(name, 1, {})
            except TopicError as err:
                if err.code != p.TOPIC_ALREADY_EXISTS:
                    code = err.code
            partitions = self.topics.partitions(name)
            if not partitions and code == p.NONE:
                code = p.LEADER_NOT_AVAILABLE  # being created elsewhere: ask again
        this = self.nodes.this[0]
        return {"error_code": code, "topic": name, "is_internal": False,
                "partitions": [{"error_code": p.NONE, "partition": partition,
                                "leader": this, "replicas": [this], "isr": [this],
                                "offline_replicas": []}
                               for partition in sorted(partitions)]}

    async def create_topics(self, request: dict[str, Any]) -> dict[str, Any]:
        """Create each topic asked for (configs map onto the per-topic settings)."""
        answers = []
        for item in request["create_topic_requests"]:
            name = item["topic"]
            count = item["num_partitions"]
            code, message = p.NONE, None
            try:
                if not allowed("write", name):
                    raise TopicError(p.TOPIC_AUTHORIZATION_FAILED,
                                     f"this token may not create {name!r}")
                if item["replica_assignment"]:
                    raise TopicError(p.INVALID_REQUEST, "replica assignments are not taken: "
                                     "give num_partitions")
                if count == -1:
                    count = 1  # the broker's default
                configs = {c["config_key"]: c["config_value"] for c in item["configs"]}
                await self.topics.create(name, count, configs,
                                         validate_only=bool(request.get("validate_only")))
            except TopicError as err:
                code, message = err.code, str(err)
            answers.append({"topic": name, "error_code": code, "error_message": message})
        return {"topic_errors": answers}

    async def delete_topics(self, request: dict[str, Any]) -> dict[str, Any]:
        """Delete each topic asked for, every partition."""
        answers = []
        for name in request["topics"]:
            code = p.NONE
            try:
                if not allowed("admin"):
                    raise TopicError(p.TOPIC_AUTHORIZATION_FAILED, "deleting needs admin")
                await self.topics.delete(name)
            except TopicError as err:
                code = err.code
            answers.append({"topic": name, "error_code": code})
        return {"topic_error_codes": answers}

    async def describe_configs(self, request: dict[str, Any]) -> dict[str, Any]:
        """Each topic's supported configs with their values (a broker's: none)."""
        resources = []
        for resource in request["resources"]:
            kind, name = resource["resource_type"], resource["resource_name"]
            answer: dict[str, Any] = {"error_code": p.NONE, "error_message": None,
                                      "resource_type": kind, "resource_name": name,
                                      "config_entries": []}
            if kind == TOPIC_RESOURCE and not allowed("read", name):
                answer["error_code"] = p.TOPIC_AUTHORIZATION_FAILED
                answer["error_message"] = f"this token may not read {name!r}"
            elif kind == TOPIC_RESOURCE:
                try:
                    entries = self.topics.configs(name)
                    wanted = resource.get("config_names")
                    answer["config_entries"] = [e for e in entries if not wanted
                                                or e["config_names"] in wanted]
                except TopicError as err:
                    answer["error_code"], answer["error_message"] = err.code, str(err)
            elif kind != BROKER_RESOURCE:
                answer["error_code"] = p.INVALID_REQUEST
                answer["error_message"] = f"resource type {kind} is not described here"
            resources.append(answer)
        return {"resources": resources}
