"""Topic storage: appends, commits, recovery, retention, waiting, and a stateful model.

Reading (TopicReader, following) is tests/topic/test_reader.py; the sparse index is
tests/topic/test_segment.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import threading
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from messaging.errors import TopicTruncatedError
from messaging.frames import HEADER_SIZE, Message, decode, encode_many
from messaging.topic.segment import segment_name
from messaging.topic.topic import Topic
from tests.conftest import frames
from tests.examples import examples


def read(topic: Topic, index: int, end: int | None = None, limit: int | None = None) -> list[int]:
    with topic.reader(index, end, limit) as reader:
        messages, _used = decode(reader.read_all(max_bytes=100), after=0)
    return [m.index for m in messages]


def make(path: Path, segments: list[list[int]], topic_id: int = 1) -> Topic:
    """A topic with one segment per list of indexes (a tiny max size forces every roll)."""
    topic = Topic.open(path, topic_id)
    for indexes in segments:
        topic.max_segment_size = 1
        topic.append(frames(topic_id, indexes[:1]))
        topic.max_segment_size = 1 << 30
        topic.append(frames(topic_id, indexes[1:]))
    topic.sync()
    topic.commit()
    return topic


def test_stale_appends_are_skipped(tmp_path: Path) -> None:
    topic = make(tmp_path, [[1, 2, 3]])
    assert topic.append(frames(1, [2, 3, 4])) == 1
    topic.commit()
    assert read(topic, 0) == [1, 2, 3, 4]
    topic.close()


def test_uncommitted_frames_are_invisible(tmp_path: Path) -> None:
    topic = make(tmp_path, [[1]])
    topic.append(frames(1, [2]))
    assert read(topic, 0) == [1]
    assert topic.last_index == 2 and topic.committed_index == 1
    topic.commit()
    assert read(topic, 0) == [1, 2]
    topic.close()


def test_index_after_counts_across_segments(tmp_path: Path) -> None:
    topic = make(tmp_path, [[6, 7, 10], [12], [13, 14]])
    assert topic.index_after(0, 1) == 6
    assert topic.index_after(7, 2) == 10
    assert topic.index_after(7, 3) == 12
    assert topic.index_after(11, 3) == 14
    assert topic.index_after(11, 100) == 14
    assert topic.index_after(15, 1) is None
    topic.close()


@pytest.mark.parametrize("lookup", ["count_after", "index_after"])
def test_counting_while_retention_deletes_the_located_segment(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             lookup: str) -> None:
    """A retention run between the lookup's locate (no lock kept) and its walk of the
    segments deletes the segment it located: counting goes on from what is kept."""
    topic = make(tmp_path, [[1, 2], [3, 4], [5, 6]])
    locate = topic.reads.locate

    def locate_then_retention(index: int) -> object:
        located = locate(index)
        topic.truncate(max_size=0, floor_index=4)  # segments 1 and 3 go
        return located

    monkeypatch.setattr(topic.reads, "locate", locate_then_retention)
    if lookup == "count_after":
        assert topic.count_after(1) == 2  # 5 and 6: the messages after 1 that are kept
    else:
        assert topic.index_after(2, 2) == 6  # the second kept message at or after 2
    monkeypatch.undo()
    assert [s.first_index for s in topic.segments()] == [5]
    assert topic.count_after(1) == 2 and topic.index_after(2, 2) == 6
    topic.close()


def write_segment(path: Path, indexes: list[int]) -> bytes:
    data = frames(1, indexes)
    path.mkdir(parents=True, exist_ok=True)
    (path / segment_name(indexes[0])).write_bytes(data)
    return data


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 6), cut_from_end=st.integers(1, 80))
def test_recovery_at_every_cut_point(n: int, cut_from_end: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        data = write_segment(path, list(range(1, n + 1)))
        cut = max(len(data) - cut_from_end, 0)
        seg = path / segment_name(1)
        with seg.open("r+b") as f:
            f.truncate(cut)
        sizes = [HEADER_SIZE + len(f"message {i}") for i in range(1, n + 1)]
        survivors = 0
        while survivors < n and sum(sizes[: survivors + 1]) <= cut:
            survivors += 1
        topic = Topic.open(path, 1)
        assert read(topic, 0) == list(range(1, survivors + 1))
        assert topic.stats.recovered_truncated_bytes == cut - sum(sizes[:survivors])
        topic.append(frames(1, [n + 10]))
        topic.commit()
        assert read(topic, 0) == [*range(1, survivors + 1), n + 10]
        topic.close()


def test_recovery_byte_by_byte_exhaustive(tmp_path: Path) -> None:
    data = write_segment(tmp_path / "src", [1, 2, 3])
    boundaries = [0]
    for i in (1, 2, 3):
        boundaries.append(boundaries[-1] + HEADER_SIZE + len(f"message {i}"))
    for cut in range(len(data) + 1):
        path = tmp_path / f"cut{cut}"
        path.mkdir()
        (path / segment_name(1)).write_bytes(data[:cut])
        topic = Topic.open(path, 1)
        expected = [i for i in (1, 2, 3) if boundaries[i] <= cut]
        assert read(topic, 0) == expected, cut
        topic.close()


@settings(max_examples=examples(40), deadline=None)
@given(st.data())
def test_flipped_bit_in_last_frame_truncates_there(data) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        raw = bytearray(write_segment(path, [1, 2, 3]))
        last_start = len(raw) - (HEADER_SIZE + len("message 3"))
        bit = data.draw(st.integers(8 * 8, (len(raw) - last_start) * 8 - 1))  # past the index
        raw[last_start + bit // 8] ^= 1 << (bit % 8)
        (path / segment_name(1)).write_bytes(raw)
        topic = Topic.open(path, 1)
        assert read(topic, 0) == [1, 2]
        assert (path / segment_name(1)).stat().st_size == last_start
        topic.close()


def test_retention_honours_floor_and_keeps_active(tmp_path: Path) -> None:
    topic = make(tmp_path, [[1, 2], [3, 4], [5, 6]])
    assert topic.truncate(max_size=0, floor_index=2) > 0
    assert [s.first_index for s in topic.segments()] == [3, 5]
    assert topic.truncate(max_size=0, floor_index=3) == 0  # segment 3 holds 4 > 3
    assert topic.truncate(max_size=0, floor_index=100) > 0
    assert [s.first_index for s in topic.segments()] == [5]  # the active one stays
    assert topic.truncate(max_size=0, floor_index=100) == 0
    topic.close()
    reopened = Topic.open(tmp_path, 1)
    assert reopened.first_index == 5
    assert read(reopened, 5) == [5, 6]
    reopened.close()


def test_retention_interrupted_after_tombstone_is_finished_on_open(tmp_path: Path) -> None:
    topic = make(tmp_path, [[1, 2], [3, 4]])
    topic.close()
    (tmp_path / "tombstone").write_text(json.dumps({"first_index": 3}))
    reopened = Topic.open(tmp_path, 1)
    assert not (tmp_path / segment_name(1)).exists()
    assert read(reopened, 3) == [3, 4]
    reopened.close()


async def test_cancelled_waiters_leave_nothing_behind(tmp_path: Path) -> None:
    topic = await asyncio.to_thread(make, tmp_path, [[1]])
    for _ in range(1000):
        waiter = asyncio.ensure_future(topic.wait_for(1))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert topic.waiting == 0
    await asyncio.to_thread(topic.close)


async def test_waiting_takes_no_lock_the_writer_holds(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer busy on disk (its fdatasync held, its locks taken) never stalls a follower
    on the loop."""
    topic = await asyncio.to_thread(make, tmp_path, [[1]])
    entered, release = threading.Event(), threading.Event()
    real_fdatasync = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        entered.set()
        release.wait(10)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    topic.append(frames(1, [2]))
    writer = asyncio.ensure_future(asyncio.to_thread(topic.sync))
    assert await asyncio.to_thread(entered.wait, 10)
    try:
        assert topic.committed_index == 1
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(topic.wait_for(1), 0.05)
    finally:
        release.set()
        await writer
    await asyncio.to_thread(topic.commit)
    await asyncio.wait_for(topic.wait_for(1), 5)
    await asyncio.to_thread(topic.close)


class TopicMachine(RuleBasedStateMachine):
    """Append batches, read with end/limit, roll, truncate with a floor, close and reopen."""

    @initialize()
    def setup(self) -> None:
        self.dir = Path(tempfile.mkdtemp())
        self.topic = Topic.open(self.dir, 3, max_segment_size=300)
        self.model: list[Message] = []
        self.next_index = 1
        self.first_retained = 0

    def teardown(self) -> None:
        self.topic.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(sizes=st.lists(st.integers(0, 120), min_size=1, max_size=12), gap=st.integers(0, 3))
    def append(self, sizes: list[int], gap: int) -> None:
        batch = []
        for size in sizes:
            self.next_index += gap
            batch.append(Message(self.next_index, 1, 3, os.urandom(size)))
            self.next_index += 1
        assert self.topic.append(encode_many(batch)) == len(batch)
        self.topic.sync()
        self.topic.commit()
        self.model.extend(batch)

    @rule(index=st.integers(0, 300), end=st.none() | st.integers(0, 300),
          limit=st.none() | st.integers(0, 50))
    def read(self, index: int, end: int | None, limit: int | None) -> None:
        if self.first_retained and index < self.first_retained:
            with pytest.raises(TopicTruncatedError):
                self.topic.reader(index).read()
            return
        with self.topic.reader(index, end, limit) as reader:
            got = decode(reader.read_all(max_bytes=257), after=0)[0]
        expected = [m for m in self.model if m.index >= index and (end is None or m.index < end)]
        if limit is not None:
            expected = expected[:limit]
        assert got == expected

    @precondition(lambda self: bool(self.model))
    @rule(after=st.integers(0, 300), count=st.integers(1, 40))
    def index_after(self, after: int, count: int) -> None:
        if self.first_retained and after < self.first_retained:
            return
        candidates = [m.index for m in self.model if m.index >= after]
        expected = None if not candidates else candidates[min(count, len(candidates)) - 1]
        assert self.topic.index_after(after, count) == expected

    @rule(max_size=st.integers(0, 2000), floor=st.integers(0, 300))
    def truncate(self, max_size: int, floor: int) -> None:
        size_before = self.topic.size
        deleted = self.topic.truncate(max_size, floor)
        assert self.topic.size == size_before - deleted
        segments = self.topic.segments()
        if deleted:
            assert len(segments) >= 1
            removed = [m for m in self.model if m.index < segments[0].first_index]
            assert removed and all(m.index <= floor for m in removed)
            self.first_retained = removed[-1].index + 1
            self.model = [m for m in self.model if m.index >= self.first_retained]
            assert self.topic.first_index == self.first_retained

    @rule()
    def reopen(self) -> None:
        self.topic.close()
        self.topic = Topic.open(self.dir, 3, max_segment_size=300)

    @invariant()
    def last_index_matches(self) -> None:
        if hasattr(self, "topic"):
            expected = self.model[-1].index if self.model else None
            if expected is not None:
                assert self.topic.last_index == expected


TopicMachine.TestCase.settings = settings(max_examples=examples(40), stateful_step_count=25,
                                          deadline=None)
test_topic_state_machine = TopicMachine.TestCase


@pytest.mark.e2e  # over a second: left out of the unit run
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(st.integers(0, 5000), min_size=1, max_size=40), min_size=1,
                        max_size=8),
       segment_size=st.sampled_from([1, 300, 4096, 20_000, 1 << 20]),
       gaps=st.integers(0, 3))
def test_appending_with_known_offsets_equals_walking_the_headers(
        batches: list[list[int]], segment_size: int, gaps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        walked = Topic.open(Path(tmp) / "walked", 1, segment_size)
        known = Topic.open(Path(tmp) / "known", 1, segment_size)
        index = 0
        for sizes in batches:
            index += gaps  # other topics took the indexes in between
            first = index + 1
            batch = [Message(first + k, 1, 1, bytes([k % 251]) * size)
                     for k, size in enumerate(sizes)]
            index += len(batch)
            body = encode_many(batch)
            offsets = array("q")
            offset = 0
            for message in batch:
                offsets.append(offset)
                offset += HEADER_SIZE + len(message.data)
            assert walked.append(body) == known.append(body, offsets, first) == len(batch)
            walked.commit()
            known.commit()
        for a, b in zip(walked.segments(), known.segments(), strict=True):
            assert a.path.name == b.path.name
            assert a.path.read_bytes() == b.path.read_bytes()
            assert (a.size, a.count, a.last_index, a.mark_indexes, a.mark_positions,
                    a.mark_ordinals) == (b.size, b.count, b.last_index, b.mark_indexes,
                                         b.mark_positions, b.mark_ordinals)
        walked.close()
        known.close()
