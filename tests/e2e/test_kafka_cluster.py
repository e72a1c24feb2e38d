"""Kafka clients against a cluster of three broker processes on real etcd: every node serves
every partition, a node killed mid-produce is a reconnect for an idempotent librdkafka
producer (nothing acknowledged lost, nothing stored twice), and a consumer group has one
coordinator whichever node its members bootstrap from."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.conftest import free_port
from tests.e2e.test_etcd_log import (  # noqa: F401  (fixtures used by name)
    EtcdCluster,
    Nodes,
    etcd,
    etcd_cluster,
    groups,
)
from tests.kafka_load import idempotent_producer, produce_through


async def _cluster(broker_process: Any, tmp_path: Path, members: EtcdCluster,
                   ) -> tuple[Nodes, list[str]]:
    nodes = Nodes(broker_process, tmp_path, members)
    kafka = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    for i in range(3):
        await nodes.start(i, env={"MESSAGING_KAFKA_BIND": kafka[i]})
    await nodes.wait_ready(0, 1, 2)
    admin = AdminClient({"bootstrap.servers": kafka[0]})
    deadline = time.monotonic() + 30  # each node announces its listener with its registration
    while len(admin.list_topics(timeout=10).brokers) < 3:
        assert time.monotonic() < deadline, "the nodes' Kafka listeners were not announced"
        time.sleep(0.2)
    return nodes, kafka


def _drain(bootstrap: str, topic: str, partitions: int, count: int) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + 120
        while len(got) < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=1.0):
                if message.error() is None:
                    got.append(message)
        return got
    finally:
        consumer.close()


async def test_a_node_killed_mid_produce_loses_nothing_and_stores_nothing_twice(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:  # noqa: F811
    nodes, kafka = await _cluster(broker_process, tmp_path, etcd)
    admin = AdminClient({"bootstrap.servers": kafka[0]})
    admin.create_topics([NewTopic("spread", num_partitions=3, replication_factor=1)])[
        "spread"].result(30)
    total = 6000
    # Kill the node the producer bootstrapped from and produces through.
    acked = produce_through(idempotent_producer(kafka[0]), "spread", total, 3,
                            lambda: nodes.kill(0))
    assert len(acked) == total
    got = _drain(kafka[1], "spread", 3, total)
    values = [int(m.value() or b"-1") for m in got]
    assert len(values) == len(set(values)) == total  # every one, once
    by_partition: dict[int, list[int]] = {}
    for message, value in zip(got, values, strict=True):
        by_partition.setdefault(message.partition() or 0, []).append(value)
    assert all(v == sorted(v) for v in by_partition.values())


async def test_a_group_bootstrapped_from_two_nodes_has_one_coordinator(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path) -> None:  # noqa: F811
    bootstraps = (0, 1)
    _, kafka = await _cluster(broker_process, tmp_path, etcd)
    admin = AdminClient({"bootstrap.servers": kafka[0]})
    admin.create_topics([NewTopic("shared", num_partitions=2, replication_factor=1)])[
        "shared"].result(30)
    consumers = [Consumer({"bootstrap.servers": kafka[b], "group.id": "one",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False,
                           "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
                 for b in bootstraps]
    for consumer in consumers:
        consumer.subscribe(["shared"])
    deadline = time.monotonic() + 90
    owned: list[set[int]] = []
    while time.monotonic() < deadline:
        for consumer in consumers:
            consumer.poll(0.2)
        owned = [{tp.partition for tp in c.assignment()} for c in consumers]
        if all(owned) and not owned[0] & owned[1] and owned[0] | owned[1] == {0, 1}:
            break
    for consumer in consumers:
        consumer.close()
    assert all(owned) and not owned[0] & owned[1], owned  # one group, split
