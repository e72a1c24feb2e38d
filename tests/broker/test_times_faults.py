"""Faults at the system-call boundary while a group writes its time index (tests/faults.py):
a failed or short write of a ``.time`` file, and a failed fdatasync of one. The group fails
as a whole, nothing of it is visible (its messages, their time, the broker's time), a failed
fsync stops the topic like a failed fsync of its frames, and a restart recovers cleanly.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from messaging.broker.broker import ApplyResult, Broker
from messaging.errors import DiskFullError, StorageError, StorageFailedError
from messaging.frames import decode, encode, encode_batch
from messaging.topic.segment import SEGMENT_SUFFIX
from messaging.topic.times import RECORD, TIMES_SUFFIX, decode_records
from messaging.topic.topic import Topic
from tests.faults import Faults, inject

T0 = 1_795_600_000_000
SEGMENT = 300
#: Where the failing group's record goes: a time change inside the active segment (appended to
#: its time index), or the first record of a segment the group starts (a new time index).
WHERE = ["change", "roll"]


def is_time_file(path: str) -> bool:
    return path.endswith(TIMES_SUFFIX)


class Fixture:
    """A broker with topic 1 (and 2) holding acknowledged messages, and what it must keep."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.broker = Broker.open(path, max_segment_size=SEGMENT)
        self.kept: dict[int, list[tuple[int, bytes, int]]] = {}

    def publish(self, topic: int, datas: list[bytes], time_ms: int) -> ApplyResult:
        """A group that must succeed; every message gets the broker's time after it."""
        result = self.broker.write_group([encode_batch(topic, datas)], durable=True,
                                         times=[time_ms])[0]
        assert isinstance(result, ApplyResult), result
        for index, data in zip(range(result.first, result.last + 1), datas, strict=True):
            self.kept.setdefault(topic, []).append((index, data, self.broker.time))
        return result

    def check(self) -> None:
        """Every acknowledged message, with its time; nothing else; files as in memory."""
        for topic in self.broker.topics():
            with topic.reader(topic.first_index) as reader:
                messages, _used = decode(reader.read_all(), after=0)
            kept = self.kept.get(topic.id, [])
            assert [(m.index, m.data) for m in messages] == [(i, d) for i, d, _t in kept]
            assert [topic.time_of(i) for i, _d, _t in kept] == [t for _i, _d, t in kept]
            if kept:
                assert topic.last_time == kept[-1][2]
                assert topic.index_at_time(kept[-1][2] + 1) is None
            check_files(topic)

    def reopen(self) -> None:
        self.broker.close()
        self.broker = Broker.open(self.path, max_segment_size=SEGMENT)
        for topic in self.broker.topics():
            assert topic.stats.recovered_truncated_bytes == 0, "a torn tail of frames"

    def prepare(self, where: str) -> None:
        """Topic 1 with messages at T0; with ``roll`` its active segment is full, so the
        next group starts a new segment (and a new time index)."""
        self.publish(1, [b"first", b"second"], T0)
        self.publish(2, [b"other topic"], T0)
        if where == "roll":
            self.publish(1, [b"f" * (SEGMENT - 60)], T0)
        self.segments = sorted(p.name for p in (self.path / "topics" / "1").iterdir())


def check_files(topic: Topic) -> None:
    """Each segment's time index holds exactly its committed records, none past its last
    committed message."""
    for segment in topic.segments():
        times = segment.times
        assert times is not None
        raw = times.path.read_bytes()
        records, used = decode_records(raw)
        assert used == len(raw), (f"{times.path.name} holds {len(raw) - used} bytes past its "
                                  f"records (a failed write that was not cut back)")
        assert len(raw) == times.committed * RECORD.size, (
            f"{times.path.name} holds {len(raw) // RECORD.size} records, "
            f"{times.committed} committed")
        if segment.indexed:
            assert records[-1][0] <= segment.committed_last_index


def failing_group(fixture: Fixture, time_ms: int) -> list[object]:
    """A group over topic 1 that changes its time (and over topic 2, so one topic's failure
    undoes the other's records too)."""
    return list(fixture.broker.write_group(
        [encode_batch(1, [b"lost a", b"lost b"]), encode(1, 2, b"lost c")], durable=True,
        times=[time_ms, time_ms]))


def check_nothing_visible(fixture: Fixture, index: int, time_ms: int,
                          lost_time: int) -> None:
    broker = fixture.broker
    assert broker.index == index and broker.time == time_ms
    assert broker.topic(1).index_at_time(lost_time) is None
    fixture.check()


@pytest.mark.parametrize("failing", [1, 2], ids=["first-topic", "second-topic"])
@pytest.mark.parametrize("where", WHERE)
def test_a_failed_time_index_write_fails_the_group_and_keeps_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, failing: int) -> None:
    """When the second topic's write fails, the first one's records are already written
    and fsynced: they are cut back too."""
    fixture = Fixture(tmp_path)
    fixture.prepare(where)
    broker = fixture.broker
    index, time_ms = broker.index, broker.time
    lost = T0 + 100
    folder = str(tmp_path / "topics" / str(failing)) + "/"
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.startswith(folder)
                                    and is_time_file(p), write_budget=0,
                                    write_errno=errno.EIO)) as faults:
        results = failing_group(fixture, lost)
        assert faults.injected == 1
    assert all(isinstance(r, StorageError) and r.status == 500 for r in results), results
    assert "time index" in str(results[0])
    check_nothing_visible(fixture, index, time_ms, lost)
    assert sorted(p.name for p in (tmp_path / "topics" / "1").iterdir()) == fixture.segments
    # A failed write does not stop the topic: the next group goes through, with its time.
    assert broker.topic(1).failure is None
    fixture.publish(1, [b"after"], T0 + 200)
    fixture.check()
    fixture.reopen()
    fixture.check()
    fixture.publish(1, [b"after restart"], T0 + 300)
    fixture.check()
    fixture.broker.close()


@pytest.mark.parametrize("where", WHERE)
def test_a_failed_time_index_fsync_stops_the_topic_until_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    fixture = Fixture(tmp_path)
    fixture.prepare(where)
    broker = fixture.broker
    index, time_ms = broker.index, broker.time
    lost = T0 + 100
    topic1 = str(tmp_path / "topics" / "1") + "/"
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.startswith(topic1)
                                    and is_time_file(p), sync_failures=1)) as faults:
        results = failing_group(fixture, lost)
        assert faults.injected == 1
        assert all(isinstance(r, StorageFailedError) and r.status == 503 for r in results)
        assert "fsync" in str(results[0]) and "restart" in str(results[0])
        assert broker.index == index and broker.time == time_ms
        # The disk "works" again, but what the failed fsync covered is not known to be on
        # disk: the topic keeps refusing writes, as after a failed fsync of its frames.
        again = broker.write_group([encode(1, 1, b"refused")], durable=True,
                                   times=[T0 + 150])[0]
        assert isinstance(again, StorageFailedError)
        fixture.publish(2, [b"other topics carry on"], T0 + 160)
    assert broker.topic(1).failure is not None
    info = {t["id"]: t for t in broker.diagnostics()["topics"]}
    assert info[1]["writable"] is False and "fsync failed" in info[1]["failure"]
    for topic_id, kept in fixture.kept.items():  # reads still answer, nothing half-visible
        topic = broker.topic(topic_id)
        with topic.reader(topic.first_index) as reader:
            messages, _used = decode(reader.read_all(), after=0)
        assert [(m.index, m.data) for m in messages] == [(i, d) for i, d, _t in kept]
        assert [topic.time_of(i) for i, _d, _t in kept] == [t for _i, _d, t in kept]
    assert broker.topic(1).index_at_time(lost) is None
    fixture.reopen()
    fixture.check()  # a record the failed group left in the file is gone with it
    assert fixture.broker.topic(1).failure is None
    fixture.publish(1, [b"after restart"], T0 + 300)
    fixture.check()
    fixture.reopen()
    fixture.check()
    fixture.broker.close()


@pytest.mark.parametrize("where", WHERE)
def test_a_short_time_index_write_is_cut_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              where: str) -> None:
    """Part of a record reaches the file, then the disk is full: the group fails and its
    bytes leave the time index; the next group's record follows the committed ones, so a
    restart reads every acknowledged message's time."""
    fixture = Fixture(tmp_path)
    fixture.prepare(where)
    broker = fixture.broker
    index, time_ms = broker.index, broker.time
    lost = T0 + 100
    topic1 = str(tmp_path / "topics" / "1") + "/"
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.startswith(topic1)
                                    and is_time_file(p), write_budget=7)) as faults:
        results = failing_group(fixture, lost)
        assert faults.injected >= 1
    assert all(isinstance(r, DiskFullError) and r.status == 507 for r in results), results
    assert broker.index == index and broker.time == time_ms
    # Else the next record is appended after the torn bytes, and a restart, which reads the
    # records up to the first bad one, gives that acknowledged message an older time.
    topic = broker.store.get(1)
    assert topic is not None
    check_files(topic)
    after = fixture.publish(1, [b"acknowledged after the full disk"], T0 + 200)
    assert broker.topic(1).time_of(after.first) == T0 + 200
    fixture.reopen()
    assert fixture.broker.topic(1).time_of(after.first) == T0 + 200, (
        "an acknowledged message lost its time across a restart")
    fixture.check()
    fixture.broker.close()


def test_a_short_frame_write_cuts_the_groups_time_records_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The group's record was written and fsynced before its frames; a short write of the
    frames fails the group, and the record goes with it."""
    fixture = Fixture(tmp_path)
    fixture.prepare("change")
    broker = fixture.broker
    index, time_ms = broker.index, broker.time
    lost = T0 + 100
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.endswith(SEGMENT_SUFFIX),
                                    write_budget=30)) as faults:
        results = failing_group(fixture, lost)
        assert faults.injected >= 1
    assert all(isinstance(r, DiskFullError) for r in results), results
    check_nothing_visible(fixture, index, time_ms, lost)
    fixture.publish(1, [b"after"], T0 + 200)
    fixture.reopen()
    fixture.check()
    fixture.broker.close()
