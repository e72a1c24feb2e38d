"""Reading topics into Spark: offsets, planning, partitions and the stream and batch readers.

Offsets are ``{"<topic>": <next index>}``, each index written as :mod:`messaging.json_ids`
writes integers (a string from 2^53 up) and read back in either form. An input partition is
a self-contained (topic, index range, broker URLs) chunk that an executor reads with one
non-streaming GET, verifying every frame's CRC and index order and handing Spark Arrow
record batches; the rows' append times come from one ``GET /messaging/times`` of the range.

Where a read starts and ends is resolved once, on the driver (:class:`Planner`): by index
(``startingIndex``, ``endingIndex``) or by append time (``startingTimestamp``,
``startingOffsetsByTimestamp``, ``endingTimestamp``), as :mod:`messaging.spark.options`
describes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from messaging.errors import CorruptFrameError, MessagingError, TopicTruncatedError
from messaging.frames import BatchDecoder, FrameBatch
from messaging.json_ids import json_integer, parse_u64
from messaging.spark.arrow import ARROW_BATCH_ROWS, frames_to_arrow
from messaging.spark.broker_http import BrokerHTTP
from messaging.spark.options import SourceOptions, describe
from messaging.spark.store_reads import StoreAccess, read_stored, stored_ranges
from messaging.spark.times import AppendTimes

log = logging.getLogger(__name__)

READ_BLOCK = 4 << 20


@dataclass(frozen=True)
class MessagingPartition(InputPartition):
    """Messages ``start`` <= index < ``end`` of one topic, read straight from a broker."""

    urls: tuple[str, ...]
    token: str | None
    ca: str | None
    topic: int
    start: int
    end: int
    fail_on_data_loss: bool
    #: With ``objectStore``: read what the store holds from it, not through the broker.
    store: StoreAccess | None = None


def read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Stream one partition's frames, verify every CRC and index order, yield Arrow batches.

    A plan with no partitions (an empty range) gets one of Spark's own, ``InputPartition(None)``,
    which reads nothing."""
    if not isinstance(partition, MessagingPartition):
        assert partition.value is None, partition
        return
    broker = BrokerHTTP(partition.urls, token=partition.token, ca=partition.ca)
    start = partition.start
    # Before the read: retention that deletes from here on cannot take times of rows it reads.
    times = AppendTimes(broker, partition.topic, start, partition.end)
    decoder = BatchDecoder(after=max(start - 1, 0), max_count=ARROW_BATCH_ROWS, offsets=True)
    if partition.store is not None:
        for run in _from_store(broker, partition):
            for batch in _decoded(decoder, partition.topic, run):
                assert batch.offsets is not None
                yield frames_to_arrow(batch.buffer, batch.offsets, times.column)
        last = decoder.last_index
        start = max(start, (last or 0) + 1)
        if start >= partition.end:
            _decoded(decoder, partition.topic, None)
            return
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
        decoder = BatchDecoder(after=start - 1, max_count=ARROW_BATCH_ROWS, offsets=True)
        conn, response = broker.open("GET", "/messaging/messages", {
            "topicID": partition.topic, "index": start, "end": partition.end})
    try:
        while block := response.read(READ_BLOCK):
            for batch in _decoded(decoder, partition.topic, block):
                assert batch.offsets is not None
                yield frames_to_arrow(batch.buffer, batch.offsets, times.column)
        _decoded(decoder, partition.topic, None)
    finally:
        conn.close()


def _from_store(broker: BrokerHTTP, partition: MessagingPartition) -> Iterator[bytes]:
    """The runs of frames of the partition the object store holds below the broker's
    local segments (nothing when the read starts below the topic's first index: the broker
    read then says what retention took)."""
    assert partition.store is not None
    info = broker.json(f"/messaging/topics/{partition.topic}", {"objects": "true"})
    first = parse_u64(info.get("first_index") or 0, f"topic {partition.topic}")
    if partition.start < first:
        return
    ranges = stored_ranges(info, partition.topic, partition.start, partition.end)
    if not ranges:
        return
    store = partition.store.open()
    for run, _last in read_stored(store, ranges, partition.start, partition.end):
        yield run


def _decoded(decoder: BatchDecoder, topic: int, block: bytes | None) -> list[FrameBatch]:
    """Feed ``block`` (None: the end) to ``decoder``; damage names the topic."""
    try:
        if block is None:
            decoder.finish()
            return []
        return decoder.feed(block)
    except CorruptFrameError as err:
        raise CorruptFrameError(f"topic {topic}: {err}") from err


class Planner:
    """Offset resolution and partition planning shared by batch and streaming reads."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.broker = BrokerHTTP(options.urls, token=options.token, ca=options.ca)

    def start(self) -> dict[str, int]:
        """Where the read starts: by time (``startingTimestamp``, else
        ``startingOffsetsByTimestamp``) or else by ``startingIndex``."""
        options = self.options
        if options.start_times is None:
            return self.resolve(options.starting, options.topics)
        offsets = {}
        for topic, time_ms in options.start_times.items():
            index = self.broker.index_at(topic, time_ms)
            if index is None:
                if options.strategy == "error":
                    raise MessagingError(
                        f"option {options.start_option}: topic {topic} has no message appended "
                        f"at or after {describe(time_ms)}; set option "
                        "startingOffsetsByTimestampStrategy to latest to start at its end")
                index = self._resolve_one(topic, -1)
            offsets[str(topic)] = index
        return offsets

    def end(self) -> dict[str, int]:
        """Where a batch read ends (exclusive): before each topic's first message appended at
        or after ``endingTimestamp`` (at its end when there is none), else ``endingIndex``."""
        options = self.options
        if options.ending_time is None:
            return self.resolve(options.ending, options.topics)
        offsets = {}
        for topic in options.topics:
            index = self.broker.index_at(topic, options.ending_time)
            offsets[str(topic)] = self._resolve_one(topic, -1) if index is None else index
        return offsets

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
            offsets[str(topic)] = self._resolve_one(topic, _spec_index(spec, topic, value))
        return offsets

    def _resolve_one(self, topic: int, value: int) -> int:
        if value >= 0:
            return value
        info = self.broker.topic(topic)
        if value == -2:
            return int(info["first_index"]) if info else 0
        if info is not None:
            return int(info["last_index"]) + 1
        return self.broker.broker_index(topic) + 1

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
                parts.append(MessagingPartition(self.options.urls, self.options.token,
                                                self.options.ca, topic, begin, bound,
                                                self.options.fail_on_data_loss,
                                                self.options.store))
                begin = bound
        return parts


def _spec_index(spec: str, topic: int, value: object) -> int:
    """One topic's index in a JSON index spec: a number or a decimal string, or -2
    (earliest) or -1 (latest)."""
    if value in (-1, -2, "-1", "-2"):
        return -1 if value in (-1, "-1") else -2
    try:
        return parse_u64(value, f"index for topic {topic}")
    except ValueError as err:
        raise MessagingError(f"index spec {spec!r}: {err}") from None


#: An offset as Spark keeps it (JSON): topic -> next index, a number or a decimal string.
Offset = dict[str, int | str]


def written(offsets: dict[str, int]) -> Offset:
    """An offset as handed to Spark: indexes of 2^53 and more as strings."""
    return {key: json_integer(index) for key, index in offsets.items()}


def read_offset(offset: dict[str, Any]) -> dict[str, int]:
    """An offset Spark hands back (from a checkpoint, in either form) as ints."""
    try:
        return {key: parse_u64(index, f"offset of topic {key}") for key, index in offset.items()}
    except ValueError as err:
        raise MessagingError(f"invalid offset {offset!r}: {err}") from None


class MessagingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Structured Streaming reads with admission control and Trigger.AvailableNow."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = SourceOptions(options)
        if self.options.ending_given:
            raise MessagingError(f"option {self.options.ending_given[0]} is for batch reads "
                                 "(spark.read) only: a streaming query has no end")
        self.planner = Planner(self.options)
        self.target: dict[str, int] | None = None

    def initialOffset(self) -> Offset:
        """Where a query without a checkpoint starts: options ``startingTimestamp``,
        ``startingOffsetsByTimestamp`` or ``startingIndex``, in that order."""
        return written(self.planner.start())

    def getDefaultReadLimit(self) -> ReadLimit:
        """At most ``maxRecordsPerTrigger`` rows per micro-batch, if given."""
        if self.options.max_records:
            return ReadMaxRows(self.options.max_records)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of an availableNow query: every topic's end now."""
        self.target = self.planner.latest(self.options.topics)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> Offset:
        """The end of the next micro-batch, within ``limit``."""
        ceiling = self.target or self.planner.latest(self.options.topics)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return written(self.planner.advance(read_offset(start), ceiling, max_rows))

    def reportLatestOffset(self) -> Offset:
        """Every topic's end (for progress reports)."""
        return written(self.planner.latest(self.options.topics))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[MessagingPartition]:
        """The micro-batch's chunks."""
        return self.planner.partitions(read_offset(start), read_offset(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one chunk (on an executor)."""
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: positions live in Spark's checkpoint."""


class MessagingBatchReader(DataSourceReader):
    """Batch reads of a range: from ``startingTimestamp``, ``startingOffsetsByTimestamp`` or
    ``startingIndex`` to ``endingTimestamp`` or ``endingIndex`` (exclusive)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = SourceOptions(options)
        self.planner = Planner(self.options)

    def partitions(self) -> list[MessagingPartition]:
        """The range's chunks."""
        return self.planner.partitions(self.planner.start(), self.planner.end())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one chunk (on an executor)."""
        return read_partition(partition)
