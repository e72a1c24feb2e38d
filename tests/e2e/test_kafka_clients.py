"""Real Kafka clients against a broker process's --kafka-bind: confluent-kafka (librdkafka, as
bundled in the wheel), aiokafka, kafka-python, and Debian's kcat (librdkafka 2.0.2, which
needs empty tag buffers)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from messaging.frames import Message, decode
from messaging.kafka.records import KAFKA_RECORD_TYPE, open_envelope
from tests.conftest import BrokerProcess, free_port
from tests.kafka_load import idempotent_producer, produce_through

Make = Callable[..., BrokerProcess]


def _start(broker_process: Make) -> tuple[BrokerProcess, str]:
    port = free_port()
    process = broker_process(None, "--kafka-bind", f"127.0.0.1:{port}").start()
    return process, f"127.0.0.1:{port}"


def _consume(bootstrap: str, topic: str, partitions: int, count: int,
             ) -> dict[int, list[Any]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: dict[int, list[Any]] = {p: [] for p in range(partitions)}
        seen = 0
        deadline = time.monotonic() + 120
        while seen < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=1.0):
                error = message.error()
                assert error is None or error.code() == KafkaError._PARTITION_EOF, error
                if error is None:
                    partition = message.partition()
                    assert partition is not None
                    got[partition].append(message)
                    seen += 1
        return got
    finally:
        consumer.close()


def test_confluent_kafka_round_trips_20000_keyed_records_on_3_partitions(
        broker_process: Make) -> None:
    _, bootstrap = _start(broker_process)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("orders", num_partitions=3, replication_factor=1)])[
        "orders"].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    delivered: dict[int, tuple[int, int]] = {}

    def report(err: KafkaError | None, message: Any) -> None:
        assert err is None, err
        delivered[int(message.value()[1:])] = (message.partition(), message.offset())

    total = 20_000
    for i in range(total):
        producer.produce("orders", key=b"k%d" % i, value=b"v%d" % i,
                         headers=[("n", b"%d" % i), ("empty", None)], partition=i % 3,
                         on_delivery=report)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert len(delivered) == total
    got = _consume(bootstrap, "orders", 3, total)
    assert sum(map(len, got.values())) == total
    for partition, messages in got.items():
        numbers = [int(m.value()[1:]) for m in messages]
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
        assert all(n % 3 == partition for n in numbers)
        for message, n in zip(messages, numbers, strict=True):
            assert message.key() == b"k%d" % n
            assert message.headers() == [("n", b"%d" % n), ("empty", None)]
            assert (partition, message.offset()) == delivered[n]


async def _aiokafka_round_trip(bootstrap: str, total: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([AioNewTopic("ledger", 3, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    try:
        sent = [await producer.send("ledger", key=b"k%d" % i, value=b"v%d" % i,
                                    headers=[("n", b"%d" % i)], partition=i % 3)
                for i in range(total)]
        delivered = [(m.partition, m.offset) for m in await asyncio.gather(*sent)]
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        parts = [AioTopicPartition("ledger", p) for p in range(3)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        got: dict[int, list[Any]] = {p: [] for p in range(3)}
        deadline = time.monotonic() + 120
        while sum(map(len, got.values())) < total and time.monotonic() < deadline:
            for part, records in (await consumer.getmany(timeout_ms=1000)).items():
                got[part.partition].extend(records)
    finally:
        await consumer.stop()
    assert sum(map(len, got.values())) == total
    for partition, records in got.items():
        numbers = [int(r.value[1:]) for r in records]
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
        for record, n in zip(records, numbers, strict=True):
            assert (record.key, record.headers) == (b"k%d" % n, (("n", b"%d" % n),))
            assert (partition, record.offset) == delivered[n]


def test_aiokafka_round_trips_20000_keyed_records_on_3_partitions(broker_process: Make) -> None:
    _, bootstrap = _start(broker_process)
    asyncio.run(_aiokafka_round_trip(bootstrap, 20_000))


# kafka-python loads its protocol schemas with importlib.resources' legacy functions.
@pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")
def test_kafka_python_produces_idempotently_and_consumes_in_a_group(
        broker_process: Make) -> None:
    """kafka-python negotiates its own versions: CreateTopics, an idempotent producer of
    keyed records with headers on 3 partitions, a consumer group that reads each once, in
    order, and commits."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka.admin import NewTopic as KafkaNewTopic

    _, bootstrap = _start(broker_process)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([KafkaNewTopic("pythons", 3, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all",
                             enable_idempotence=True)
    total = 3000
    sent = [producer.send("pythons", key=b"k%d" % i, value=b"%d" % i,
                          headers=[("n", b"%d" % i)], partition=i % 3) for i in range(total)]
    producer.flush(60)
    delivered = [(m.partition, m.offset) for m in (future.get(30) for future in sent)]
    producer.close()
    consumer = KafkaConsumer("pythons", bootstrap_servers=bootstrap, group_id="pythons",
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=30_000)
    try:
        got = []
        for message in consumer:
            got.append(message)
            if len(got) == total:
                break
        consumer.commit()
        committed = {p: consumer.committed(KafkaTopicPartition("pythons", p))
                     for p in range(3)}
    finally:
        consumer.close()
    assert sorted(int(m.value) for m in got) == list(range(total))  # each once
    for m in got:
        n = int(m.value)
        assert (m.key, list(m.headers)) == (b"k%d" % n, [("n", b"%d" % n)])
        assert (m.partition, m.offset) == delivered[n]
    for p in range(3):
        offsets = [m.offset for m in got if m.partition == p]
        assert offsets == sorted(offsets) and committed[p] == offsets[-1] + 1


def test_confluent_kafka_finds_offsets_for_times(broker_process: Make) -> None:
    _, bootstrap = _start(broker_process)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("timed", value=b"early")
    assert producer.flush(30) == 0
    time.sleep(0.3)  # append times are kept to 100 ms
    middle = int(time.time() * 1000)
    time.sleep(0.3)
    offsets: list[int] = []
    producer.produce("timed", value=b"late",
                     on_delivery=lambda err, m: offsets.append(m.offset() or 0))
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "times"})
    try:
        found = consumer.offsets_for_times([TopicPartition("timed", 0, middle)], timeout=30)
        assert found[0].offset == offsets[0]
        low, high = consumer.get_watermark_offsets(TopicPartition("timed", 0), timeout=30)
        assert high == offsets[0] + 1 and low < offsets[0]
    finally:
        consumer.close()


def _kcat(*args: str, stdin: str | None = None) -> str:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is missing: make kcat installs it"
    done = subprocess.run([kcat, *args], input=stdin, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kcat_produces_and_consumes_keys_and_headers(broker_process: Make) -> None:
    process, bootstrap = _start(broker_process)
    lines = "".join(f"key{i}:value {i}\n" for i in range(100))
    _kcat("-b", bootstrap, "-t", "lines", "-P", "-K:", "-H", "origin=kcat", stdin=lines)
    out = _kcat("-b", bootstrap, "-t", "lines", "-C", "-e", "-f", "%k|%s|%h|%o\n")
    rows = [line.split("|") for line in out.splitlines()]
    assert [(k, v, h) for k, v, h, _ in rows] == [
        (f"key{i}", f"value {i}", "origin=kcat") for i in range(100)]
    offsets = [int(o) for *_, o in rows]
    assert offsets == sorted(offsets)
    listing = _kcat("-b", bootstrap, "-L", "-t", "lines")
    assert 'topic "lines" with 1 partitions' in listing
    # What kcat wrote, read over HTTP: envelopes with the key and headers.
    row = next(t for t in _get_json(process, "topics") if t.get("kafka_topic") == "lines")
    assert row["last_index"] == offsets[-1]
    messages = _read(process, row["id"])
    assert [m.index for m in messages] == offsets
    assert open_envelope(messages[0].data).headers == (("origin", b"kcat"),)


def test_kcat_round_trips_20000_keyed_records_on_3_partitions(broker_process: Make) -> None:
    _, bootstrap = _start(broker_process)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("keyed", num_partitions=3, replication_factor=1)])[
        "keyed"].result(30)
    total = 20_000
    lines = "".join(f"key{i % 500}:{i}\n" for i in range(total))  # 40 records per key
    _kcat("-b", bootstrap, "-t", "keyed", "-P", "-K:", "-H", "origin=kcat", stdin=lines)
    out = _kcat("-b", bootstrap, "-t", "keyed", "-C", "-e", "-f", "%p|%o|%k|%s|%h\n")
    rows = [line.split("|") for line in out.splitlines()]
    assert sorted(int(value) for *_, value, _ in rows) == list(range(total))  # once each
    partitions: dict[int, list[tuple[int, int]]] = {}
    owner: dict[str, str] = {}
    for partition, offset, key, value, headers in rows:
        assert key == f"key{int(value) % 500}" and headers == "origin=kcat"
        assert owner.setdefault(key, partition) == partition  # a key stays on its partition
        partitions.setdefault(int(partition), []).append((int(offset), int(value)))
    assert set(partitions) == {0, 1, 2}
    for read in partitions.values():  # in order: offsets and what was sent both increase
        assert read == sorted(read) and [v for _, v in read] == sorted(v for _, v in read)


def _get_json(process: BrokerProcess, what: str) -> Any:
    with urllib.request.urlopen(f"{process.url}/messaging/{what}", timeout=30) as answer:
        return json.load(answer)


def _read(process: BrokerProcess, topic: int) -> list[Message]:
    with urllib.request.urlopen(f"{process.url}/messaging/messages?topicID={topic}",
                                timeout=30) as answer:
        messages, _ = decode(answer.read())
    return messages


def test_http_and_kafka_clients_read_each_others_messages(broker_process: Make) -> None:
    process, bootstrap = _start(broker_process)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("mixed", key=b"k", value=b"from kafka", headers=[("h", b"1")])
    assert producer.flush(30) == 0
    row = next(t for t in _get_json(process, "topics") if t.get("kafka_topic") == "mixed")
    request = urllib.request.Request(
        f"{process.url}/messaging/messages?topicID={row['id']}", data=b"from http",
        method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200
    got = _consume(bootstrap, "mixed", 1, 2)[0]
    assert [(m.key(), m.value(), m.headers()) for m in got] == [
        (b"k", b"from kafka", [("h", b"1")]), (None, b"from http", None)]
    messages = _read(process, row["id"])
    assert messages[0].type == KAFKA_RECORD_TYPE
    assert open_envelope(messages[0].data).value == b"from kafka"
    assert (messages[1].type, messages[1].data) == (1, b"from http")
    assert [m.index for m in messages] == [m.offset() for m in got]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_compressed_batches(broker_process: Make, codec: str) -> None:
    _, bootstrap = _start(broker_process)
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                         "linger.ms": 20})
    for i in range(500):
        producer.produce("packed", value=b"value %d " % i * 10)
    assert producer.flush(30) == 0
    got = _consume(bootstrap, "packed", 1, 500)[0]
    assert [m.value() for m in got] == [b"value %d " % i * 10 for i in range(500)]


def _settle(consumers: list[Consumer], partitions: int, within: float = 60.0) -> None:
    """Poll every consumer until their assignments split the partitions between them."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for consumer in consumers:
            assert consumer.poll(0.2) is None  # nothing is produced yet
        owned = [{tp.partition for tp in c.assignment()} for c in consumers]
        if (all(owned) and sum(map(len, owned)) == partitions
                and set().union(*owned) == set(range(partitions))):
            return
    raise AssertionError(f"no split within {within:g} s: {owned}")


def _group_consumer(bootstrap: str, group: str, strategy: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "partition.assignment.strategy": strategy,
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_a_group_splits_partitions_commits_and_a_new_member_resumes_after_the_commit(
        broker_process: Make, strategy: str) -> None:
    process, bootstrap = _start(broker_process)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("work", num_partitions=3, replication_factor=1)])[
        "work"].result(30)
    first, second = (_group_consumer(bootstrap, "workers", strategy) for _ in range(2))
    for consumer in (first, second):
        consumer.subscribe(["work"])
    _settle([first, second], 3)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(300):
        producer.produce("work", value=b"%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    seen: dict[Consumer, list[Any]] = {first: [], second: []}
    deadline = time.monotonic() + 60
    while sum(map(len, seen.values())) < 300 and time.monotonic() < deadline:
        for consumer, got in seen.items():
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                got.append(message)
                consumer.commit(message=message, asynchronous=False)
    values = sorted(int(m.value()) for got in seen.values() for m in got)
    assert values == list(range(300))  # every record once
    assert {m.partition() for m in seen[first]}.isdisjoint({m.partition() for m in seen[second]})
    assert seen[first] and seen[second]
    # The committed offsets are consumer positions: the HTTP side shows the group's progress.
    rows = [t for t in _get_json(process, "topics") if t.get("kafka_topic") == "work"]
    assert all(row["subscribers"]["workers"] == row["last_index"] for row in rows)
    listed = subprocess.run([sys.executable, "-m", "messaging.cli", "consumers", process.url],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    shown = {line.split()[0]: line.split() for line in listed.splitlines()[1:]}
    assert {"work/0", "work/1", "work/2"} <= set(shown)  # a group's lag, by partition
    assert all(shown[f"work/{p}"][3] == "0" and shown[f"work/{p}"][-1] == "workers"
               for p in range(3))
    first.close()
    second.close()
    for i in range(300, 330):
        producer.produce("work", value=b"%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    late = _group_consumer(bootstrap, "workers", strategy)
    late.subscribe(["work"])
    resumed: list[int] = []
    deadline = time.monotonic() + 60
    while len(resumed) < 30 and time.monotonic() < deadline:
        message = late.poll(0.2)
        if message is not None and message.error() is None:
            resumed.append(int(message.value() or b"-1"))
    late.close()
    assert sorted(resumed) == list(range(300, 330))


def test_kill_9_under_an_idempotent_producer_loses_nothing_and_stores_nothing_twice(
        broker_process: Make, tmp_path: Path) -> None:
    http_port, kafka_port = free_port(), free_port()
    bootstrap = f"127.0.0.1:{kafka_port}"
    data = tmp_path / "crash"
    args = ("--kafka-bind", bootstrap)
    first = broker_process(data, *args, port=http_port).start()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("safe", num_partitions=2, replication_factor=1)])[
        "safe"].result(30)
    total = 20_000

    def kill_and_restart() -> None:
        first.kill()  # SIGKILL with batches in flight
        broker_process(data, *args, port=http_port).start()

    acked = produce_through(idempotent_producer(bootstrap), "safe", total, 2, kill_and_restart)
    assert len(acked) == total
    got = _consume(bootstrap, "safe", 2, total)
    values = [int(m.value() or b"-1") for messages in got.values() for m in messages]
    assert len(values) == len(set(values)) == total  # every one, once
    for partition, messages in got.items():
        numbers = [int(m.value() or b"-1") for m in messages]
        assert numbers == sorted(numbers) and all(n % 2 == partition for n in numbers)
