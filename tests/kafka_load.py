"""An idempotent librdkafka producer that something is done to halfway: the load of the tests
that kill a broker under it (one node, and a node of a cluster)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Producer


def idempotent_producer(bootstrap: str) -> Producer:
    """A producer that retries across a broker's death for two minutes."""
    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                     "linger.ms": 2, "message.timeout.ms": 120_000,
                     "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
                     "topic.metadata.refresh.interval.ms": 1000})


def produce_through(producer: Producer, topic: str, total: int, partitions: int,
                    halfway: Callable[[], None]) -> set[int]:
    """Send ``total`` records (values 0, 1, ... round-robin over the partitions): half, then
    once a tenth are acknowledged a burst of a tenth more, then ``halfway`` while that burst
    is in flight, then the rest; wait for all. The values acknowledged (every one: a
    delivery error fails the caller's test)."""
    acked: set[int] = set()
    failed: list[str] = []

    def report(err: KafkaError | None, message: Any) -> None:
        if err is None:
            acked.add(int(message.value()))
        else:
            failed.append(str(err))

    def send(i: int) -> None:
        while True:
            try:
                producer.produce(topic, value=b"%d" % i, partition=i % partitions,
                                 on_delivery=report)
                return
            except BufferError:  # the queue is full while no broker takes it
                producer.poll(0.05)

    half = total // 2
    for i in range(half):
        send(i)
        producer.poll(0)
    deadline = time.monotonic() + 60
    while len(acked) < total // 10 and time.monotonic() < deadline:
        producer.poll(0.001)
    assert len(acked) >= total // 10, f"only {len(acked)} records acknowledged in 60 s"
    # A burst sent just before ``halfway``: its batches are on their way when it acts.
    burst = min(total // 10, total - half)
    for i in range(half, half + burst):
        send(i)
    producer.poll(0.005)
    in_flight = half + burst - len(acked)
    halfway()
    assert in_flight > 0, "every record was acknowledged before halfway acted"
    for i in range(half + burst, total):
        send(i)
        producer.poll(0)
    assert producer.flush(120) == 0
    assert not failed, failed[:3]
    return acked
