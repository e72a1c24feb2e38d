"""Damage is counted and logged once per place, however many reader threads meet it at once."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from messaging.errors import CorruptDataError, CorruptFrameError
from messaging.topic.segment import Segment, segment_name
from messaging.topic.stats import DamageLog, OnceSet, TopicStats


def test_once_set_says_new_to_one_caller_per_key() -> None:
    seen = OnceSet()
    assert seen.first("a") and seen.first("b")
    assert not seen.first("a") and not seen.first("b")


def test_damage_met_by_many_readers_at_once_is_counted_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    stats = TopicStats()
    damage = DamageLog(7, stats)
    segment = Segment(tmp_path / segment_name(1), 1)
    readers = 16
    start = threading.Barrier(readers)
    found: list[CorruptDataError] = []

    def reader() -> None:
        start.wait(10)
        for _ in range(200):
            found.append(damage.report(segment, CorruptFrameError("checksum at byte 26")))

    with caplog.at_level(logging.ERROR, logger="messaging.topic"):
        threads = [threading.Thread(target=reader) for _ in range(readers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert len(found) == readers * 200
    assert {str(error) for error in found} == {
        f"topic 7 segment {segment.path.name}: checksum at byte 26"}
    assert stats.corrupt_frames == 1
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
    damage.report(segment, CorruptFrameError("checksum at byte 90"))  # another place
    assert stats.corrupt_frames == 2
