"""Fetch and ListOffsets: a partition's records from the same topic reader HTTP streaming uses
(local segments, offloaded ones and the in-memory tail alike).

Offsets are broker indexes, so a partition's offsets have gaps, which Kafka clients step over
as they do a compacted topic's. A partition's high watermark is one above its last committed
message's index; its log start is the first index retention kept. A fetch from below it
gets the partition from its first message, unless retention or a deletion took messages at
or after that offset: then it is OFFSET_OUT_OF_RANGE (where an HTTP read is 410), and the
client resets as its ``auto.offset.reset`` says. A fetch that finds less than ``min_bytes``
waits up to ``max_wait_time`` for a commit to any of its partitions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from messaging.broker.view import BrokerView
from messaging.errors import MessagingError
from messaging.kafka import protocol as p
from messaging.kafka.access import allowed
from messaging.kafka.errors import kafka_code
from messaging.kafka.records import MAX_OFFSET_DELTA, index_range, record_batch
from messaging.kafka.topics import KafkaTopics
from messaging.topic.view import TopicView

log = logging.getLogger(__name__)

#: ListOffsets' special timestamps.
LATEST, EARLIEST = -1, -2
#: The most a fetch waits, whatever the client asks (its connection is held meanwhile).
MAX_WAIT = 30.0
T = TypeVar("T")


@dataclass(slots=True)
class _Wanted:
    name: str
    partition: int
    offset: int
    max_bytes: int


def _wanted(request: dict[str, Any]) -> list[_Wanted]:
    return [_Wanted(t["topic"], part["partition"],
                    part.get("fetch_offset", part.get("offset", 0)), part["max_bytes"])
            for t in request["topics"] for part in t["partitions"]]


Topics = list[dict[str, Any]]


async def long_poll(request: dict[str, Any], read: Callable[[], Awaitable[tuple[Topics, int]]],
                    wait: Callable[[float], Awaitable[bool]]) -> dict[str, Any]:
    """A Fetch answer: ``read`` (its topics and the bytes of records in them) until they
    reach ``min_bytes`` or ``max_wait_time`` (at most :data:`MAX_WAIT`) passes, ``wait``
    (for a commit, up to the time left; False when none came) in between."""
    wait_ms: int = request["max_wait_time"]
    deadline = time.monotonic() + min(max(wait_ms, 0) / 1000, MAX_WAIT)
    min_bytes = max(request["min_bytes"], 1)
    while True:
        topics, size = await read()
        remaining = deadline - time.monotonic()
        if size >= min_bytes or remaining <= 0:
            break
        if not await wait(remaining):
            topics, size = await read()
            break
    return {"session_id": 0, "topics": topics}


def high_watermark(topic: TopicView) -> int:
    """The offset after the last committed message."""
    return topic.committed_index + 1


def log_start(topic: TopicView) -> int:
    """The first offset a fetch may ask for (the high watermark when nothing is kept)."""
    first = topic.first_index
    end = high_watermark(topic)
    return first if 0 < first < end else end


class Fetching:
    """The Fetch and ListOffsets APIs over one broker."""

    def __init__(self, broker: BrokerView, topics: KafkaTopics, reads: Executor) -> None:
        self.broker = broker
        self.topics = topics
        self.reads = reads

    async def fetch(self, request: dict[str, Any]) -> dict[str, Any]:
        """Read every partition asked for from its offset; wait for ``min_bytes``."""
        return await long_poll(request, lambda: self.read(request),
                               lambda timeout: self.wait_for_more(request, timeout))

    async def read(self, request: dict[str, Any], spent: int = 0,
                   ) -> tuple[list[dict[str, Any]], int]:
        """One read of every partition a Fetch asks for, without waiting: its answer's
        ``topics`` and the bytes of records in them. ``spent``: the bytes of records already
        in the answer (from other groups' partitions), counted against its ``max_bytes``."""
        wanted = _wanted(request)
        budget = request.get("max_bytes") or (1 << 31) - 1
        answers, size = await self._read_all(wanted, budget, spent)
        return p.by_topic([(want.name, answer) for want, answer
                           in zip(wanted, answers, strict=True)], key="topics"), size - spent

    async def wait_for_more(self, request: dict[str, Any], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a commit to any partition a Fetch asks for;
        False when the time ran out."""
        return await self._wait_any(_wanted(request), timeout)

    async def _read_all(self, wanted: list[_Wanted], budget: int, spent: int = 0,
                        ) -> tuple[list[dict[str, Any]], int]:
        answers = []
        total = spent
        for want in wanted:
            # The first partition with records gets them even past the budget (KIP-74);
            # a later one's are left for the next fetch when they would pass it (a read
            # returns at least one record, whatever its limit).
            limit = want.max_bytes if total == 0 else min(want.max_bytes, budget - total)
            answer = await self._read(want, limit)
            size = len(answer["message_set"])
            if total and total + size > budget:
                answer["message_set"], size = b"", 0
            total += size
            answers.append(answer)
        return answers, total

    async def _read(self, want: _Wanted, max_bytes: int) -> dict[str, Any]:
        if not allowed("read", want.name):
            return partition_answer(want.partition, p.TOPIC_AUTHORIZATION_FAILED)
        topic = self._topic(want)
        if topic is None:
            return partition_answer(want.partition, p.UNKNOWN_TOPIC_OR_PARTITION)
        end = high_watermark(topic)
        start = log_start(topic)
        answer = partition_answer(want.partition, p.NONE, end, start)
        if want.offset >= end or max_bytes <= 0:
            return answer
        try:
            chunk = await self._run(self._chunk, topic, want.offset, max_bytes)
        except MessagingError as err:
            answer["error_code"] = kafka_code(err)
            if answer["error_code"] == p.UNKNOWN_SERVER_ERROR:
                log.warning("Kafka fetch of %s/%d from %d failed: %s", want.name,
                            want.partition, want.offset, err)
            return answer
        answer["message_set"] = chunk
        return answer

    def _chunk(self, topic: TopicView, offset: int, max_bytes: int) -> bytes:
        """One record batch of the committed messages from ``offset`` (a read thread)."""
        frames = topic.reader(offset).read(max_bytes)  # whole frames, already verified
        if not frames:
            return b""
        first, last = index_range(frames)
        runs = topic.times(first, min(last, first + MAX_OFFSET_DELTA)) or [(0, None)]
        batch, _count = record_batch(frames, runs)  # the rest comes with the next fetch
        return batch

    async def _wait_any(self, wanted: list[_Wanted], timeout: float) -> bool:
        """Wait for a commit to any partition asked for; False when the time ran out."""
        waits = []
        for want in wanted:
            topic = self._topic(want)
            if topic is not None:
                waits.append(asyncio.ensure_future(
                    topic.wait_for(max(want.offset, high_watermark(topic)) - 1)))
        if not waits:
            await asyncio.sleep(timeout)
            return False
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return bool(done)

    def _topic(self, want: _Wanted) -> TopicView | None:
        topic_id = self.topics.topic_id(want.name, want.partition)
        return self.broker.topic(topic_id) if topic_id is not None else None

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.reads, call, *args)

    async def list_offsets(self, request: dict[str, Any]) -> dict[str, Any]:
        """Earliest, latest, or the first offset appended at or after a time."""
        topics = []
        for t in request["topics"]:
            parts = []
            for part in t["partitions"]:
                parts.append(await self._offset(t["topic"], part["partition"],
                                                part["timestamp"]))
            topics.append({"topic": t["topic"], "partitions": parts})
        return {"topics": topics}

    async def _offset(self, name: str, partition: int, timestamp: int) -> dict[str, Any]:
        answer = {"partition": partition, "error_code": p.NONE, "timestamp": -1, "offset": -1}
        if not allowed("read", name):
            answer["error_code"] = p.TOPIC_AUTHORIZATION_FAILED
            return answer
        topic_id = self.topics.topic_id(name, partition)
        topic = self.broker.topic(topic_id) if topic_id is not None else None
        if topic is None:
            answer["error_code"] = p.UNKNOWN_TOPIC_OR_PARTITION
            return answer
        if timestamp == LATEST:
            answer["offset"] = high_watermark(topic)
        elif timestamp == EARLIEST:
            answer["offset"] = log_start(topic)
        else:
            try:
                found = await self._run(topic.index_at_time, timestamp)
                stamp = await self._run(topic.time_of, found) if found is not None else None
            except MessagingError as err:
                answer["error_code"] = kafka_code(err)
                return answer
            if found is not None:
                answer["offset"] = found
                answer["timestamp"] = -1 if stamp is None else stamp
        return answer


def partition_answer(partition: int, code: int, end: int = -1, start: int = -1,
                     ) -> dict[str, Any]:
    """One partition's Fetch answer without records (an error, or nothing new)."""
    return {"partition": partition, "error_code": code, "highwater_offset": end,
            "last_stable_offset": end, "log_start_offset": start,
            "aborted_transactions": None, "preferred_read_replica": -1, "message_set": b""}
