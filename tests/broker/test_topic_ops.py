"""Topic commands in the broker's state machine: per-topic settings enforced (segment rolls,
retention, message size), deletion (files, positions, 410 afterwards, created again by a
publish), and all of it exact after close/reopen, a snapshot, and a replay of the commands."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from messaging.broker import snapshot as snapshot_format
from messaging.broker.broker import Broker
from messaging.broker.commands import heartbeat_command
from messaging.broker.subscribers import RESET, consumer_command
from messaging.broker.topic_settings import (
    MAX_MESSAGE_SIZE,
    MAX_SEGMENT_SIZE,
    MAX_TOPIC_SIZE,
    configure_command,
    delete_command,
)
from messaging.errors import MessageTooLargeError, TopicDeletedError
from messaging.frames import encode, encode_batch
from tests.broker.test_broker import commit_all, contents
from tests.conftest import apply


def state_of(broker: Broker) -> tuple[object, ...]:
    """What must agree after a restart, a snapshot or a replay."""
    table = broker.catalog.topic_settings
    return (broker.index, contents(broker), dict(table.entries),
            {t.id: broker.subscribers(t.id) for t in broker.topics()},
            {t.id: t.max_segment_size for t in broker.topics()})


def test_a_configure_creates_an_empty_topic_and_survives_reopening(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    result = apply(broker, configure_command(5, {MAX_SEGMENT_SIZE: 200, MAX_TOPIC_SIZE: 1000}))
    assert result.created and broker.index == 0  # a topic command takes no index
    topic = broker.topic(5)
    assert topic is not None and topic.last_index == 0 and topic.max_segment_size == 200
    assert not apply(broker, configure_command(5, {MAX_TOPIC_SIZE: None})).created
    assert broker.settings(5).settings == {MAX_SEGMENT_SIZE: 200}
    broker.close()
    reopened = Broker.open(tmp_path)  # from the state journal
    assert reopened.settings(5).settings == {MAX_SEGMENT_SIZE: 200}
    assert reopened.topic(5) is not None and reopened.topic(5).max_segment_size == 200
    reopened.save_state()  # folded into broker.json
    reopened.close()
    again = Broker.open(tmp_path)
    assert again.settings(5).settings == {MAX_SEGMENT_SIZE: 200}
    again.close()


def test_a_topics_segment_size_decides_when_it_rolls(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path, max_segment_size=1 << 20)
    apply(broker, configure_command(1, {MAX_SEGMENT_SIZE: 100}))
    for _ in range(6):
        apply(broker, encode(1, 1, b"x" * 60))
        apply(broker, encode(1, 2, b"y" * 60))
    commit_all(broker)
    # A segment takes frames until it is past the limit: two 86-byte frames each.
    assert broker.topic(1).segment_count == 3
    assert broker.topic(2).segment_count == 1
    broker.close()


def test_a_topics_size_limit_drives_its_retention_only(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path, max_segment_size=100)
    apply(broker, configure_command(1, {MAX_TOPIC_SIZE: 200}))
    for _ in range(8):
        apply(broker, encode(1, 1, b"x" * 60))
        apply(broker, encode(1, 2, b"y" * 60))
    commit_all(broker)
    assert broker.enforce_retention() > 0
    assert broker.topic(1).size <= 200 < broker.topic(2).size
    assert broker.topic(2).segment_count == 4
    broker.close()


def test_a_topics_message_size_is_refused_with_413_and_takes_no_index(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    apply(broker, configure_command(1, {MAX_MESSAGE_SIZE: 10}))
    with pytest.raises(MessageTooLargeError, match="max-message-size of 10"):
        apply(broker, encode_batch(1, [b"small", b"x" * 11]))
    assert broker.index == 0
    assert apply(broker, encode(1, 1, b"x" * 10)).first == 1
    assert apply(broker, encode(1, 2, b"x" * 11)).first == 2  # another topic: no limit
    broker.close()


def test_a_deleted_topic_loses_files_positions_and_settings(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    apply(broker, configure_command(1, {MAX_TOPIC_SIZE: 1000}))
    apply(broker, encode_batch(1, [b"a", b"b"]))
    apply(broker, heartbeat_command(1, 2, "reader"))
    apply(broker, consumer_command(RESET, 1, "app", 1))
    apply(broker, encode(1, 2, b"other"))
    path = broker.topic(1).path
    apply(broker, delete_command(1))
    assert broker.topic(1) is None and not path.exists()
    assert broker.subscribers(1) == {} and broker.settings(1).settings == {}
    assert broker.deleted_at(1) == 3
    assert broker.subscribers(2) == {} and broker.topic(2) is not None
    # A publish creates it again, its indexes going on from the broker's.
    assert apply(broker, encode(1, 1, b"new")).first == 4
    commit_all(broker)
    assert contents(broker)[1] == [(4, b"new")]
    topic = broker.topic(1)
    assert topic is not None
    with pytest.raises(TopicDeletedError, match="first available index is 4") as raised:
        topic.reader(2).read_all()
    assert raised.value.first_index == 4 and raised.value.status == 410
    with topic.reader(4) as reader:
        assert len(reader.read_all()) > 0
    broker.close()
    reopened = Broker.open(tmp_path)
    assert reopened.deleted_at(1) == 3 and contents(reopened)[1] == [(4, b"new")]
    with pytest.raises(TopicDeletedError):
        reopened.topic(1).reader(1).read_all()
    reopened.close()


def test_a_group_with_a_deletion_in_the_middle_applies_in_order(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    results = broker.write_group([encode(1, 1, b"before"), delete_command(1),
                                  encode(1, 1, b"after"), encode(1, 2, b"other")],
                                 durable=True)
    assert [getattr(r, "first", None) for r in results] == [1, 0, 2, 3]
    assert contents(broker) == {1: [(2, b"after")], 2: [(3, b"other")]}
    assert broker.deleted_at(1) == 1
    broker.close()


def test_a_snapshot_carries_settings_and_deletions(tmp_path: Path) -> None:
    source = Broker.open(tmp_path / "a")
    apply(source, configure_command(1, {MAX_SEGMENT_SIZE: 150}))
    apply(source, encode(1, 2, b"gone"))
    apply(source, delete_command(2))
    apply(source, encode(1, 2, b"again"))
    apply(source, encode_batch(1, [b"x" * 100, b"y" * 100]))
    commit_all(source)
    stream = io.BytesIO()
    snapshot_format.write(source, stream)
    stream.seek(0)
    target = Broker.open(tmp_path / "b")
    target.install_snapshot(stream)
    assert state_of(target) == state_of(source)
    with pytest.raises(TopicDeletedError):
        target.topic(2).reader(1).read_all()
    source.close()
    target.close()


def test_replaying_the_commands_from_a_checkpoint_ends_in_the_same_state(tmp_path: Path,
                                                                         ) -> None:
    """What a cluster node does after a restart: its topics and saved state are ahead of its
    checkpoint (the broker index and the catalog as of a revision), and it applies every
    command after the checkpoint again; a deletion replayed must not delete what came after."""
    commands = [encode(1, 1, b"a"), configure_command(1, {MAX_SEGMENT_SIZE: 120}),
                heartbeat_command(1, 1, "reader"), encode(1, 1, b"b" * 80),
                delete_command(1), encode(1, 1, b"c"),
                configure_command(1, {MAX_MESSAGE_SIZE: 50}), encode(1, 1, b"d" * 50)]
    broker = Broker.open(tmp_path)
    checkpoints = [(broker.index, broker.catalog.saved())]
    for command in commands:
        apply(broker, command)
        checkpoints.append((broker.index, broker.catalog.saved()))
    commit_all(broker)
    expected = state_of(broker)
    assert contents(broker)[1] == [(3, b"c"), (4, b"d" * 50)]
    for start in range(len(commands)):
        broker.index, catalog = checkpoints[start]
        broker.catalog.restore(catalog)
        for command in commands[start:]:
            apply(broker, command)
        commit_all(broker)
        assert state_of(broker) == expected, start
    broker.close()
