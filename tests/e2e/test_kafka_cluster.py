"""Kafka clients against a cluster of three broker processes on real etcd: every node serves
every partition, a node killed mid-produce is a reconnect for an idempotent librdkafka
producer (nothing acknowledged lost, nothing stored twice), and a consumer group has one
coordinator whichever node its members bootstrap from. In a cluster of topic groups each
topic is served by its group's holders, whichever node a client bootstraps from."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from messaging.http.auth import new_token, parse_scope, token_line
from messaging.kafka import protocol as p
from messaging.kafka.forward import Forwarder
from messaging.kafka.nodes import broker_id
from messaging.placement import group_of_name
from tests.conftest import free_port
from tests.e2e.test_etcd_log import (  # noqa: F401  (fixtures used by name)
    _GROUPS,
    EtcdCluster,
    Nodes,
    etcd,
    etcd_cluster,
    groups,
)
from tests.kafka_load import idempotent_producer, produce_through
from tests.tls import make_certificates


async def _cluster(broker_process: Any, tmp_path: Path, members: EtcdCluster, *extra: str,
                   ) -> tuple[Nodes, list[str]]:
    nodes = Nodes(broker_process, tmp_path, members, *extra)
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


@pytest.mark.parametrize("groups", [1, 3], indirect=True, ids=["one-log", "3-groups"])
async def test_a_node_killed_mid_produce_loses_nothing_and_stores_nothing_twice(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path, groups: int,  # noqa: F811
        ) -> None:
    # With 3 groups of 2 holders each, the killed node's groups move to the others.
    nodes, kafka = await _cluster(broker_process, tmp_path, etcd,
                                  *(["--replicas", "2"] if groups > 1 else []))
    admin = AdminClient({"bootstrap.servers": kafka[0]})
    admin.create_topics([NewTopic("spread", num_partitions=3, replication_factor=1)])[
        "spread"].result(30)
    total = 6000
    # Kill the node the producer produces through: the one it bootstrapped from, or with
    # groups the holder of the topic's group that Metadata named (its group then moves).
    leaders = {p.leader for p in admin.list_topics("spread", timeout=30).topics[
        "spread"].partitions.values()}
    assert len(leaders) == 1
    victim = [broker_id(address) for address in kafka].index(leaders.pop())
    assert groups > 1 or victim == 0
    acked = produce_through(idempotent_producer(kafka[0]), "spread", total, 3,
                            lambda: nodes.kill(victim))
    assert len(acked) == total
    got = _drain(kafka[(victim + 1) % 3], "spread", 3, total)
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


def _named_in_each_group(count: int) -> list[str]:
    """A topic name in each of ``count`` groups (a name's group is a hash of it)."""
    found: dict[int, str] = {}
    for i in range(1000):
        found.setdefault(group_of_name(f"orders-{i}", count), f"orders-{i}")
    return [found[g] for g in range(count)]


@pytest.mark.parametrize("groups", [3], indirect=True)
async def test_in_a_cluster_of_topic_groups_each_topic_is_served_by_its_holder(
        etcd: EtcdCluster, broker_process: Any, tmp_path: Path, groups: int,  # noqa: F811
        ) -> None:
    nodes, kafka = await _cluster(broker_process, tmp_path, etcd, "--replicas", "1")
    async with aiohttp.ClientSession() as session, session.get(
            f"{nodes.url(0)}/messaging/groups") as answer:
        holder = {g["group"]: nodes.urls.index(g["holders"][0])
                  for g in (await answer.json())["groups"]}
    assert sorted(holder.values()) == [0, 1, 2]  # one group each
    names = _named_in_each_group(groups)
    # Created through node 0, which holds one of the three groups: two are asked of holders.
    admin = AdminClient({"bootstrap.servers": kafka[0]})
    for future in admin.create_topics([NewTopic(n, num_partitions=2, replication_factor=1)
                                       for n in names]).values():
        future.result(30)
    for i in range(3):  # every node names each partition's holder as its leader
        deadline = time.monotonic() + 30
        while True:  # (once this node's member list shows every holder's listener)
            listed = AdminClient({"bootstrap.servers": kafka[i]}).list_topics(timeout=30)
            if all(name in listed.topics for name in names) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for g, name in enumerate(names):
            leaders = {p.leader for p in listed.topics[name].partitions.values()}
            assert leaders == {broker_id(kafka[holder[g]])}, (i, name, leaders)
    # An idempotent producer bootstrapped from node 1 reaches every holder.
    producer = Producer({"bootstrap.servers": kafka[1], "enable.idempotence": True,
                         "linger.ms": 5})
    acked: dict[tuple[str, int], list[int]] = {}

    def report(err: KafkaError | None, message: Any) -> None:
        assert err is None, err
        acked.setdefault((message.topic(), message.partition()), []).append(message.offset())

    total = 1500
    for i in range(total):
        producer.produce(names[i % 3], key=b"k%d" % i, value=b"%d" % i,
                         headers=[("n", b"%d" % i)], on_delivery=report)
        if i % 100 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert sum(map(len, acked.values())) == total
    # A consumer group bootstrapped from node 2 reads every record once and commits; the
    # offsets are read back through node 0.
    consumer = Consumer({"bootstrap.servers": kafka[2], "group.id": "everyone",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(names)
    got: list[Any] = []
    deadline = time.monotonic() + 90
    while len(got) < total and time.monotonic() < deadline:
        got.extend(m for m in consumer.consume(500, timeout=1.0) if m.error() is None)
    consumer.commit(asynchronous=False)
    consumer.close()
    values = sorted(int(m.value()) for m in got)
    assert values == list(range(total))  # every one, once
    for message in got:
        n = int(message.value())
        assert message.topic() == names[n % 3] and message.key() == b"k%d" % n
        assert message.headers() == [("n", b"%d" % n)]
    checker = Consumer({"bootstrap.servers": kafka[0], "group.id": "everyone"})
    try:
        committed = checker.committed([TopicPartition(n, p) for n in names for p in (0, 1)],
                                      timeout=30)
    finally:
        checker.close()
    for tp in committed:
        offsets = acked.get((tp.topic, tp.partition), [])
        assert tp.error is None and tp.offset == (max(offsets) + 1 if offsets else -1001), tp
    # Over HTTP, any node lists every partition of the three topics.
    async with aiohttp.ClientSession() as session, session.get(
            f"{nodes.url(1)}/messaging/topics") as answer:
        rows = await answer.json()
    assert sorted((r["kafka_topic"], r["kafka_partition"]) for r in rows
                  if r.get("kafka_topic")) == sorted((n, p) for n in names for p in (0, 1))


def _fetch_body(wait_ms: int, *at: tuple[str, int]) -> dict[str, Any]:
    return {"replica_id": -1, "max_wait_time": wait_ms, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "topics": [
                {"topic": name, "partitions": [{"partition": 0, "fetch_offset": offset,
                                                "log_start_offset": -1, "max_bytes": 1 << 20}]}
                for name, offset in at]}


async def test_a_fetch_over_two_groups_ends_when_either_has_records(
        etcd: EtcdCluster, start_server: Any) -> None:  # noqa: F811
    """One node holding three groups: a long-poll over a topic of one group and a topic of
    another is answered when records reach either, not after each group's wait in turn."""
    cluster = f"t{uuid.uuid4().hex[:10]}"
    _GROUPS.clusters.append(cluster)  # its keys are deleted after the test
    server = await start_server(etcd=etcd.endpoints, cluster=cluster, groups=3, replicas=1,
                                kafka_bind=("127.0.0.1", 0))
    assert server.kafka is not None
    address = server.kafka.address
    busy, idle = _named_in_each_group(3)[:2]
    forwarder = Forwarder()
    deadline = time.monotonic() + 30
    while True:  # the node takes Kafka requests once it caught up with its groups
        created = await forwarder.ask(address, p.CREATE_TOPICS, 1, {
            "create_topic_requests": [
                {"topic": name, "num_partitions": 1, "replication_factor": 1,
                 "replica_assignment": [], "configs": []} for name in (busy, idle)],
            "timeout": 30000, "validate_only": False}, None)
        codes = {t["topic"]: t["error_code"] for t in created["topic_errors"]}
        if set(codes.values()) <= {p.NONE, p.TOPIC_ALREADY_EXISTS}:
            break
        assert time.monotonic() < deadline, codes
        await asyncio.sleep(0.2)
    started = time.monotonic()
    fetching = asyncio.ensure_future(forwarder.ask(
        address, p.FETCH, 5, _fetch_body(20_000, (busy, 0), (idle, 0)), None))
    await asyncio.sleep(0.5)
    assert not fetching.done()  # nothing in either: it waits
    producer = Producer({"bootstrap.servers": address})
    producer.produce(busy, value=b"now")
    assert await asyncio.to_thread(producer.flush, 30) == 0
    answer = await fetching
    assert time.monotonic() - started < 10  # not the idle group's 20 s
    sets = {t["topics"]: t["partitions"][0]["message_set"] for t in answer["topics"]}
    assert b"now" in sets[busy] and not sets[idle]


async def test_a_request_asked_of_a_holder_keeps_the_clients_token_over_tls(
        etcd: EtcdCluster, start_server: Any, tmp_path: Path) -> None:  # noqa: F811
    """Three nodes of three groups, one each, with tokens and TLS: a topic of another node's
    group is created and described through node 0 with a token that may, and refused with
    one that may not, by the holder that checks the same token."""
    make_certificates(tmp_path)
    name = next(n for n in (f"secured-{i}" for i in range(1000))
                if group_of_name(n, 3) == 1)
    tokens = {"writer": new_token(), "stranger": new_token()}
    scopes = {"writer": [f"write={name}", f"read={name}"], "stranger": ["read=other"]}
    (tmp_path / "tokens").write_text("".join(
        token_line(role, tokens[role], [parse_scope(s) for s in scopes[role]]) + "\n"
        for role in tokens))
    cluster = f"t{uuid.uuid4().hex[:10]}"
    _GROUPS.clusters.append(cluster)
    servers = [await start_server(
        etcd=etcd.endpoints, cluster=cluster, groups=3, replicas=1,
        kafka_bind=("127.0.0.1", 0), tokens=tmp_path / "tokens",
        tls_cert=tmp_path / "server.pem", tls_key=tmp_path / "server-key.pem",
        peer_ca=tmp_path / "ca.pem") for _ in range(3)]
    addresses = [s.kafka.address for s in servers]

    def admin(role: str) -> AdminClient:
        return AdminClient({"bootstrap.servers": addresses[0], "security.protocol": "SASL_SSL",
                            "sasl.mechanisms": "PLAIN", "sasl.username": role,
                            "sasl.password": tokens[role],
                            "ssl.ca.location": str(tmp_path / "ca.pem")})

    writer = admin("writer")
    deadline = time.monotonic() + 60
    while len((await asyncio.to_thread(writer.list_topics, timeout=10)).brokers) < 3:
        assert time.monotonic() < deadline, "the nodes' Kafka listeners were not announced"
        await asyncio.sleep(0.2)
    holder = next(s for s in servers if s.node is not None and 1 in s.node.stacks)
    assert holder is not servers[0]  # node 0 asks the holder
    while True:  # until every group is held and caught up somewhere
        future = writer.create_topics([NewTopic(name, num_partitions=2,
                                                replication_factor=1)])[name]
        try:
            await asyncio.to_thread(future.result, 30)
            break
        except Exception as err:
            assert time.monotonic() < deadline, err
            await asyncio.sleep(0.5)
    listed = await asyncio.to_thread(writer.list_topics, name, timeout=30)
    assert {q.leader for q in listed.topics[name].partitions.values()} == {
        broker_id(holder.kafka.address)}
    stranger = admin("stranger")
    refused = stranger.create_topics([NewTopic(f"{name}-x", num_partitions=1,
                                               replication_factor=1)])
    with pytest.raises(Exception, match="TOPIC_AUTHORIZATION_FAILED"):
        await asyncio.to_thread(next(iter(refused.values())).result, 30)
    seen = await asyncio.to_thread(stranger.list_topics, name, timeout=30)
    assert seen.topics[name].error is not None
    assert seen.topics[name].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


async def test_one_fetch_over_groups_keeps_its_byte_limits_and_no_client_skips_checks(
        etcd: EtcdCluster, start_server: Any, tmp_path: Path) -> None:  # noqa: F811
    """One node holding three groups, with tokens: a fetch over two groups' topics keeps the
    request's max_bytes across both and waits for min_bytes from both together; a fetch of
    nothing waits and answers nothing; a request that calls itself forwarded is checked like
    any other (a commit as a group the token may not consume as is refused)."""
    busy, other = _named_in_each_group(3)[:2]
    tokens = {"writer": new_token(), "no-group": new_token()}
    scopes = {"writer": [f"write={busy}", f"read={busy}", f"write={other}", f"read={other}",
                         "consume=mine"],
              "no-group": [f"read={busy}"]}
    (tmp_path / "tokens").write_text("".join(
        token_line(role, tokens[role], [parse_scope(s) for s in scopes[role]]) + "\n"
        for role in tokens))
    cluster = f"t{uuid.uuid4().hex[:10]}"
    _GROUPS.clusters.append(cluster)
    server = await start_server(etcd=etcd.endpoints, cluster=cluster, groups=3, replicas=1,
                                kafka_bind=("127.0.0.1", 0), tokens=tmp_path / "tokens")
    assert server.kafka is not None
    address = server.kafka.address
    forwarder = Forwarder()

    async def ask(api: int, version: int, body: dict[str, Any],
                  role: str = "writer") -> dict[str, Any]:
        return await forwarder.ask(address, api, version, body, tokens[role])

    deadline = time.monotonic() + 30
    while True:  # the node takes Kafka requests once it caught up with its groups
        created = await ask(p.CREATE_TOPICS, 1, {"create_topic_requests": [
            {"topic": name, "num_partitions": 1, "replication_factor": 1,
             "replica_assignment": [], "configs": []} for name in (busy, other)],
            "timeout": 30000, "validate_only": False})
        codes = {t["topic"]: t["error_code"] for t in created["topic_errors"]}
        if set(codes.values()) <= {p.NONE, p.TOPIC_ALREADY_EXISTS}:
            break
        assert time.monotonic() < deadline, codes
        await asyncio.sleep(0.2)
    producer = Producer({"bootstrap.servers": address, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "PLAIN", "sasl.username": "writer",
                         "sasl.password": tokens["writer"], "linger.ms": 0})

    def put(name: str) -> None:
        producer.produce(name, value=bytes(600))
        assert producer.flush(30) == 0

    # min_bytes 1,000: 600 bytes in one group, then 600 in the other, end the long-poll.
    started = time.monotonic()
    body = _fetch_body(20_000, (busy, 0), (other, 0))
    fetching = asyncio.ensure_future(ask(p.FETCH, 5, {**body, "min_bytes": 1000}))
    await asyncio.to_thread(put, busy)
    await asyncio.sleep(0.3)
    assert not fetching.done()  # 600 bytes of the 1,000
    await asyncio.to_thread(put, other)
    answer = await fetching
    assert time.monotonic() - started < 10  # not the 20 s wait
    sizes = {t["topics"]: len(t["partitions"][0]["message_set"]) for t in answer["topics"]}
    assert all(sizes.values()), sizes
    # max_bytes 1,000 over both: the first partition's records, none of the second's.
    answer = await ask(p.FETCH, 5, {**body, "max_wait_time": 0, "max_bytes": 1000})
    sizes = {t["topics"]: len(t["partitions"][0]["message_set"]) for t in answer["topics"]}
    assert sorted(bool(size) for size in sizes.values()) == [False, True], sizes
    # Nothing asked: an empty answer after the wait, the connection kept.
    answer = await ask(p.FETCH, 5, _fetch_body(200))
    assert answer["topics"] == []
    # Calling itself forwarded (this client does) skips no check.
    commit = {"consumer_group": "mine", "consumer_group_generation_id": -1, "consumer_id": "",
              "retention_time": -1, "topics": [
                  {"topic": busy, "partitions": [{"partition": 0, "offset": 1,
                                                  "metadata": ""}]}]}
    refused = await ask(p.OFFSET_COMMIT, 2, commit, "no-group")
    assert refused["topics"][0]["partitions"][0]["error_code"] == p.GROUP_AUTHORIZATION_FAILED
    taken = await ask(p.OFFSET_COMMIT, 2, commit)
    assert taken["topics"][0]["partitions"][0]["error_code"] == p.NONE
