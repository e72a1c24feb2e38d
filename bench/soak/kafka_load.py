"""The soak's Kafka load (``--kafka``): librdkafka clients beside the HTTP load, on the same
broker, in threads of their own (confluent-kafka blocks).

- An idempotent producer sends numbered records round-robin to a topic of two partitions at
  a bounded rate, and records each acknowledgement's partition and offset.
- A consumer group comes and goes: members join for a few seconds to a few tens of seconds,
  commit what they read, and leave; another joins. Each member checks that every partition's
  records arrive in increasing offsets and values.
- At the end a reader takes each partition from its log start (retention runs all through
  the soak) and checks that every record acknowledged at or after it is there once, with
  its value.

Whatever goes wrong is an anomaly in the soak's ledger, which fails the run.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

TOPIC = "soak-kafka"
PARTITIONS = 2
GROUP = "soak-group"
#: Records produced per second (bounded, beside the HTTP load).
RATE = 400
#: How long a group member stays (seconds, drawn uniformly).
MEMBER_LIFETIME = (3.0, 25.0)


@dataclass
class KafkaLedger:
    """What the Kafka clients did and saw."""

    acked: dict[tuple[int, int], int] = field(default_factory=dict)  # (partition, offset) -> n
    produce_errors: list[str] = field(default_factory=list)
    consumed: int = 0
    members: int = 0
    rebalancing_commits: int = 0  # commits refused while the group rebalanced
    anomalies: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def create_topic(bootstrap: str) -> None:
    """The soak's Kafka topic (two partitions)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS,
                                  replication_factor=1)])[TOPIC].result(30)


def produce(bootstrap: str, ledger: KafkaLedger, deadline: float) -> None:
    """Send numbered records at RATE until ``deadline``; wait for every acknowledgement."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})

    def report(err: KafkaError | None, message: Any) -> None:
        with ledger.lock:
            if err is not None:
                ledger.produce_errors.append(str(err))
            else:
                ledger.acked[(message.partition(), message.offset())] = int(message.value())

    n = 0
    started = time.monotonic()
    while time.monotonic() < deadline:
        due = int((time.monotonic() - started) * RATE)
        while n < due:
            producer.produce(TOPIC, value=b"%d" % n, partition=n % PARTITIONS,
                             on_delivery=report)
            n += 1
        producer.poll(0.05)
    left = producer.flush(60)
    if left:
        ledger.anomalies.append(f"kafka: {left} produced records never acknowledged")
    if ledger.produce_errors:
        ledger.anomalies.append(f"kafka: {len(ledger.produce_errors)} produce errors, e.g. "
                                f"{ledger.produce_errors[0]}")


def churn_group(bootstrap: str, ledger: KafkaLedger, deadline: float,
                rng: random.Random) -> None:
    """Members of one group join, read, commit and leave, one after another."""
    while time.monotonic() < deadline - 1:
        lifetime = min(rng.uniform(*MEMBER_LIFETIME), deadline - time.monotonic())
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
        consumer.subscribe([TOPIC])
        ledger.members += 1
        last: dict[int, tuple[int, int]] = {}  # partition -> (offset, value)
        ends = time.monotonic() + lifetime
        try:
            while time.monotonic() < ends:
                batch = consumer.consume(500, timeout=0.5)
                for message in batch:
                    if message.error() is not None:
                        if message.error().code() != KafkaError._PARTITION_EOF:
                            ledger.anomalies.append(f"kafka consume: {message.error()}")
                        continue
                    partition, offset = message.partition() or 0, message.offset() or 0
                    value = int(message.value() or b"-1")
                    before = last.get(partition)
                    if before is not None and (offset <= before[0] or value <= before[1]):
                        ledger.anomalies.append(
                            f"kafka: partition {partition} went back from offset {before[0]} "
                            f"(value {before[1]}) to {offset} (value {value})")
                    last[partition] = (offset, value)
                    ledger.consumed += 1
                if batch:
                    _commit(consumer, ledger)
        except Exception as err:
            ledger.anomalies.append(f"kafka group member failed: {err!r}")
        finally:
            consumer.close()


#: What a commit may meet while the group rebalances (the member commits again later).
_REBALANCING = {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
                KafkaError.UNKNOWN_MEMBER_ID, KafkaError._NO_OFFSET}


def _commit(consumer: Consumer, ledger: KafkaLedger) -> None:
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as err:
        if err.args[0].code() not in _REBALANCING:
            raise
        ledger.rebalancing_commits += 1


def check_all_kept(bootstrap: str, ledger: KafkaLedger) -> None:
    """Every acknowledged record at or after its partition's log start is there, once."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-check",
                         "enable.auto.commit": False})
    try:
        for partition in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition),
                                                       timeout=30)
            wanted = {offset: value for (p, offset), value in ledger.acked.items()
                      if p == partition and offset >= low}
            consumer.assign([TopicPartition(TOPIC, partition, low)])
            found: dict[int, int] = {}
            deadline = time.monotonic() + 120
            while len(found) < len(wanted) and time.monotonic() < deadline:
                for message in consumer.consume(5000, timeout=1.0):
                    if message.error() is None and (message.offset() or 0) < high:
                        offset = message.offset() or 0
                        if offset in found:
                            ledger.anomalies.append(f"kafka: offset {offset} read twice")
                        found[offset] = int(message.value() or b"-1")
            if found != wanted:
                missing = sorted(set(wanted) - set(found))[:5]
                wrong = [o for o in wanted if o in found and found[o] != wanted[o]][:5]
                ledger.anomalies.append(f"kafka partition {partition}: {len(wanted)} records "
                                        f"acknowledged from {low}, {len(found)} read back; "
                                        f"missing {missing}, wrong values at {wrong}")
    finally:
        consumer.close()


def run(bootstrap: str, ledger: KafkaLedger, seconds: float, seed: int) -> None:
    """The whole Kafka load for ``seconds``, then the check (in the calling thread)."""
    create_topic(bootstrap)
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=produce, args=(bootstrap, ledger, deadline),
                                name="soak-kafka-producer"),
               threading.Thread(target=churn_group,
                                args=(bootstrap, ledger, deadline, random.Random(seed)),
                                name="soak-kafka-group")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 180)
        if thread.is_alive():
            ledger.anomalies.append(f"kafka: {thread.name} did not end")
    check_all_kept(bootstrap, ledger)
