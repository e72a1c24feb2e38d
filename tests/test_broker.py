"""The broker state machine: indexes, internal commands, replay, snapshots, retention."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from messaging.broker import Broker, heartbeat_command
from messaging.errors import DataDirectoryError
from messaging.message import decode, encode, encode_batch


def commit_all(broker: Broker) -> None:
    ids = [t.id for t in broker.topics()]
    broker.sync(ids)
    broker.commit(ids)


def contents(broker: Broker) -> dict[int, list[tuple[int, bytes]]]:
    out = {}
    for topic in broker.topics():
        with topic.reader(topic.first_index) as reader:
            out[topic.id] = [(m.index, m.data) for m in decode(reader.read_all())[0]]
    return out


def test_indexes_are_assigned_across_topics(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    assert broker.apply(encode(1, 10, b"a")).first == 1
    result = broker.apply(encode_batch(20, [b"b", b"c"]))
    assert (result.first, result.last, result.count, result.topics) == (2, 3, 2, {20})
    mixed = encode(1, 10, b"d") + encode(1, 20, b"e") + encode(1, 10, b"f")
    assert broker.apply(mixed).topics == {10, 20}
    commit_all(broker)
    assert contents(broker) == {10: [(1, b"a"), (4, b"d"), (6, b"f")],
                                20: [(2, b"b"), (3, b"c"), (5, b"e")]}
    broker.close()


def test_internal_commands_record_subscribers_and_are_not_stored(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    broker.apply(encode_batch(1, [b"x", b"y"]))
    result = broker.apply(heartbeat_command(1, 2, "reader-1"))
    assert result.count == 0 and broker.index == 2
    assert broker.subscribers(1) == {"reader-1": 2}
    commit_all(broker)
    assert [i for i, _ in contents(broker)[1]] == [1, 2]
    broker.close()
    reopened = Broker.open(tmp_path)
    assert reopened.subscribers(1) == {"reader-1": 2}
    assert reopened.index == 2
    reopened.close()


def test_replay_reassigns_the_same_indexes_and_skips_stale(tmp_path: Path) -> None:
    commands = [encode(1, 1, b"a"), encode_batch(2, [b"b", b"c"]), encode(1, 1, b"d")]
    broker = Broker.open(tmp_path)
    for command in commands:
        broker.apply(command)
    commit_all(broker)
    before = contents(broker)
    broker.index = 1  # as a log restored at a snapshot taken after the first command
    replayed = [broker.apply(c) for c in commands[1:]]
    assert [(r.first, r.last) for r in replayed] == [(2, 3), (4, 4)]
    commit_all(broker)
    assert contents(broker) == before
    broker.close()


def test_snapshot_round_trip_gives_identical_topics(tmp_path: Path) -> None:
    source = Broker.open(tmp_path / "a", max_segment_size=100)
    for i in range(30):
        source.apply(encode(1, i % 3, f"message {i}".encode()))
    source.apply(heartbeat_command(1, 7, "sub"))
    commit_all(source)
    source.topic(0).truncate(0, 2**64)
    snapshot = io.BytesIO()
    source.write_snapshot(snapshot)
    target = Broker.open(tmp_path / "b", max_segment_size=100)
    target.apply(encode(1, 99, b"to be replaced"))
    snapshot.seek(0)
    target.read_snapshot(snapshot)
    assert contents(target) == contents(source)
    assert target.index == source.index == 30
    assert target.subscribers(1) == {"sub": 7}
    assert target.topic(0).first_index == source.topic(0).first_index
    for topic in source.topics():
        names = sorted(p.name for p in topic.path.iterdir())
        assert names == sorted(p.name for p in (tmp_path / "b/topics" / str(topic.id)).iterdir())
    target.apply(encode(1, 1, b"after restore"))
    assert target.index == 31
    source.close()
    target.close()


def test_retention_keeps_what_live_subscribers_need(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path, max_segment_size=50, max_topic_size=0,
                         subscriber_timeout=60)
    for _i in range(20):
        broker.apply(encode(1, 1, b"0123456789" * 3))
    commit_all(broker)
    broker.set_topic_max_index(1, 5, "slow")
    broker.set_topic_max_index(1, 15, "fast")
    assert broker.enforce_retention() > 0
    assert broker.topic(1).first_index <= 6
    seen = broker.positions.last_seen(1, "slow")
    assert seen is not None
    assert broker.enforce_retention(now=seen + 61) > 0  # "slow" timed out
    assert broker.topic(1).first_index > 15
    assert broker.topic(1).segment_count == 1
    broker.close()


def test_a_subscriber_resuming_after_retention_is_not_told_data_is_gone(tmp_path: Path,
                                                                          ) -> None:
    """Indexes are shared by topics: retention that deletes through a subscriber's heartbeat
    must still let it resume at heartbeat + 1, though that index is in another topic."""
    broker = Broker.open(tmp_path, max_segment_size=100, max_topic_size=0)
    for _ in range(10):  # topics 1 and 2 interleaved: topic 1 holds odd indexes only
        broker.apply(encode(1, 1, b"x" * 60) + encode(1, 2, b"y" * 60))
    commit_all(broker)
    first_segment = broker.topic(1).segments()[0]
    heartbeat = first_segment.last_index
    broker.set_topic_max_index(1, heartbeat, "reporter")
    assert broker.enforce_retention() > 0
    assert not first_segment.path.exists()
    with broker.topic(1).reader(heartbeat + 1) as reader:
        got = [m.index for m in decode(reader.read_all(), after=heartbeat)[0]]
    assert got == list(range(heartbeat + 2, 21, 2))
    broker.close()


def test_data_directory_is_locked(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    with pytest.raises(DataDirectoryError, match="in use"):
        Broker.open(tmp_path)
    broker.close()


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "broker.json").write_text('{"format": 99}')
    with pytest.raises(DataDirectoryError, match="format 99"):
        Broker.open(tmp_path)
