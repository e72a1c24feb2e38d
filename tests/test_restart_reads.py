"""Reads after a restart are exact: segments recovery did not index are read like any other.

A broker is written through ``write_group`` (several topics interleaved), closed and opened
again; every read then enters segments that only the reader indexes. Each read, with any
``index``/``end``/``limit`` and chunk size, must return exactly the frames a model holds (the
same indexes and the same bytes), and so must the read after it, which runs on the sparse
index the first one built. The end-to-end tests do the same over HTTP against a broker
process that was killed (SIGKILL) or stopped (SIGTERM).
"""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from messaging.broker import ApplyResult, Broker
from messaging.message import (
    FRAMES_CONTENT_TYPE,
    HEADER_SIZE,
    Message,
    decode,
    encode,
    encode_many,
)
from messaging.topic_reader import READ_CHUNK

TOPICS = (1, 2, 7, 1 << 40)
#: (max segment size, largest message): from segments smaller than one frame to segments
#: larger than the HTTP layer's 1 MiB read chunk.
SHAPES = ((200, 300), (1000, 700), (4096, 2500), (64 << 10, 20000), (1536 << 10, 100 << 10))
#: Chunk sizes of the reads: below one header, around it, small and large.
MAX_BYTES = st.one_of(st.sampled_from([1, 25, 26, 27, 100, 4096, READ_CHUNK, 1 << 20]),
                      st.integers(1, 2 << 20))


@dataclass
class Model:
    """What every topic holds: messages in index order, as a broker must assign them."""

    messages: dict[int, list[Message]] = field(default_factory=dict)
    index: int = 0

    def add(self, topic: int, data: bytes) -> Message:
        self.index += 1
        message = Message(self.index, 1, topic, data)
        self.messages.setdefault(topic, []).append(message)
        return message

    def select(self, topic: int, index: int, end: int | None, limit: int | None,
               ) -> list[Message]:
        chosen = [m for m in self.messages.get(topic, [])
                  if m.index >= index and (end is None or m.index < end)]
        return chosen if limit is None else chosen[:limit]

    def index_after(self, topic: int, after: int, count: int) -> int | None:
        candidates = [m.index for m in self.messages.get(topic, []) if m.index >= after]
        return candidates[min(count, len(candidates)) - 1] if candidates else None

    def last(self, topic: int) -> int:
        held = self.messages.get(topic)
        return held[-1].index if held else 0


def payload(rng: random.Random, size: int) -> bytes:
    return rng.randbytes(size)


def publish(broker: Broker, model: Model, groups: list[list[list[tuple[int, bytes]]]]) -> None:
    """Write each group of commands (each a list of (topic, data)) as one durable transaction."""
    for group in groups:
        commands = [b"".join(encode(1, topic, data) for topic, data in command)
                    for command in group]
        results = broker.write_group(commands, durable=True)
        for command, result in zip(group, results, strict=True):
            assert isinstance(result, ApplyResult), result
            expected = [model.add(topic, data) for topic, data in command]
            assert (result.first, result.last) == (expected[0].index, expected[-1].index)
    assert broker.index == model.index


def check_read(broker: Broker, model: Model, topic_id: int, index: int, end: int | None,
               limit: int | None, max_bytes: int) -> None:
    """One reader from ``index`` to ``end`` (``limit`` messages) returns exactly the model's."""
    expected = model.select(topic_id, index, end, limit)
    topic = broker.topic(topic_id)
    if topic is None:
        assert expected == []
        return
    with topic.reader(index, end, limit) as reader:
        raw = reader.read_all(max_bytes=max_bytes)
        delivered = reader.delivered
    messages, used = decode(raw, after=0)
    where = f"topic {topic_id} index={index} end={end} limit={limit} max_bytes={max_bytes}"
    assert [m.index for m in messages] == [m.index for m in expected], where
    assert used == len(raw), where
    assert raw == encode_many(expected), where
    assert delivered == len(expected), where  # what the streamed-messages counter adds


def check_index_after(broker: Broker, model: Model, topic_id: int, after: int,
                      count: int) -> None:
    topic = broker.topic(topic_id)
    expected = model.index_after(topic_id, after, count)
    got = topic.index_after(after, count) if topic is not None else None
    assert got == expected, f"topic {topic_id} after={after} count={count}"


def reopen(broker: Broker) -> Broker:
    broker.close()
    return Broker.open(broker.path, max_segment_size=broker.max_segment_size)


# -- one restart, many reads ----------------------------------------------------------------

@st.composite
def workloads(draw: st.DrawFn) -> tuple[int, list[list[list[tuple[int, int]]]]]:
    """A segment size and groups of commands of (topic, message size).

    Enough messages that a topic usually spans several segments (the old ones are then left
    unindexed by recovery), whatever the shape.
    """
    segment_size, largest = draw(st.sampled_from(SHAPES))
    big = segment_size > 1 << 20
    topics = draw(st.lists(st.sampled_from(TOPICS), min_size=1, max_size=2 if big else 4,
                           unique=True))
    size = st.integers(largest // 2, largest) if big else st.integers(0, largest)
    average = HEADER_SIZE + (3 * largest // 4 if big else largest // 2)
    least = min(-(-2 * segment_size * len(topics) // average), 50 if big else 100)
    messages = draw(st.lists(st.tuples(st.sampled_from(topics), size, st.booleans(),
                                       st.booleans()), min_size=least, max_size=least + 30))
    groups: list[list[list[tuple[int, int]]]] = []
    for n, (topic, length, new_command, new_group) in enumerate(messages):
        if n == 0 or new_group:
            groups.append([])
        if n == 0 or new_group or new_command:
            groups[-1].append([])
        groups[-1][-1].append((topic, length))
    return segment_size, groups


#: A read as drawn: which topic (a position among those written), where index and end fall
#: (fractions of the broker's last index, so they land inside the data), limit, chunk size.
ReadCase = tuple[int, float, float | None, int | None, int]
read_cases = st.tuples(st.integers(0, 3), st.floats(0, 1), st.none() | st.floats(0, 1),
                       st.none() | st.integers(0, 40), MAX_BYTES)


def run_read_case(broker: Broker, model: Model, case: ReadCase) -> None:
    pick, at, until, limit, max_bytes = case
    written = sorted(model.messages) or [TOPICS[0]]
    topic = written[pick % len(written)]
    top = model.index + 2
    index = round(at * top)
    end = None if until is None else round(until * top)
    check_read(broker, model, topic, index, end, limit, max_bytes)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(workload=workloads(), seed=st.integers(0, 2**32 - 1),
       cold=st.lists(read_cases, min_size=3, max_size=8),
       warm=st.lists(read_cases, min_size=3, max_size=8),
       counts=st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1), st.integers(1, 40)),
                       min_size=1, max_size=4),
       full_max_bytes=st.tuples(MAX_BYTES, MAX_BYTES))
def test_reads_after_reopen_match_the_model(
        workload: tuple[int, list[list[list[tuple[int, int]]]]], seed: int,
        cold: list[ReadCase], warm: list[ReadCase], counts: list[tuple[int, float, int]],
        full_max_bytes: tuple[int, int]) -> None:
    segment_size, plan = workload
    rng = random.Random(seed)
    groups = [[[(topic, payload(rng, size)) for topic, size in command] for command in group]
              for group in plan]
    model = Model()
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker.open(Path(tmp), max_segment_size=segment_size)
        try:
            publish(broker, model, groups)
            broker = reopen(broker)
            assert broker.index == model.index
            most = max(len(t.segments()) for t in broker.topics())
            event(f"max segment size {segment_size}, "
                  f"{'several segments' if most > 1 else 'one segment'} in a topic")
            written = sorted(model.messages)
            after_counts = [(written[pick % len(written)], round(at * (model.index + 2)), count)
                            for pick, at, count in counts]
            # Cold: the first reads after the restart enter segments nothing has indexed yet.
            for topic, after, count in after_counts:
                check_index_after(broker, model, topic, after, count)
            for case in cold:
                run_read_case(broker, model, case)
            # Whole topics, twice in a row: the second read runs on what the first indexed.
            for topic in written:
                for max_bytes in full_max_bytes:
                    check_read(broker, model, topic, 0, None, None, max_bytes)
                assert broker.topic(topic).committed_index == model.last(topic)
            for case in warm:
                run_read_case(broker, model, case)
            for topic, after, count in after_counts:
                check_index_after(broker, model, topic, after, count)
        finally:
            broker.close()


def test_end_150_after_restart_is_exact(tmp_path: Path) -> None:
    """The regression as reported: one topic, index=0&end=150 after a restart, twice."""
    rng = random.Random(150)
    model = Model()
    broker = Broker.open(tmp_path, max_segment_size=4096)
    groups = [[[(1 + n % 2, payload(rng, rng.randrange(50, 900))) for n in range(k, k + 40)]]
              for k in range(0, 400, 40)]
    publish(broker, model, groups)
    broker = reopen(broker)
    try:
        assert len(broker.topic(1).segments()) > 10
        for _ in range(2):
            check_read(broker, model, 1, 0, 150, None, READ_CHUNK)
            check_read(broker, model, 1, 0, None, None, READ_CHUNK)
            check_read(broker, model, 1, 0, None, 37, READ_CHUNK)
    finally:
        broker.close()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("max_bytes", [0, 1, HEADER_SIZE - 1, HEADER_SIZE])
def test_chunks_smaller_than_a_frame_still_read_whole_frames(tmp_path: Path,
                                                             max_bytes: int) -> None:
    """A chunk size below one header used to return nothing forever (a busy loop)."""
    model = Model()
    broker = Broker.open(tmp_path, max_segment_size=200)
    publish(broker, model, [[[(1, b"x" * size) for size in (0, 5, 300, 40)]]])
    broker = reopen(broker)
    try:
        for _ in range(2):
            check_read(broker, model, 1, 0, None, None, max_bytes)
            check_read(broker, model, 1, 2, 4, None, max_bytes)
    finally:
        broker.close()


# -- a stateful model: publish, restart, read -----------------------------------------------

class RestartMachine(RuleBasedStateMachine):
    """Interleave durable publishes, restarts and reads with end and limit."""

    @initialize(shape=st.sampled_from(SHAPES), seed=st.integers(0, 2**32 - 1),
                base=st.booleans())
    def setup(self, shape: tuple[int, int], seed: int, base: bool) -> None:
        self.dir = Path(tempfile.mkdtemp())
        self.largest = shape[1]
        self.rng = random.Random(seed)
        self.broker = Broker.open(self.dir, max_segment_size=shape[0])
        self.model = Model()
        if base:
            self.publish_base(shape[0])

    def publish_base(self, segment_size: int) -> None:
        """Topics 1 and 2 interleaved, topic 1 over one and a half segments."""
        rng = self.rng
        messages: list[tuple[int, bytes]] = []
        size = 0
        while size < 3 * segment_size // 2:
            topic = rng.choice((1, 1, 1, 2))
            data = payload(rng, rng.randrange(self.largest // 2, self.largest + 1))
            messages.append((topic, data))
            size += len(data) + HEADER_SIZE if topic == 1 else 0
        commands = [messages[k:k + 8] for k in range(0, len(messages), 8)]
        publish(self.broker, self.model, [commands[k:k + 3] for k in range(0, len(commands), 3)])

    def teardown(self) -> None:
        if hasattr(self, "broker"):
            self.broker.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(commands=st.lists(st.lists(st.tuples(st.sampled_from(TOPICS), st.floats(0, 1)),
                                     min_size=1, max_size=6), min_size=1, max_size=3))
    def publish(self, commands: list[list[tuple[int, float]]]) -> None:
        group = [[(topic, payload(self.rng, int(share * self.largest)))
                  for topic, share in command] for command in commands]
        publish(self.broker, self.model, [group])

    @rule()
    def restart(self) -> None:
        self.broker = reopen(self.broker)
        assert self.broker.index == self.model.index
        most = max((len(t.segments()) for t in self.broker.topics()), default=0)
        event(f"restart, max segment size {self.broker.max_segment_size}, "
              f"{'several segments' if most > 1 else 'at most one segment'} in a topic")

    @rule(case=read_cases)
    def read(self, case: ReadCase) -> None:
        run_read_case(self.broker, self.model, case)

    @rule(topic=st.sampled_from(TOPICS), max_bytes=MAX_BYTES)
    def read_whole_topic_twice(self, topic: int, max_bytes: int) -> None:
        check_read(self.broker, self.model, topic, 0, None, None, max_bytes)
        check_read(self.broker, self.model, topic, 0, None, None, READ_CHUNK)

    @rule(topic=st.sampled_from(TOPICS), at=st.floats(0, 1), count=st.integers(1, 40))
    def index_after(self, topic: int, at: float, count: int) -> None:
        after = round(at * (self.model.index + 2))
        check_index_after(self.broker, self.model, topic, after, count)

    @invariant()
    def indexes_match(self) -> None:
        if hasattr(self, "broker"):
            assert self.broker.index == self.model.index
            for topic in self.model.messages:
                assert self.broker.topic(topic).committed_index == self.model.last(topic)


RestartMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_restart_state_machine = RestartMachine.TestCase


# -- end to end: a broker process, killed or stopped, then read over HTTP -------------------

async def publish_over_http(session: aiohttp.ClientSession, url: str, rng: random.Random,
                            total: int) -> dict[int, list[Message]]:
    """About ``total`` bytes in a few hundred messages over three topics, in single and batch
    POSTs; returns every acknowledged message by topic (indexes from the answers)."""
    by_topic: dict[int, list[Message]] = {1: [], 2: [], 3: []}
    sent = 0
    posts = 0
    while sent < total and posts < 1000:
        posts += 1
        count = 1 if rng.random() < 0.4 else rng.randrange(2, 12)
        batch = []
        for _ in range(count):
            topic = rng.choices((1, 2, 3), weights=(6, 3, 1))[0]
            size = rng.randrange(10, 3000) if rng.random() < 0.3 else rng.randrange(8000, 24000)
            batch.append((topic, payload(rng, size)))
            sent += size
        if count == 1:
            (topic, data), = batch
            async with session.post(f"{url}/messaging/messages",
                                    params={"topicID": str(topic)}, data=data) as resp:
                assert resp.status == 200, await resp.text()
                first = int(resp.headers["X-Broker-Index"])
        else:
            body = b"".join(encode(1, topic, data) for topic, data in batch)
            async with session.post(f"{url}/messaging/messages", data=body,
                                    headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
                first = answer["first"]
                assert answer["count"] == count
        for k, (topic, data) in enumerate(batch):
            by_topic[topic].append(Message(first + k, 1, topic, data))
    return by_topic


async def get_frames(session: aiohttp.ClientSession, url: str, topic: int,
                     **params: str) -> tuple[bytes, int]:
    async with session.get(f"{url}/messaging/messages",
                           params={"topicID": str(topic), **params}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.read(), int(resp.headers["X-Broker-Index"])


def select(messages: list[Message], index: int = 0, end: int | None = None,
           limit: int | None = None) -> list[Message]:
    chosen = [m for m in messages if m.index >= index and (end is None or m.index < end)]
    return chosen if limit is None else chosen[:limit]


def assert_frames(raw: bytes, expected: list[Message], what: str) -> None:
    messages, used = decode(raw, after=0)
    assert [m.index for m in messages] == [m.index for m in expected], what
    assert used == len(raw) and raw == encode_many(expected), what


@pytest.mark.parametrize("stop", ["sigkill", "sigterm"])
@pytest.mark.parametrize("segment_size", ["1500K", "4K"])
async def test_http_reads_after_restart_are_exact(broker_process, tmp_path: Path,
                                                  segment_size: str, stop: str) -> None:
    rng = random.Random(f"{segment_size}-{stop}")
    data = tmp_path / "data"
    broker = broker_process(data, "--max-segment-size", segment_size).start()
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        by_topic = await publish_over_http(session, broker.url, rng, 3_500_000)
    assert sum(len(m.data) for ms in by_topic.values() for m in ms) >= 3_500_000
    assert 150 <= sum(map(len, by_topic.values())) <= 600
    if stop == "sigkill":
        broker.kill()  # every acknowledged message was fsynced: all must be read back
    else:
        assert broker.terminate() == 0
    restarted = broker_process(data, "--max-segment-size", segment_size).start()
    segments = sorted((data / "topics" / "1").glob("*.seg"))
    assert len(segments) >= 2  # reads cross segments the recovery did not index
    if segment_size == "1500K":
        assert segments[0].stat().st_size > 1 << 20  # more than one 1 MiB read chunk
    url = restarted.url
    async with aiohttp.ClientSession(timeout=timeout) as session:
        # First a bounded read, before anything has read (and indexed) the old segments.
        raw, _ = await get_frames(session, url, 1, index="0", end="150")
        assert_frames(raw, select(by_topic[1], end=150), "index=0&end=150, cold")
        for topic, messages in by_topic.items():
            for attempt in range(3):
                raw, last = await get_frames(session, url, topic)
                assert_frames(raw, messages, f"topic {topic}: full read {attempt + 1}")
                assert last == messages[-1].index
        for topic, messages in by_topic.items():
            middle = messages[len(messages) // 2].index
            cases: list[dict[str, int]] = [
                {"index": 0, "end": 150}, {"limit": 1}, {"limit": 7}, {"limit": 100},
                {"index": middle, "limit": 9}, {"index": middle + 1, "end": middle + 60},
                {"index": 0, "end": middle, "limit": 25}, {"index": messages[-1].index + 1},
            ]
            for case in cases:
                raw, _ = await get_frames(session, url, topic,
                                          **{k: str(v) for k, v in case.items()})
                assert_frames(raw, select(messages, **case), f"topic {topic} {case}")
            async with session.get(f"{url}/messaging/topics/{topic}",
                                   params={"after": str(middle), "count": "10"}) as resp:
                info = await resp.json()
            later = select(messages, middle)
            assert info["index"] == later[min(10, len(later)) - 1].index
            # A streaming read with an end in the middle ends by itself.
            async with session.get(f"{url}/messaging/messages", params={
                    "topicID": str(topic), "streaming": "true", "end": str(middle)}) as resp:
                raw = await asyncio.wait_for(resp.read(), 30)
            assert_frames(raw, select(messages, end=middle), f"topic {topic} streaming")
        async with session.get(f"{url}/metrics") as resp:
            assert resp.status == 200
            metrics = await resp.text()
    streamed = re.search(r"^messaging_messages_streamed_total (\S+)$", metrics, re.M)
    assert streamed is not None and float(streamed.group(1)) > 0
    assert restarted.terminate() == 0
    log = restarted.log.read_text()
    assert "Traceback" not in log
    assert "broken off" not in log
