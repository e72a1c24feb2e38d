"""Spark reads and writes topics: the Python data source ``messaging`` (PySpark >= 4.2).

Synchronous code only (it runs on the driver and in executors' Python workers). Offsets are
``{"<topic>": <next index>}``; an input partition is a self-contained (topic, index range,
broker URLs) chunk that an executor reads with one non-streaming GET, verifying every frame's
CRC and turning the frames into Arrow record batches without a Python object per row.

The sink publishes rows (``topic``, ``data`` and optional ``type``) in batch publishes. Its
guarantee is **at-least-once**: a task Spark retries publishes its rows again.
"""

from __future__ import annotations

import http.client
import json
import logging
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from messaging.errors import (
    ConnectionFailedError,
    CorruptFrameError,
    MessagingError,
    TopicTruncatedError,
    error_for_status,
)
from messaging.message import (
    FRAMES_CONTENT_TYPE,
    HEADER_SIZE,
    BatchDecoder,
    FrameBatch,
    encode_batch,
)

log = logging.getLogger(__name__)

SCHEMA = "topic long, index long, type int, data binary"
DEFAULT_PARTITION_SIZE = 100_000
#: Rows per Arrow record batch handed to Spark.
ARROW_BATCH_ROWS = 65_536
READ_BLOCK = 4 << 20
MAX_PUBLISH_BYTES = 8 << 20
_HEADER_COLUMNS = np.arange(HEADER_SIZE)


class BrokerHTTP:
    """A small synchronous client: failover across URLs and 307 following."""

    def __init__(self, urls: Sequence[str], timeout: float = 60.0) -> None:
        if not urls:
            raise MessagingError("no broker URL given (option url or urls)")
        self.urls = list(urls)
        self.timeout = timeout

    def _connect(self, base: str) -> http.client.HTTPConnection:
        parts = urlsplit(base)
        if parts.scheme != "http" or not parts.hostname:
            raise MessagingError(f"invalid broker URL {base!r}: expected http://HOST:PORT")
        return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=self.timeout)

    def open(self, method: str, path: str, params: dict[str, Any] | None = None,
             body: bytes | None = None, headers: dict[str, str] | None = None,
             ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send a request; returns the open connection and response (caller closes)."""
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
        target = path + ("?" + query if query else "")
        errors = []
        for base in list(self.urls):
            url = base
            for _ in range(5):  # redirects
                conn = self._connect(url)
                try:
                    conn.request(method, target, body=body, headers=headers or {})
                    response = conn.getresponse()
                except OSError as err:
                    conn.close()
                    errors.append(f"{url}: {err}")
                    break
                if response.status == 307:
                    location = response.getheader("Location", "")
                    response.read()
                    conn.close()
                    parts = urlsplit(location)
                    url = f"{parts.scheme}://{parts.netloc}"
                    continue
                if response.status >= 300:
                    error = _error(response)
                    conn.close()
                    raise error
                return conn, response
        raise ConnectionFailedError(f"no broker reachable: {'; '.join(errors)}")

    def json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET a JSON answer."""
        conn, response = self.open("GET", path, params)
        try:
            return json.loads(response.read())
        finally:
            conn.close()

    def topic(self, topic: int, after: int | None = None, count: int | None = None,
              ) -> dict[str, Any] | None:
        """A topic's description, or None if it has no messages yet."""
        try:
            result: dict[str, Any] = self.json(f"/messaging/topics/{topic}",
                                               {"after": after, "count": count})
        except MessagingError as err:
            if err.status == 404:
                return None
            raise
        return result

    def broker_index(self) -> int:
        """The broker index (the last index assigned in any topic)."""
        return int(self.json("/messaging/diagnostics")["index"])

    def publish_frames(self, body: bytes) -> None:
        """POST a body of frames (all or nothing)."""
        conn, response = self.open("POST", "/messaging/messages", body=body,
                                   headers={"Content-Type": FRAMES_CONTENT_TYPE})
        response.read()
        conn.close()


def _error(response: http.client.HTTPResponse) -> MessagingError:
    message = response.getheader("X-Broker-Error") or response.read().decode(errors="replace")
    return error_for_status(response.status, message, response.getheader("X-Broker-First-Index"))


# -- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MessagingPartition(InputPartition):
    """Messages ``start`` <= index < ``end`` of one topic, read straight from a broker."""

    urls: tuple[str, ...]
    topic: int
    start: int
    end: int
    fail_on_data_loss: bool


def frames_to_arrow(buffer: bytes, offsets: array[int]) -> pa.RecordBatch:
    """Arrow columns (topic, index, type, data) from verified frames at ``offsets``."""
    raw = np.frombuffer(buffer, dtype=np.uint8)
    starts = np.frombuffer(offsets, dtype=np.int64)
    headers = raw[starts[:, None] + _HEADER_COLUMNS]  # (n, 26): every header, side by side
    index = headers[:, 0:8].copy().view(">u8").ravel().astype(np.int64)
    type_ = headers[:, 12:14].copy().view(">u2").ravel().astype(np.int32)
    topic = headers[:, 14:22].copy().view(">u8").ravel().astype(np.int64)
    lengths = headers[:, 22:26].copy().view(">u4").ravel().astype(np.int64)
    keep = np.ones(len(raw), dtype=bool)
    keep[(starts[:, None] + _HEADER_COLUMNS).ravel()] = False
    keep[int(starts[-1] + HEADER_SIZE + lengths[-1]):] = False
    values = raw[keep]
    value_offsets = np.zeros(len(starts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=value_offsets[1:])
    data = pa.Array.from_buffers(pa.binary(), len(starts),
                                 [None, pa.py_buffer(value_offsets), pa.py_buffer(values)])
    return pa.RecordBatch.from_arrays(
        [pa.array(topic), pa.array(index), pa.array(type_), data],
        names=["topic", "index", "type", "data"])


def read_partition(partition: MessagingPartition) -> Iterator[pa.RecordBatch]:
    """Stream one partition's frames, verify every CRC and index order, yield Arrow batches."""
    broker = BrokerHTTP(partition.urls)
    start = partition.start
    try:
        conn, response = broker.open("GET", "/messaging/messages", {
            "topicID": partition.topic, "index": start, "end": partition.end})
    except TopicTruncatedError as err:
        if partition.fail_on_data_loss:
            raise TopicTruncatedError(partition.topic, err.first_index) from err
        log.warning("topic %d: messages %d..%d were deleted by retention; continuing from %d "
                    "(failOnDataLoss=false)", partition.topic, start, err.first_index - 1,
                    err.first_index)
        if err.first_index >= partition.end:
            return
        start = err.first_index
        conn, response = broker.open("GET", "/messaging/messages", {
            "topicID": partition.topic, "index": start, "end": partition.end})
    decoder = BatchDecoder(after=max(start - 1, 0), max_count=ARROW_BATCH_ROWS, offsets=True)
    try:
        while block := response.read(READ_BLOCK):
            for batch in _decoded(decoder, partition.topic, block):
                assert batch.offsets is not None
                yield frames_to_arrow(batch.buffer, batch.offsets)
        _decoded(decoder, partition.topic, None)
    finally:
        conn.close()


def _decoded(decoder: BatchDecoder, topic: int, block: bytes | None) -> list[FrameBatch]:
    """Feed ``block`` (None: the end) to ``decoder``; damage names the topic."""
    try:
        if block is None:
            decoder.finish()
            return []
        return decoder.feed(block)
    except CorruptFrameError as err:
        raise CorruptFrameError(f"topic {topic}: {err}") from err


class _Options:
    """The source's options, parsed once with clear errors."""

    def __init__(self, given: dict[str, str]) -> None:
        options = _lower(given)
        self.urls = _urls(options)
        topics = options.get("topics") or options.get("topic") or ""
        try:
            self.topics = [int(t) for t in topics.split(",") if t.strip()]
        except ValueError:
            raise MessagingError(f"option topics {topics!r}: expected ids like 1,2") from None
        if not self.topics:
            raise MessagingError("option topics is required, e.g. 1,2")
        self.starting = options.get("startingindex", "earliest")
        self.ending = options.get("endingindex", "latest")
        self.max_records = _positive(options, "maxRecordsPerTrigger")
        self.partition_size = _positive(options, "partitionSize") or DEFAULT_PARTITION_SIZE
        flag = options.get("failondataloss", "true").lower()
        if flag not in ("true", "false"):
            raise MessagingError(f"option failOnDataLoss {flag!r}: expected true or false")
        self.fail_on_data_loss = flag == "true"


def _lower(options: dict[str, str]) -> dict[str, str]:
    """Spark passes option names case-insensitively (lower-cased); so do we."""
    return {key.lower(): value for key, value in options.items()}


def _urls(options: dict[str, str]) -> tuple[str, ...]:
    urls = options.get("urls") or options.get("url") or ""
    found = tuple(u.strip().rstrip("/") for u in urls.split(",") if u.strip())
    if not found:
        raise MessagingError("option url (or urls) is required, e.g. http://127.0.0.1:8086")
    return found


def _positive(options: dict[str, str], name: str) -> int | None:
    value = options.get(name.lower())
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise MessagingError(f"option {name} {value!r}: expected a positive integer") from None
    if number < 1:
        raise MessagingError(f"option {name} {value!r}: expected a positive integer")
    return number


class _Planner:
    """Offset resolution and partition planning shared by batch and streaming reads."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self.broker = BrokerHTTP(options.urls)

    def resolve(self, spec: str, topic_ids: list[int]) -> dict[str, int]:
        """``earliest`` | ``latest`` | JSON ``{"<topic>": index}`` (-2 earliest, -1 latest)."""
        if spec in ("earliest", "latest"):
            per_topic: dict[str, Any] = {str(t): -2 if spec == "earliest" else -1
                                         for t in topic_ids}
        else:
            try:
                per_topic = json.loads(spec)
                assert isinstance(per_topic, dict)
            except (ValueError, AssertionError):
                raise MessagingError(f"index spec {spec!r}: expected earliest, latest or JSON "
                                     'like {"1": 10}') from None
        offsets = {}
        for topic in topic_ids:
            value = per_topic.get(str(topic))
            if value is None:
                raise MessagingError(f"index spec {spec!r} names no index for topic {topic}")
            offsets[str(topic)] = self._resolve_one(topic, int(value))
        return offsets

    def _resolve_one(self, topic: int, value: int) -> int:
        if value >= 0:
            return value
        info = self.broker.topic(topic)
        if value == -2:
            return int(info["first_index"]) if info else 0
        if info is not None:
            return int(info["last_index"]) + 1
        return self.broker.broker_index() + 1

    def latest(self, topic_ids: list[int]) -> dict[str, int]:
        """The offset just past each topic's last committed message."""
        result = {}
        for topic in topic_ids:
            info = self.broker.topic(topic)
            result[str(topic)] = int(info["last_index"]) + 1 if info and info["last_index"] else 0
        return result

    def advance(self, start: dict[str, int], ceiling: dict[str, int],
                max_rows: int | None) -> dict[str, int]:
        """``start`` moved toward ``ceiling``, at most ``max_rows`` messages in all."""
        end = {}
        behind = [t for t in start if ceiling.get(t, 0) > start[t]]
        share = max(1, max_rows // max(len(behind), 1)) if max_rows else None
        for key, begin in start.items():
            top = max(ceiling.get(key, begin), begin)
            if share is None or top <= begin:
                end[key] = top
                continue
            info = self.broker.topic(int(key), after=begin, count=share)
            nth = info.get("index") if info else None
            end[key] = top if nth is None else min(int(nth) + 1, top)
        return end

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[MessagingPartition]:
        """Chunks of about ``partitionSize`` messages between the two offsets."""
        parts = []
        size = self.options.partition_size
        for key, begin in start.items():
            stop = end.get(key, begin)
            topic = int(key)
            while begin < stop:
                info = self.broker.topic(topic, after=begin, count=size)
                nth = info.get("index") if info else None
                bound = stop if nth is None else min(int(nth) + 1, stop)
                parts.append(MessagingPartition(self.options.urls, topic, begin, bound,
                                                self.options.fail_on_data_loss))
                begin = bound
        return parts


class MessagingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Structured Streaming reads with admission control and Trigger.AvailableNow."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = _Options(options)
        self.planner = _Planner(self.options)
        self.target: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        return self.planner.resolve(self.options.starting, self.options.topics)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records:
            return ReadMaxRows(self.options.max_records)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.planner.latest(self.options.topics)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ceiling = self.target or self.planner.latest(self.options.topics)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return self.planner.advance(dict(start), ceiling, max_rows)

    def reportLatestOffset(self) -> dict[str, int]:
        return self.planner.latest(self.options.topics)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[MessagingPartition]:
        return self.planner.partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, MessagingPartition)
        return read_partition(partition)

    def commit(self, end: dict[str, int]) -> None:
        pass


class MessagingBatchReader(DataSourceReader):
    """Batch reads of a range: ``startingIndex`` to ``endingIndex`` (exclusive)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = _Options(options)
        self.planner = _Planner(self.options)

    def partitions(self) -> list[MessagingPartition]:
        topics = self.options.topics
        start = self.planner.resolve(self.options.starting, topics)
        end = self.planner.resolve(self.options.ending, topics)
        return self.planner.partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, MessagingPartition)
        return read_partition(partition)


# -- writing ---------------------------------------------------------------------------------


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
        self.urls = _urls(_lower(options))

    def write(self, iterator: Iterator[Any]) -> PublishedMessage:
        return publish_rows(self.urls, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.count for m in messages if isinstance(m, PublishedMessage))
        log.info("micro-batch %d: published %d messages", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("micro-batch %d aborted; messages already published stay published "
                    "(at-least-once)", batchId)


class MessagingBatchWriter(DataSourceWriter):
    """``df.write.format("messaging")``: publish every row (at-least-once)."""

    def __init__(self, options: dict[str, str]) -> None:
        self._stream = MessagingStreamWriter(options)

    def write(self, iterator: Iterator[Any]) -> PublishedMessage:
        return publish_rows(self._stream.urls, iterator)


class MessagingDataSource(DataSource):
    """The ``messaging`` data source: ``spark.dataSource.register(MessagingDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return "messaging"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> MessagingBatchReader:
        return MessagingBatchReader(dict(self.options))

    def streamReader(self, schema: StructType) -> MessagingStreamReader:
        return MessagingStreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> MessagingBatchWriter:
        return MessagingBatchWriter(dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> MessagingStreamWriter:
        return MessagingStreamWriter(dict(self.options))
