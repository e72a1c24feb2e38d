"""A damaged time index makes its segment's times unknown (null), never wrong: a record that
fails its checksum where frames exist is damage, not a torn write, whether the segment is the
last one (read at start-up) or an older one (read when first needed)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from messaging.frames import encode
from messaging.topic.times import RECORD, times_path
from messaging.topic.topic import Topic

T0 = 1_795_000_000_000


def timed_topic(path: Path) -> Topic:
    """Topic 1 with two segments of six messages, the time changing every two messages."""
    topic = Topic.open(path, 1, max_segment_size=300)
    for index in range(1, 13):
        topic.append(encode(1, 1, b"x" * 24, index=index), time_ms=T0 + (index - 1) // 2 * 100)
        topic.sync()
        topic.commit()
    assert topic.segment_count == 2
    return topic


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_an_older_segments_damaged_time_index_makes_its_times_unknown(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    topic = timed_topic(tmp_path / "1")
    before = topic.times(1, 12)
    first = topic.segments()[0]
    topic.close()
    flip(times_path(first.path), RECORD.size + 10)  # the second record's time
    with caplog.at_level(logging.ERROR):
        reopened = Topic.open(tmp_path / "1", 1, max_segment_size=300)
        runs = reopened.times(1, 12)
    assert "is damaged at byte 20" in caplog.text
    assert runs[0] == (1, None)  # unknown, not the first record's time for all of them
    assert runs[1:] == [r for r in before if r[0] >= 7]  # the last segment is intact
    assert reopened.time_of(3) is None and reopened.time_of(8) == T0 + 300
    # Its messages may be at or after any time: a seek that ends just after it starts at it,
    # rather than skip them.
    assert reopened.index_at_time(T0) == 1
    assert reopened.index_at_time(T0 + 300) == 1
    assert reopened.index_at_time(T0 + 400) == 9
    reopened.close()


def test_a_damaged_record_in_the_last_segment_is_not_taken_for_a_torn_write(
        tmp_path: Path) -> None:
    topic = timed_topic(tmp_path / "1")
    last = topic.segments()[-1]
    topic.close()
    flip(times_path(last.path), 3)  # its first record: frames it times exist
    reopened = Topic.open(tmp_path / "1", 1, max_segment_size=300)
    assert reopened.time_of(9) is None and reopened.time_of(2) == T0
    assert times_path(last.path).stat().st_size == 3 * RECORD.size  # nothing cut
    reopened.append(encode(1, 1, b"new", index=13), time_ms=T0 + 900)
    reopened.sync()
    reopened.commit()
    assert reopened.segment_count == 3  # new frames never go where times are unknown
    assert reopened.time_of(13) == T0 + 900
    reopened.close()


def test_a_torn_record_of_frames_that_never_came_is_cut(tmp_path: Path) -> None:
    topic = timed_topic(tmp_path / "1")
    last = topic.segments()[-1]
    topic.close()
    with times_path(last.path).open("ab") as f:  # a record for index 13, half written
        f.write((13).to_bytes(8, "big") + b"\0" * 12)
    reopened = Topic.open(tmp_path / "1", 1, max_segment_size=300)
    assert times_path(last.path).stat().st_size == 3 * RECORD.size
    assert reopened.time_of(12) == T0 + 500
    reopened.close()


def test_a_zero_filled_record_is_a_torn_write_and_is_cut(tmp_path: Path) -> None:
    """Some file systems show a write a crash interrupted as zeros: never a valid record
    (the CRC of zeros is not 0), so it is cut like a torn one, not taken for damage."""
    topic = timed_topic(tmp_path / "1")
    last = topic.segments()[-1]
    topic.close()
    with times_path(last.path).open("ab") as f:
        f.write(bytes(RECORD.size))
    reopened = Topic.open(tmp_path / "1", 1, max_segment_size=300)
    assert times_path(last.path).stat().st_size == 3 * RECORD.size
    assert reopened.time_of(12) == T0 + 500 and reopened.time_of(7) == T0 + 300
    reopened.close()


def test_a_seek_just_after_damaged_segments_starts_at_them(tmp_path: Path) -> None:
    """A damaged segment between two intact ones: a seek whose answer is where the next one
    starts reads the damaged one too (its messages may be as recent), never skips it."""
    topic = Topic.open(tmp_path / "1", 1, max_segment_size=150)
    for index in range(1, 10):  # three segments of three 50-byte frames, one time each
        topic.append(encode(1, 1, b"x" * 24, index=index), time_ms=T0 + (index - 1) // 3 * 100)
        topic.sync()
        topic.commit()
    middle = topic.segments()[1]
    topic.close()
    flip(times_path(middle.path), 12)
    reopened = Topic.open(tmp_path / "1", 1, max_segment_size=150)
    assert [reopened.index_at_time(T0 + k) for k in (0, 1, 100, 200, 201)] == [1, 4, 4, 4, None]
    reopened.close()
