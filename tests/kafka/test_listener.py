"""The Kafka listener in a broker, driven by aiokafka over real sockets: produce and fetch with
keys, headers and every codec, topics created (configs as the broker's settings), described and
deleted, offsets by time, HTTP and Kafka reading each other's messages, and bad input (corrupt
batches, unknown topics, APIs not offered, a request too big) answered or cut off cleanly."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.protocol.commit import (
    OffsetCommitRequest_v2,
    OffsetCommitResponse_v2,
    OffsetFetchRequest_v1,
    OffsetFetchResponse_v1,
)
from aiokafka.protocol.fetch import (
    FetchRequest_v4,
    FetchRequest_v5,
    FetchResponse_v4,
    FetchResponse_v5,
)
from aiokafka.protocol.metadata import MetadataRequest_v4, MetadataResponse_v4
from aiokafka.protocol.produce import (
    ProduceRequest_v3,
    ProduceRequest_v8,
    ProduceResponse_v3,
    ProduceResponse_v8,
)
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from messaging.client import Client
from messaging.errors import ConfigError
from messaging.http.server import BrokerServer
from messaging.kafka import protocol as p
from messaging.kafka.nodes import broker_id
from messaging.kafka.protocol import MAX_REQUEST_SIZE
from messaging.kafka.records import KAFKA_RECORD_TYPE, open_envelope
from tests.conftest import StartServer, wait_until


@pytest.fixture
async def broker(start_server: StartServer) -> BrokerServer:
    return await start_server(kafka_bind=("127.0.0.1", 0))


def _address(server: BrokerServer) -> str:
    assert server.kafka is not None
    return server.kafka.address


@pytest.fixture
async def producer(broker: BrokerServer) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(bootstrap_servers=_address(broker), linger_ms=2)
    await producer.start()
    yield producer
    await producer.stop()


async def _consume(server: BrokerServer, topic: str, partitions: int, count: int,
                   ) -> list[object]:
    consumer = AIOKafkaConsumer(bootstrap_servers=_address(server), enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        wanted = [TopicPartition(topic, i) for i in range(partitions)]
        consumer.assign(wanted)
        await consumer.seek_to_beginning(*wanted)
        records: list[object] = []
        deadline = time.monotonic() + 30
        while len(records) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for tp in sorted(batches, key=lambda tp: tp.partition):
                records.extend(batches[tp])
        return records
    finally:
        await consumer.stop()


async def test_keyed_records_with_headers_come_back_exactly_once_in_order(
        broker: BrokerServer, producer: AIOKafkaProducer) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=_address(broker))
    await admin.start()
    try:
        await admin.create_topics([NewTopic("orders", 3, 1)])
    finally:
        await admin.close()
    sent = [await producer.send("orders", key=b"k%d" % i, value=b"v%d" % i,
                                headers=[("n", b"%d" % i)], partition=i % 3)
            for i in range(600)]
    offsets = [(m.partition, m.offset) for m in await asyncio.gather(*sent)]
    records = await _consume(broker, "orders", 3, 600)
    assert len(records) == 600
    by_partition: dict[int, list[int]] = {}
    for r in records:
        n = int(r.value[1:])  # type: ignore[attr-defined]
        assert r.key == b"k%d" % n and r.headers == (("n", b"%d" % n),)  # type: ignore[attr-defined]
        assert n % 3 == r.partition  # type: ignore[attr-defined]
        by_partition.setdefault(r.partition, []).append(n)  # type: ignore[attr-defined]
        assert (r.partition, r.offset) == offsets[n]  # type: ignore[attr-defined]
    assert all(v == sorted(v) and len(v) == 200 for v in by_partition.values())


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_compressed_batches_are_stored_as_messages(broker: BrokerServer, codec: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=_address(broker), compression_type=codec,
                                linger_ms=5)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send("packed", value=b"x%d" % i)
                               for i in range(50)])
    finally:
        await producer.stop()
    records = await _consume(broker, "packed", 1, 50)
    assert [r.value for r in records] == [b"x%d" % i for i in range(50)]  # type: ignore[attr-defined]


async def test_http_and_kafka_read_each_others_messages(broker: BrokerServer,
                                                         producer: AIOKafkaProducer) -> None:
    await producer.send_and_wait("both", value=b"from kafka")
    await producer.send_and_wait("both", key=b"key", value=b"keyed")
    async with Client(broker.url) as client:
        rows = [t for t in await client.topics() if t.get("kafka_topic") == "both"]
        assert len(rows) == 1 and rows[0]["kafka_partition"] == 0
        topic = rows[0]["id"]
        await client.publish(topic, b"from http")
        messages = await client.read(topic)
    assert [m.data for m in messages[::2]] == [b"from kafka", b"from http"]
    assert messages[1].type == KAFKA_RECORD_TYPE
    assert open_envelope(messages[1].data).key == b"key"
    records = await _consume(broker, "both", 1, 3)
    assert [(r.key, r.value) for r in records] == [  # type: ignore[attr-defined]
        (None, b"from kafka"), (b"key", b"keyed"), (None, b"from http")]
    assert [r.offset for r in records] == [m.index for m in messages]  # type: ignore[attr-defined]


async def test_offsets_by_time_earliest_and_latest(broker: BrokerServer,
                                                   producer: AIOKafkaProducer) -> None:
    first = await producer.send_and_wait("timed", value=b"early")
    await asyncio.sleep(0.25)  # append times are kept to 100 ms
    middle = int(time.time() * 1000)
    await asyncio.sleep(0.25)
    second = await producer.send_and_wait("timed", value=b"late")
    consumer = AIOKafkaConsumer(bootstrap_servers=_address(broker))
    await consumer.start()
    try:
        tp = TopicPartition("timed", 0)
        found = await consumer.offsets_for_times({tp: middle})
        assert found[tp] is not None and found[tp].offset == second.offset
        assert found[tp].timestamp >= middle
        assert (await consumer.offsets_for_times({tp: middle + 3_600_000}))[tp] is None
        assert (await consumer.beginning_offsets([tp]))[tp] == first.offset
        assert (await consumer.end_offsets([tp]))[tp] == second.offset + 1
    finally:
        await consumer.stop()


async def test_topic_configs_are_the_brokers_settings(broker: BrokerServer,
                                                      http: aiohttp.ClientSession) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=_address(broker))
    await admin.start()
    try:
        await admin.create_topics([NewTopic("kept", 2, 1, topic_configs={
            "retention.bytes": "1048576", "retention.ms": "3600000"})])
        again = await admin.create_topics([NewTopic("kept", 2, 1)])
        assert again.topic_errors[0][1] == p.TOPIC_ALREADY_EXISTS
        bad = await admin.create_topics([NewTopic("odd", 1, 1, topic_configs={
            "cleanup.policy": "compact"})])
        assert bad.topic_errors[0][1] == p.INVALID_CONFIG
        described = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC,
                                                                 "kept")])
        entries = {e[0]: e[1] for e in described[0].resources[0][4]}
        assert entries["retention.bytes"] == "1048576" and entries["retention.ms"] == "3600000"
        async with http.get(f"{broker.url}/messaging/topics") as response:
            rows = [t for t in await response.json() if t.get("kafka_topic") == "kept"]
        assert sorted(r["kafka_partition"] for r in rows) == [0, 1]
        async with http.get(f"{broker.url}/messaging/topics/{rows[0]['id']}") as response:
            settings = (await response.json())["settings"]
        assert settings["max-topic-size"] == {"value": 1048576, "source": "topic"}
        assert settings["retention-age"] == {"value": 3600000, "source": "topic"}
        await admin.delete_topics(["kept"])
        async with http.get(f"{broker.url}/messaging/topics/{rows[0]['id']}") as response:
            assert response.status == 410
        assert "kept" not in await admin.list_topics()
    finally:
        await admin.close()


# -- raw requests ------------------------------------------------------------------------------


async def _exchange(server: BrokerServer, request: object, correlation: int = 1,
                    ) -> bytes | None:
    """Send one request over a fresh connection; its response body (None: closed)."""
    host, port = _address(server).rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        header = struct.pack(">hhih", request.API_KEY, request.API_VERSION,  # type: ignore[attr-defined]
                             correlation, 4) + b"test"
        data = header + request.encode()  # type: ignore[attr-defined]
        writer.write(struct.pack(">i", len(data)) + data)
        await writer.drain()
        try:
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            body = await reader.readexactly(size)
        except asyncio.IncompleteReadError:
            return None
        assert struct.unpack_from(">i", body)[0] == correlation
        return body[4:]
    finally:
        writer.close()


def _batch(*values: bytes) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, 1, None, value, [])
    return bytes(builder.build())


async def test_a_corrupt_batch_is_refused_and_nothing_is_stored(broker: BrokerServer) -> None:
    good = _batch(b"a", b"b")
    corrupt = good[:-1] + bytes([good[-1] ^ 1])
    answer = await _exchange(broker, ProduceRequest_v3(None, -1, 1000, [
        ("raw", [(0, good + corrupt)])]))
    assert answer is not None
    partition = ProduceResponse_v3.decode(answer).topics[0][1][0]
    assert partition[1] == p.CORRUPT_MESSAGE
    fetched = await _exchange(broker, FetchRequest_v4(-1, 0, 1, 1 << 20, 0, [
        ("raw", [(0, 0, 1 << 20)])]))
    assert fetched is not None
    assert FetchResponse_v4.decode(fetched).topics[0][1][0][5] == b""


@pytest.mark.e2e  # a batch of 100 MiB made and opened: about a second
async def test_a_batch_that_opens_past_a_requests_size_is_too_large(broker: BrokerServer) -> None:
    builder = DefaultRecordBatchBuilder(2, 4, 0, -1, -1, -1, 1 << 30)  # zstd
    for i in range(MAX_REQUEST_SIZE // 1_000_000 + 1):  # records each small enough to store
        builder.append(i, 1, None, bytes(1_000_000), [])
    packed = bytes(builder.build())
    answer = await _exchange(broker, ProduceRequest_v8(None, -1, 1000, [
        ("packed", [(0, packed)])]))
    assert answer is not None and len(packed) < 100_000
    partition = ProduceResponse_v8.decode(answer).topics[0][1][0]
    assert partition[1] == p.MESSAGE_TOO_LARGE
    assert f"open to more than {MAX_REQUEST_SIZE} bytes" in partition[-1], partition


async def test_an_unknown_partition_and_a_bad_name_are_error_codes(broker: BrokerServer) -> None:
    answer = await _exchange(broker, ProduceRequest_v3(None, -1, 1000, [
        ("raw", [(5, _batch(b"x"))])]))
    assert answer is not None
    assert ProduceResponse_v3.decode(answer).topics[0][1][0][1] == p.UNKNOWN_TOPIC_OR_PARTITION
    answer = await _exchange(broker, MetadataRequest_v4(["bad name!"], True))
    assert answer is not None
    assert MetadataResponse_v4.decode(answer).topics[0][0] == p.INVALID_TOPIC_EXCEPTION


async def test_without_auto_create_an_unknown_topic_stays_unknown(
        start_server: StartServer) -> None:
    server = await start_server(kafka_bind=("127.0.0.1", 0), kafka_auto_create="off")
    answer = await _exchange(server, MetadataRequest_v4(["absent"], True))
    assert answer is not None
    assert MetadataResponse_v4.decode(answer).topics[0][0] == p.UNKNOWN_TOPIC_OR_PARTITION
    answer = await _exchange(server, ProduceRequest_v3(None, -1, 1000, [
        ("absent", [(0, _batch(b"x"))])]))
    assert answer is not None
    assert ProduceResponse_v3.decode(answer).topics[0][1][0][1] == p.UNKNOWN_TOPIC_OR_PARTITION


class _Raw:
    """A request of any key and version with a body given as bytes."""

    def __init__(self, key: int, version: int, body: bytes) -> None:
        self.API_KEY, self.API_VERSION, self._body = key, version, body

    def encode(self) -> bytes:
        return self._body


async def test_apis_not_offered_are_answered_or_cut_off_and_the_listener_goes_on(
        broker: BrokerServer, caplog: pytest.LogCaptureFixture) -> None:
    answer = await _exchange(broker, _Raw(p.API_VERSIONS, 3, b"\x00"))  # librdkafka's first
    assert answer is not None and answer[:2] == struct.pack(">h", p.UNSUPPORTED_VERSION)
    answer = await _exchange(broker, _Raw(16, 0, b""))  # ListGroups v0
    assert answer is not None and answer[:2] == struct.pack(">h", p.UNSUPPORTED_VERSION)
    assert await _exchange(broker, _Raw(999, 0, b"")) is None
    assert await _exchange(broker, _Raw(p.METADATA, 1, b"\x00")) is None  # does not decode
    assert "does not decode" in caplog.text
    answer = await _exchange(broker, MetadataRequest_v4(None, True))
    assert answer is not None
    assert MetadataResponse_v4.decode(answer).brokers == [
        (broker_id(_address(broker)), "127.0.0.1", int(_address(broker).rsplit(":")[1]), None)]


async def test_a_request_too_big_closes_the_connection(broker: BrokerServer) -> None:
    host, port = _address(broker).rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(struct.pack(">i", p.MAX_REQUEST_SIZE + 1))
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


def _idempotent(first_seq: int, *values: bytes, producer_id: int = 77) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, 0, producer_id, 0, first_seq, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, 1, None, value, [])
    return bytes(builder.build())


async def _produce(server: BrokerServer, batch: bytes) -> tuple[int, int]:
    answer = await _exchange(server, ProduceRequest_v3(None, -1, 1000, [("idem", [(0, batch)])]))
    assert answer is not None
    partition = ProduceResponse_v3.decode(answer).topics[0][1][0]
    return partition[1], partition[2]


async def test_an_idempotent_producers_batches_are_stored_once(broker: BrokerServer) -> None:
    await _exchange(broker, MetadataRequest_v4(["idem"], True))  # created
    code, offset = await _produce(broker, _idempotent(0, b"a", b"b"))
    assert code == p.NONE
    assert await _produce(broker, _idempotent(0, b"a", b"b")) == (p.NONE, offset)  # resent
    assert (await _produce(broker, _idempotent(5, b"x")))[0] == p.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert (await _produce(broker, _idempotent(2, b"c")))[0] == p.NONE
    assert (await _produce(broker, _idempotent(0, b"a", b"b")))[0] == (
        p.DUPLICATE_SEQUENCE_NUMBER)  # older than the last: its offsets are not kept
    assert (await _produce(broker, _idempotent(3, b"z", producer_id=78)))[0] == (
        p.UNKNOWN_PRODUCER_ID)
    records = await _consume(broker, "idem", 1, 3)
    assert [r.value for r in records] == [b"a", b"b", b"c"]  # type: ignore[attr-defined]


async def _fetch_code(server: BrokerServer, topic: str, offset: int) -> tuple[int, int, bytes]:
    answer = await _exchange(server, FetchRequest_v5(-1, 0, 1, 1 << 20, 0, [
        (topic, [(0, offset, 0, 1 << 20)])]))
    assert answer is not None
    partition = FetchResponse_v5.decode(answer).topics[0][1][0]
    return partition[1], partition[4], partition[6]  # error, log start, records


async def _aging_topic(server: BrokerServer, name: str) -> list[Any]:
    """A topic of small segments whose retention keeps 8 KiB, and 40 records of 400 B in it
    (their record metadata)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=_address(server))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1, topic_configs={
            "segment.bytes": "4096", "retention.bytes": "8192"})])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=_address(server), linger_ms=0)
    await producer.start()
    try:
        return [await producer.send_and_wait(name, b"%04d" % i * 100) for i in range(40)]
    finally:
        await producer.stop()


async def test_a_fetch_below_what_retention_kept_is_out_of_range(
        start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server = await start_server(kafka_bind=("127.0.0.1", 0), truncation_interval=3600)
    sent = await _aging_topic(server, "aging")
    assert (await _fetch_code(server, "aging", 0))[0] == p.NONE  # nothing lost yet
    async with http.post(f"{server.url}/messaging/retention") as response:
        assert response.status == 200 and (await response.json())["deleted_bytes"] > 0
    code, start, _ = await _fetch_code(server, "aging", sent[0].offset)
    assert code == p.OFFSET_OUT_OF_RANGE and start > sent[0].offset
    code, _, records = await _fetch_code(server, "aging", start)
    assert code == p.NONE and records
    records_after = await _consume(server, "aging", 1, 1)  # earliest: from the log start
    assert records_after[0].offset == start  # type: ignore[attr-defined]


async def test_retention_keeps_what_a_group_committed_and_what_an_http_subscriber_holds(
        start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server = await start_server(kafka_bind=("127.0.0.1", 0), truncation_interval=3600)
    committed, heartbeated = (await _aging_topic(server, "committed"),
                              await _aging_topic(server, "heartbeated"))
    answer = await _exchange(server, OffsetCommitRequest_v2(  # the group's next offset: 3rd
        "holders", -1, "", -1, [("committed", [(0, committed[2].offset, "")])]))
    assert answer is not None
    assert OffsetCommitResponse_v2.decode(answer).topics[0][1][0][1] == p.NONE
    rows = await (await http.get(f"{server.url}/messaging/topics")).json()
    topic_id = next(row["id"] for row in rows if row.get("kafka_topic") == "heartbeated")
    async with http.post(f"{server.url}/messaging/heartbeat", params={
            "topicID": str(topic_id), "index": str(heartbeated[1].offset),
            "url": "http-reader"}) as response:
        assert response.status == 200, await response.text()
    async with http.post(f"{server.url}/messaging/retention") as response:
        assert response.status == 200
    # retention deleted nothing a reader still needs, over either face...
    code, start, records = await _fetch_code(server, "committed", committed[2].offset)
    assert code == p.NONE and records and start <= committed[2].offset
    code, start, records = await _fetch_code(server, "heartbeated", heartbeated[2].offset)
    assert code == p.NONE and records and start <= heartbeated[2].offset
    # ...and the group's position is what an HTTP consumer of that name starts after
    consumers = await (await http.get(f"{server.url}/messaging/consumers")).json()
    held = {(row.get("kafka_topic"), row["name"]): (row["index"], row["live"])
            for row in consumers}
    assert held[("committed", "holders")] == (committed[2].offset - 1, True)
    assert held[("heartbeated", "http-reader")] == (heartbeated[1].offset, True)


async def test_records_in_the_object_store_are_fetched_like_local_ones(
        start_server: StartServer, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    server = await start_server(kafka_bind=("127.0.0.1", 0), object_store=f"file://{store}",
                                max_segment_size=2048, local_retention_size=2048,
                                truncation_interval=3600)
    producer = AIOKafkaProducer(bootstrap_servers=_address(server), linger_ms=0)
    await producer.start()
    try:
        for i in range(60):
            await producer.send_and_wait("tiered", key=b"k%d" % i, value=b"%03d" % i * 40)
    finally:
        await producer.stop()
    broker = server.broker
    assert broker is not None and server.kafka is not None
    topic_id = server.kafka.topics.topic_id("tiered", 0)
    assert topic_id is not None
    local = broker.store.get(topic_id)
    assert local is not None

    async def offloaded() -> bool:
        return broker.manifest(topic_id).offloaded == local.segments()[-2].committed_last_index

    await wait_until(offloaded, timeout=30)
    await asyncio.get_running_loop().run_in_executor(None, broker.enforce_retention)
    assert local.first_index > broker.manifest(topic_id).objects[0].first  # gone from disk
    records = await _consume(server, "tiered", 1, 60)
    assert [(r.key, r.value) for r in records] == [  # type: ignore[attr-defined]
        (b"k%d" % i, b"%03d" % i * 40) for i in range(60)]


async def test_a_batch_shorter_than_its_header_is_refused_and_the_broker_goes_on(
        broker: BrokerServer) -> None:
    good = _batch(b"x")
    for length in (5, 8, 20, 48):  # a length field that leaves no room for the header
        short = good[:8] + struct.pack(">i", length) + good[12:12 + length]
        answer = await _exchange(broker, ProduceRequest_v3(None, -1, 1000, [
            ("short", [(0, short)])]))
        assert answer is not None
        assert ProduceResponse_v3.decode(answer).topics[0][1][0][1] == p.CORRUPT_MESSAGE
    answer = await _exchange(broker, ProduceRequest_v3(None, -1, 1000, [("short", [(0, good)])]))
    assert answer is not None and ProduceResponse_v3.decode(answer).topics[0][1][0][1] == p.NONE


async def test_committed_offsets_0_and_1_read_back_as_the_start(broker: BrokerServer) -> None:
    await _exchange(broker, MetadataRequest_v4(["kept"], True))
    for offset, expected in ((1_000_000, 1_000_000), (1, 1), (0, 1)):
        committed = await _exchange(broker, OffsetCommitRequest_v2(
            "group", -1, "", -1, [("kept", [(0, offset, "")])]))
        assert committed is not None
        assert OffsetCommitResponse_v2.decode(committed).topics[0][1][0][1] == p.NONE
        fetched = await _exchange(broker, OffsetFetchRequest_v1("group", [("kept", [0])]))
        assert fetched is not None
        assert OffsetFetchResponse_v1.decode(fetched).topics[0][1][0][1] == expected
    fetched = await _exchange(broker, OffsetFetchRequest_v1("other", [("kept", [0])]))
    assert fetched is not None and OffsetFetchResponse_v1.decode(fetched).topics[0][1][0][1] == -1


async def test_a_request_that_cannot_be_read_is_logged_when_the_connection_closes(
        broker: BrokerServer, caplog: pytest.LogCaptureFixture) -> None:
    host, port = _address(broker).rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(struct.pack(">i", 3) + b"abc")  # shorter than a request header
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    await wait_until(lambda: _true("shorter than its header" in caplog.text), timeout=10)


async def _true(value: bool) -> bool:
    return value


@pytest.mark.parametrize(("options", "reason"), [
    ({"kafka_bind": ("0.0.0.0", 0)}, "without authentication"),
    ({"kafka_bind": ("0.0.0.0", 0), "insecure": True}, "give --kafka-advertise"),
    ({"kafka_advertise": ("h", 1)}, "--kafka-advertise needs --kafka-bind"),
])
async def test_listener_settings_that_cannot_work_are_refused(
        start_server: StartServer, options: dict[str, Any], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        await start_server(**options)


async def test_acks_0_gets_no_answer_and_stores_the_records(broker: BrokerServer) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=_address(broker), acks=0)
    await producer.start()
    try:
        for i in range(20):
            await producer.send("fire", b"%d" % i)
        await producer.flush()
    finally:
        await producer.stop()
    records = await _consume(broker, "fire", 1, 20)
    assert [r.value for r in records] == [b"%d" % i for i in range(20)]  # type: ignore[attr-defined]


async def test_a_fetch_at_the_end_waits_for_a_commit_or_its_max_wait(
        broker: BrokerServer, producer: AIOKafkaProducer) -> None:
    first = await producer.send_and_wait("polled", b"one")
    end = first.offset + 1
    request = FetchRequest_v4(-1, 2000, 1, 1 << 20, 0, [("polled", [(0, end, 1 << 20)])])
    started = time.monotonic()
    quiet = await _exchange(broker, FetchRequest_v4(-1, 300, 1, 1 << 20, 0, [
        ("polled", [(0, end, 1 << 20)])]))
    assert quiet is not None and FetchResponse_v4.decode(quiet).topics[0][1][0][5] == b""
    assert time.monotonic() - started >= 0.25  # it waited (about) its max_wait_time
    waiting = asyncio.ensure_future(_exchange(broker, request))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await producer.send_and_wait("polled", b"two")
    answer = await asyncio.wait_for(waiting, 5)  # answered by the commit, not the 2 s wait
    assert answer is not None and FetchResponse_v4.decode(answer).topics[0][1][0][5] != b""
