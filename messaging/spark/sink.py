"""Writing to topics from Spark: rows (``topic``, ``data``, optional ``type``) become batch
publishes of at most :data:`MAX_PUBLISH_BYTES`.

Other columns are ignored: a DataFrame read from a topic keeps its ``index`` and ``timestamp``
and can be written to another topic as it is; the broker gives every message it stores its own
index and append time (a row's ``timestamp`` is not carried over).

The guarantee is **exactly-once** across task retries and restarted queries: each task
publishes as an idempotent producer whose id is a function of what it writes — the query id,
micro-batch id and partition of a streaming write (``writeStream``), or the job and
partition of a batch write — with one sequence number per topic counting its requests. A
retried task, or a micro-batch a restarted query runs again, sends the same requests with
the same ids and sequence numbers, and the broker stores each once (Spark's own Kafka sink is
at-least-once). This needs the rows of a partition to come in the same order when it is
recomputed, as Spark's deterministic sources and plans guarantee.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from messaging.errors import MessagingError
from messaging.frames import HEADER_SIZE, encode_batch
from messaging.spark.broker_http import BrokerHTTP
from messaging.spark.options import broker_urls, lower_case, max_publish_bytes

log = logging.getLogger(__name__)

MAX_PUBLISH_BYTES = 8 << 20
#: Spark's local properties naming the streaming query (stable across restarts from a
#: checkpoint) and the micro-batch a task belongs to.
QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"


@dataclass
class PublishedMessage(WriterCommitMessage):
    """What one task published."""

    count: int


def publish_rows(urls: Sequence[str], rows: Iterator[Any], producer: str | None = None,
                 max_bytes: int = MAX_PUBLISH_BYTES, *, token: str | None = None,
                 ca: str | None = None) -> PublishedMessage:
    """Publish rows with ``topic``, ``data`` and optional ``type`` in batch requests (other
    columns, such as a read's ``index`` and ``timestamp``, are ignored); as idempotent
    producer ``producer`` (epoch 0, one sequence per topic) when given."""
    broker = BrokerHTTP(urls, token=token, ca=ca)
    pending: dict[tuple[int, int], list[bytes]] = {}
    sequence: dict[int, int] = {}
    size = 0
    count = 0

    def flush() -> None:
        nonlocal size
        for (topic, type_), datas in pending.items():
            seq = sequence.get(topic, 0)
            broker.publish_frames(encode_batch(topic, datas, type_),
                                  (producer, 0, seq) if producer is not None else None, topic)
            sequence[topic] = seq + 1
        pending.clear()
        size = 0

    for row in rows:
        fields = row.asDict() if hasattr(row, "asDict") else dict(row)
        if fields.get("topic") is None or fields.get("data") is None:
            raise MessagingError("rows written to messaging need non-null topic and data columns")
        data = fields["data"]
        data = data.encode() if isinstance(data, str) else bytes(data)
        type_ = fields.get("type")
        pending.setdefault((int(fields["topic"]), 1 if type_ is None else int(type_)),
                           []).append(data)
        size += HEADER_SIZE + len(data)
        count += 1
        if size >= max_bytes:
            flush()
    flush()
    return PublishedMessage(count)


def task_producer(job: str) -> str:
    """The idempotent producer id of the running task: ``job`` and the partition (on an
    executor; the same for every attempt of the task)."""
    context = TaskContext.get()
    if context is None:
        raise MessagingError("the messaging sink writes from Spark tasks only")
    return f"spark:{job}:{context.partitionId()}"


def micro_batch() -> str:
    """``<query id>:<batch id>`` of the micro-batch this task writes (Spark's local
    properties; the query id survives restarts from a checkpoint)."""
    context = TaskContext.get()
    query = context.getLocalProperty(QUERY_ID) if context is not None else None
    batch = context.getLocalProperty(BATCH_ID) if context is not None else None
    if not query or batch is None:
        raise MessagingError("the messaging stream sink runs inside a streaming query only")
    return f"{query}:{batch}"


class MessagingStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("messaging")``: exactly-once publishing of every micro-batch."""

    def __init__(self, options: dict[str, str]) -> None:
        self.urls = broker_urls(lower_case(options))
        self.token = lower_case(options).get("token") or None
        self.ca = lower_case(options).get("ca") or None
        self.max_bytes = max_publish_bytes(options, MAX_PUBLISH_BYTES)

    def write(self, iterator: Iterator[Any]) -> PublishedMessage:
        """Publish one task's rows (on an executor), idempotently."""
        return publish_rows(self.urls, iterator, task_producer(micro_batch()), self.max_bytes,
                            token=self.token, ca=self.ca)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log what the micro-batch published."""
        total = sum(m.count for m in messages if isinstance(m, PublishedMessage))
        log.info("micro-batch %d: published %d messages", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing can be taken back: say so (running the batch again stores nothing twice)."""
        log.warning("micro-batch %d aborted; messages already published stay published, and "
                    "running the micro-batch again does not publish them twice", batchId)


class MessagingBatchWriter(DataSourceWriter):
    """``df.write.format("messaging")``: publish every row, exactly once per job (a retried
    task does not publish twice; running the job again does)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.urls = broker_urls(lower_case(options))
        self.token = lower_case(options).get("token") or None
        self.ca = lower_case(options).get("ca") or None
        self.max_bytes = max_publish_bytes(options, MAX_PUBLISH_BYTES)
        self.job = uuid.uuid4().hex  # made on the driver: the same in every task attempt

    def write(self, iterator: Iterator[Any]) -> PublishedMessage:
        """Publish one task's rows (on an executor), idempotently."""
        return publish_rows(self.urls, iterator, task_producer(self.job), self.max_bytes,
                            token=self.token, ca=self.ca)
