"""Retention by age: whole segments whose newest message is older than the broker's
``retention_age`` or a topic's ``retention-age`` go, under the rules of size retention (never
the active segment, never past a live subscriber, tombstone first, 410 below), and segments
without times are left to size retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from messaging.broker.broker import Broker
from messaging.broker.topic_settings import configure_command
from messaging.errors import TopicTruncatedError
from messaging.frames import encode
from messaging.topic.times import TIMES_SUFFIX

HOUR = 3_600_000
T0 = 1_795_000_000_000


def fill(broker: Broker, topic: int, count: int, time_ms: int | None) -> None:
    """``count`` messages of 30 bytes (56 with the header: three a segment of 150), one
    command each, all formed at ``time_ms``."""
    for _ in range(count):
        [result] = broker.write_group([encode(1, topic, b"0123456789" * 3)], durable=True,
                                      times=[time_ms])
        assert not isinstance(result, Exception)


def test_segments_older_than_the_age_go_and_the_active_one_stays(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path, max_segment_size=150, retention_age=2 * 3600)
    fill(broker, 1, 6, T0)  # two old segments
    fill(broker, 1, 6, T0 + 3 * HOUR)  # then two new ones
    topic = broker.topic(1)
    assert topic is not None and topic.segment_count == 4
    first_new = topic.index_at_time(T0 + 3 * HOUR)
    assert broker.enforce_retention(wall_ms=T0 + 4 * HOUR) > 0
    assert topic.first_index == first_new
    assert {s.last_time() for s in topic.segments()} == {T0 + 3 * HOUR}
    assert sorted(p.suffix for p in topic.path.iterdir() if p.name != "tombstone") == \
        [".seg", ".seg", TIMES_SUFFIX, TIMES_SUFFIX]  # each time index went with its segment
    with pytest.raises(TopicTruncatedError):
        topic.reader(1).read(1 << 20)
    # Much later everything is old, but the active segment stays.
    broker.enforce_retention(wall_ms=T0 + 100 * HOUR)
    assert topic.segment_count == 1
    broker.close()


def test_a_live_subscriber_holds_old_data_back(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path, max_segment_size=150, retention_age=60,
                         subscriber_timeout=60)
    fill(broker, 1, 9, T0)
    fill(broker, 1, 3, T0 + HOUR)
    topic = broker.topic(1)
    assert topic is not None
    held = topic.segments()[1].first_index  # the subscriber is inside the second segment
    broker.positions.record(1, held, "slow")
    broker.enforce_retention(wall_ms=T0 + 2 * HOUR)
    assert topic.first_index <= held  # only the first segment went
    assert topic.segments()[0].first_index == held
    seen = broker.positions.last_seen(1, "slow")
    assert seen is not None
    broker.enforce_retention(now=seen + 61, wall_ms=T0 + 2 * HOUR)  # it timed out
    assert topic.segment_count == 1
    broker.close()


def test_a_topic_setting_overrides_the_broker_and_zero_turns_it_off(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path, max_segment_size=150, retention_age=3600)
    for topic_id, age in ((1, 0), (2, 5 * HOUR)):
        broker.write_group([configure_command(topic_id, {"retention-age": age})],
                           durable=True, times=[T0])
    for topic_id in (1, 2, 3):  # the broker's time never goes back: old ones first
        fill(broker, topic_id, 6, T0)
    for topic_id in (1, 2, 3):
        fill(broker, topic_id, 3, T0 + 2 * HOUR)
    broker.enforce_retention(wall_ms=T0 + 3 * HOUR)
    counts = {t: broker.topic(t).segment_count for t in (1, 2, 3)}
    assert counts[1] == counts[2] == 3  # off; 5 h: nothing is that old
    assert counts[3] == 1  # the broker's hour
    broker.close()
    reopened = Broker.open(tmp_path, max_segment_size=150, retention_age=3600)
    reopened.enforce_retention(wall_ms=T0 + 8 * HOUR)  # settings survive a restart
    assert reopened.topic(2).segment_count == 1
    assert reopened.topic(1).segment_count == 3
    reopened.close()


def test_segments_without_times_go_by_age_only_behind_an_old_enough_one(
        tmp_path: Path) -> None:
    broker = Broker.open(tmp_path, max_segment_size=150, retention_age=60)
    fill(broker, 1, 6, None)  # as written before times existed: no time index
    fill(broker, 1, 6, T0)
    fill(broker, 1, 3, T0 + HOUR)
    topic = broker.topic(1)
    assert topic is not None
    untimed = [s for s in topic.segments() if s.times is None]
    assert len(untimed) == 2 and topic.segment_count == 5
    assert topic.index_at_time(0) == topic.segments()[2].first_index  # older than any time
    broker.enforce_retention(wall_ms=T0 + 30_000)  # nothing timed is old enough yet
    assert topic.segments()[0] is untimed[0]  # and no age is invented for them
    broker.enforce_retention(wall_ms=T0 + HOUR + 30_000)
    # The T0 segments are too old, so the untimed ones before them are older still.
    assert [s.last_time() for s in topic.segments()] == [T0 + HOUR]
    broker.close()


def test_untimed_segments_are_left_to_size_retention(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path, max_segment_size=150, retention_age=60)
    fill(broker, 1, 6, None)
    fill(broker, 1, 3, T0)
    topic = broker.topic(1)
    assert topic is not None and topic.segment_count == 3
    broker.enforce_retention(wall_ms=T0 + HOUR)  # only the active segment is timed
    assert topic.segment_count == 3
    broker.max_topic_size = 0
    broker.enforce_retention(wall_ms=T0)  # size retention takes them
    assert topic.segment_count == 1
    broker.close()
