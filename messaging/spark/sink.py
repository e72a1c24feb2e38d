"""Writing to topics from Spark: rows (``topic``, ``data``, optional ``type``) become batch
publishes of at most :data:`MAX_PUBLISH_BYTES`.

The guarantee is **at-least-once**: a task Spark retries publishes its rows again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from messaging.errors import MessagingError
from messaging.message import HEADER_SIZE, encode_batch
from messaging.spark.broker_http import BrokerHTTP
from messaging.spark.options import broker_urls, lower_case

log = logging.getLogger(__name__)

MAX_PUBLISH_BYTES = 8 << 20


@dataclass
class PublishedMessage(WriterCommitMessage):
    """What one task published."""

    count: int


def publish_rows(urls: Sequence[str], rows: Iterator[Any]) -> PublishedMessage:
    """Publish rows with ``topic``, ``data`` and optional ``type`` in batch requests."""
    broker = BrokerHTTP(urls)
    pending: dict[tuple[int, int], list[bytes]] = {}
    size = 0
    count = 0

    def flush() -> None:
        nonlocal size
        for (topic, type_), datas in pending.items():
            broker.publish_frames(encode_batch(topic, datas, type_))
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
        if size >= MAX_PUBLISH_BYTES:
            flush()
    flush()
    return PublishedMessage(count)


class MessagingStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("messaging")``: at-least-once publishing of every micro-batch."""

    def __init__(self, options: dict[str, str]) -> None:
        self.urls = broker_urls(lower_case(options))

    def write(self, iterator: Iterator[Any]) -> PublishedMessage:
        """Publish one task's rows (on an executor)."""
        return publish_rows(self.urls, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log what the micro-batch published."""
        total = sum(m.count for m in messages if isinstance(m, PublishedMessage))
        log.info("micro-batch %d: published %d messages", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing can be taken back: say so."""
        log.warning("micro-batch %d aborted; messages already published stay published "
                    "(at-least-once)", batchId)


class MessagingBatchWriter(DataSourceWriter):
    """``df.write.format("messaging")``: publish every row (at-least-once)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.urls = broker_urls(lower_case(options))

    def write(self, iterator: Iterator[Any]) -> PublishedMessage:
        """Publish one task's rows (on an executor)."""
        return publish_rows(self.urls, iterator)
