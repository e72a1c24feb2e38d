"""Kafka clients against HTTP on one broker: confluent-kafka producing and consuming 100 B
records beside the HTTP batch publish and a ``Conn`` consuming the same number, same run.

One broker process (``--fsync always``, the default) serves both faces on 127.0.0.1. Each
round measures, in alternating order:

- **Kafka produce**: a librdkafka producer (``linger.ms=5``, ``acks=all``) sends ``records``
  100-byte random records to one partition; records/s from the first send to ``flush()``.
- **HTTP batch publish**: 4 concurrent senders of 1,000-message frame batches (the
  benchmarks' usual batch load, :func:`bench.harness.publish_load.throughput`) for the
  round's seconds; messages/s.
- **Kafka consume**: a librdkafka consumer reads the partition's ``records`` from the start;
  records/s until the last one arrived (``fetch.queue.backoff.ms=10``: by default librdkafka
  pauses a second whenever its local queue is full).
- **Conn consume**: ``Client.conn`` reads as many messages of the HTTP topic from index 0.

Every phase runs with Python's cyclic garbage collector paused, as ``timeit`` times code: a
consumer handed 10,000 messages per call otherwise spends over half its time in collections
of the objects it was just given (py-spy: 57 % of the librdkafka consumer's Python thread in
``gc_collect_main``), and the benchmark would time the client's collector, not the broker.

The targets are issue 41's: Kafka produce at least the HTTP batch rate, Kafka consume at
least Conn's. Figures are medians of the rounds; written to results/kafka.json, its PNG and
its section of RESULTS.md.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp
from confluent_kafka import Consumer, Producer, TopicPartition

from bench.harness import settings
from bench.harness.figures import Row
from bench.harness.procs import broker, free_port
from bench.harness.publish_load import throughput
from bench.harness.results import command_line, report, results_under
from bench.harness.sampling import cpu_seconds
from messaging.client import Client

BENCH = "kafka"
RECORD = 100
#: The most one measured phase may take (a stuck broker must not hang the benchmark).
PHASE_TIMEOUT = 300.0


@dataclass
class Settings(settings.Settings):
    """Rounds, the seconds of an HTTP publish run, and the records of a Kafka run."""

    rounds: int = 5
    seconds: float = 5.0
    records: int = 500_000


QUICK = Settings(rounds=1, seconds=1.0, records=20_000)


def kafka_produce(bootstrap: str, topic: str, records: int) -> float:
    """Records/s of one librdkafka producer (linger.ms=5, acks=all) sending ``records``, 1,000
    prepared records at a time (``produce_batch``: as the HTTP load sends prepared bodies)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                         "queue.buffering.max.messages": 1_000_000})
    batch = [{"value": os.urandom(RECORD)} for _ in range(1000)]
    started = time.perf_counter()
    sent = 0
    while sent < records:
        try:
            sent += producer.produce_batch(topic, batch[:records - sent], partition=0)
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    left = producer.flush(PHASE_TIMEOUT)
    elapsed = time.perf_counter() - started
    if left:
        raise RuntimeError(f"Kafka produce: {left} records not delivered")
    return records / elapsed


def kafka_consume(bootstrap: str, topic: str, records: int) -> float:
    """Records/s of one librdkafka consumer reading ``records`` from the partition's start
    (each record handed to Python once, as a Conn hands out each message)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                         "enable.auto.commit": False, "fetch.max.bytes": 52_428_800,
                         # librdkafka stops fetching for 1 s (its default) when its own queue
                         # is full, which a broker that answers faster than this loop drains
                         # fills: the client would time its back-off, not the broker.
                         "fetch.queue.backoff.ms": 10})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    last = None
    started = time.perf_counter()
    deadline = started + PHASE_TIMEOUT
    try:
        while got < records:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"Kafka consume: {got} of {records} in {PHASE_TIMEOUT} s")
            batch = consumer.consume(10_000, timeout=1.0)
            if batch:
                got += len(batch)
                last = batch[-1]
        elapsed = time.perf_counter() - started
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        if last is None or last.error() is not None or last.offset() != high - 1:
            raise RuntimeError(f"Kafka consume ended at {last.offset() if last else None}, "
                               f"not at the last record ({high - 1})")
        return records / elapsed
    finally:
        consumer.close()


async def conn_consume(url: str, topic: int, records: int) -> float:
    """Messages/s of one ``Conn`` reading ``records`` messages of ``topic`` from index 0."""
    async with Client(url) as client:
        conn = client.conn(topic, heartbeat_interval=0)
        await conn.open(0)
        got = 0
        started = time.perf_counter()
        try:
            async with asyncio.timeout(PHASE_TIMEOUT):
                async for _message in conn:
                    got += 1
                    if got >= records:
                        break
        finally:
            await conn.close()
        return records / (time.perf_counter() - started)


async def http_publish(url: str, topic: int, seconds: float) -> float:
    """Messages/s of the HTTP batch publish load."""
    async with aiohttp.ClientSession() as session:
        return await throughput(session, [url], topic, seconds)


def _constant(value: float, _rate: float) -> float:
    return value


def _times(seconds: float, rate: float) -> float:
    return rate * seconds


def _run(coroutine: Coroutine[Any, Any, float]) -> float:
    return asyncio.run(coroutine)


def measure(s: Settings, url: str, bootstrap: str, pid: int,
            ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Every round's four rates, and the broker's CPU per message in each (µs)."""
    names = ("kafka_produce", "http_publish", "kafka_consume", "conn_consume")
    rates: dict[str, list[float]] = {name: [] for name in names}
    costs: dict[str, list[float]] = {name: [] for name in names}

    def timed(name: str, run: Callable[[], float], count: Callable[[float], float]) -> None:
        before = cpu_seconds(pid)
        gc.collect()
        gc.disable()  # as timeit does: the clients' object churn is not what is measured
        try:
            rate = run()
        finally:
            gc.enable()
        rates[name].append(rate)
        costs[name].append((cpu_seconds(pid) - before) / count(rate) * 1e6)

    for r in range(s.rounds):
        topic_name, topic_id = f"bench{r}", 1000 + r
        records: Callable[[float], float] = partial(_constant, s.records)
        for which in (("kafka", "http") if r % 2 == 0 else ("http", "kafka")):
            if which == "kafka":
                timed("kafka_produce", partial(kafka_produce, bootstrap, topic_name, s.records),
                      records)
            else:  # the messages the senders' window took (preparing the bodies takes none)
                timed("http_publish", partial(_run, http_publish(url, topic_id, s.seconds)),
                      partial(_times, s.seconds))
        for which in (("kafka", "conn") if r % 2 == 0 else ("conn", "kafka")):
            if which == "kafka":
                timed("kafka_consume", partial(kafka_consume, bootstrap, topic_name, s.records),
                      records)
            else:
                timed("conn_consume", partial(_run, conn_consume(url, topic_id, s.records)),
                      records)
        print(f"round {r + 1}: " + ", ".join(
            f"{k} {v[-1]:,.0f}/s ({costs[k][-1]:.2f} µs of broker CPU each)"
            for k, v in rates.items()), flush=True)
    return rates, costs


def main() -> None:
    p = settings.parser(__doc__ or "", "one round of 20,000 records")
    args = p.parse_args()
    s = settings.with_rounds(QUICK if args.quick else Settings(), args)
    results_under(args.out, quick=args.quick, bench=BENCH)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-kafka-",
                                     dir=os.environ.get("BENCH_DIR")) as tmp:
        proc, url = broker(Path(tmp) / "data", "--kafka-bind", f"127.0.0.1:{port}")
        try:
            rates, costs = measure(s, url, f"127.0.0.1:{port}", proc.pid)
        finally:
            proc.stop()
    median = {k: statistics.median(v) for k, v in rates.items()}
    cost = {k: statistics.median(v) for k, v in costs.items()}
    rows = [
        Row("Kafka produce, 100 B records (librdkafka, linger.ms=5, acks=all)",
            median["kafka_produce"], "records/s", "HTTP batch publish",
            median["http_publish"], ">= 1.0x",
            median["kafka_produce"] >= median["http_publish"]),
        Row("Kafka consume from the start (librdkafka)", median["kafka_consume"], "records/s",
            "Conn from index 0", median["conn_consume"], ">= 1.0x",
            median["kafka_consume"] >= median["conn_consume"]),
    ]
    report(BENCH, "Kafka clients beside HTTP (issue 41)", rows, command_line(),
           notes=f"{s.rounds} rounds of {s.records:,} records (Kafka) and {s.seconds:g} s "
                 "of 4 HTTP batch senders; medians. Per round: "
                 + "; ".join(f"{k} " + ", ".join(f"{x:,.0f}" for x in v)
                             for k, v in rates.items())
                 + ".\n\nBroker CPU per message (µs, medians): "
                 + ", ".join(f"{k} {v:.2f}" for k, v in cost.items())
                 + ". Records and frames are converted in C (messaging/kafka/_records.c), "
                 "one pass each way: a record costs the broker no Python step of its own. "
                 "The consumer sets fetch.queue.backoff.ms=10: librdkafka otherwise stops "
                 "fetching for a second whenever its queue is full, which a broker faster "
                 "than the reading loop causes.")


if __name__ == "__main__":
    main()
