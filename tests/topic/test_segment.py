"""Segments: file names, the sparse index built from a file's bytes, seeking, rollback."""

from __future__ import annotations

from bisect import bisect_left
from pathlib import Path

import pytest

from messaging.errors import CorruptFrameError
from messaging.frames import HEADER_SIZE
from messaging.topic.segment import MARK_EVERY, Segment, segment_name
from messaging.topic.topic import Topic
from tests.conftest import frames
from tests.topic.test_topic import read

DATA = b"y" * 50
FRAME = HEADER_SIZE + len(DATA)


def indexed(path: Path, indexes: list[int]) -> Segment:
    """A segment file holding ``indexes``, indexed from its bytes (as after a restart)."""
    (path / segment_name(indexes[0])).write_bytes(frames(1, indexes, DATA))
    segment = Segment(path / segment_name(indexes[0]), indexes[0])
    assert segment.ensure_indexed() is None
    return segment


def test_names_sort_in_index_order() -> None:
    assert segment_name(1) == "00000000000000000001.seg"
    names = [segment_name(i) for i in (9, 10, 2**64 - 1, 100)]
    assert sorted(names) == [segment_name(i) for i in (9, 10, 100, 2**64 - 1)]


def test_the_sparse_index_marks_a_frame_every_mark_every_bytes(tmp_path: Path) -> None:
    indexes = list(range(10, 3010, 3))  # other topics took the indexes in between
    segment = indexed(tmp_path, indexes)
    assert (segment.size, segment.count, segment.last_index) == (
        len(indexes) * FRAME, len(indexes), indexes[-1])
    assert segment.committed_size == segment.size and segment.indexed
    assert segment.mark_positions[0] == 0
    assert len(segment.mark_positions) >= segment.size // (MARK_EVERY + FRAME)
    for index, position, ordinal in zip(segment.mark_indexes, segment.mark_positions,
                                        segment.mark_ordinals, strict=True):
        assert position % FRAME == 0 and ordinal == position // FRAME
        assert index == indexes[ordinal]
    gaps = [b - a for a, b in zip(segment.mark_positions, segment.mark_positions[1:],
                                  strict=False)]
    assert all(MARK_EVERY <= gap < MARK_EVERY + FRAME for gap in gaps)


def test_seek_and_index_at_ordinal_agree_with_the_frames(tmp_path: Path) -> None:
    indexes = list(range(10, 3010, 3))
    segment = indexed(tmp_path, indexes)
    for index in (0, 10, 11, 12, 13, 1500, 1501, 3007, 3008, 10**6):
        ordinal = bisect_left(indexes, index)
        assert segment.seek(index) == (ordinal * FRAME, ordinal), index
    for ordinal in (0, 1, 53, 54, 55, 500, len(indexes) - 1):
        assert segment.index_at_ordinal(ordinal) == indexes[ordinal]


def test_damage_and_a_torn_tail_stop_the_index_where_they_start(tmp_path: Path) -> None:
    data = frames(1, [1, 2, 3, 4, 5], DATA)
    damaged = bytearray(data)
    damaged[2 * FRAME + HEADER_SIZE + 7] ^= 0x01  # inside the data of frame 3
    segment = Segment(tmp_path / segment_name(1), 1)
    error = segment.build_index(bytes(damaged), verify=True)
    assert isinstance(error, CorruptFrameError)
    assert (segment.committed_size, segment.committed_count, segment.last_index) == (
        2 * FRAME, 2, 2)
    error = segment.build_index(data[:-3], verify=False)
    assert isinstance(error, CorruptFrameError) and "incomplete" in str(error)
    assert (segment.committed_size, segment.committed_count) == (4 * FRAME, 4)


def test_rollback_forgets_what_was_not_committed(tmp_path: Path) -> None:
    segment = indexed(tmp_path, list(range(1, 101)))
    committed = (segment.size, segment.count, segment.last_index, list(segment.mark_indexes))
    segment.add_mark(101, segment.size, segment.count)  # as an append of one more frame
    segment.size += FRAME
    segment.count += 1
    segment.last_index = 101
    segment.rollback()
    assert (segment.size, segment.count, segment.last_index,
            segment.mark_indexes) == committed
    assert len(segment.mark_positions) == len(segment.mark_ordinals) == len(committed[3])


def test_a_file_retention_deleted_is_file_not_found(tmp_path: Path) -> None:
    segment = Segment(tmp_path / segment_name(1), 1)
    with pytest.raises(FileNotFoundError):
        segment.ensure_indexed()


def test_seek_uses_sparse_marks(tmp_path: Path) -> None:
    topic = Topic.open(tmp_path, 1)
    topic.append(frames(1, range(1, 20001), data=b"x" * 100))
    topic.commit()
    segment = topic.segments()[0]
    assert len(segment.mark_indexes) > 400
    assert read(topic, 12345, limit=2) == [12345, 12346]
    assert topic.index_after(100, 1000) == 1099
    topic.close()
    reopened = Topic.open(tmp_path, 1)
    assert reopened.segments()[0].mark_indexes == segment.mark_indexes
    assert reopened.index_after(100, 1000) == 1099
    reopened.close()
