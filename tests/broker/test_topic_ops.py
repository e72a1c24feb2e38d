"""Topic commands in the broker's state machine: per-topic settings enforced (segment rolls,
retention, message size), deletion (files, positions, 410 afterwards, created again by a
publish), and all of it exact after close/reopen, a snapshot, and a replay of the commands."""

from __future__ import annotations

import io
import logging
import os
import threading
from pathlib import Path

import pytest

from messaging.broker import snapshot as snapshot_format
from messaging.broker.broker import Broker
from messaging.broker.catalog import stream_command
from messaging.broker.commands import heartbeat_command
from messaging.broker.commands import produce as produce_command
from messaging.broker.subscribers import RESET, consumer_command
from messaging.broker.topic_settings import (
    MAX_MESSAGE_SIZE,
    MAX_SEGMENT_SIZE,
    MAX_TOPIC_SIZE,
    configure_command,
    delete_command,
)
from messaging.errors import (
    BadRequestError,
    MessageTooLargeError,
    ProducerSequenceGapError,
    StreamConflictError,
    TopicDeletedError,
)
from messaging.files import DELETING, write_json_atomic
from messaging.frames import encode, encode_batch
from messaging.topic.topic import TOMBSTONE
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


def test_a_kafka_partition_is_labelled_once_and_only_while_empty(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    assert apply(broker, configure_command(5, {}, kafka=("orders", 0))).created
    with pytest.raises(StreamConflictError, match="already partition 0"):
        apply(broker, configure_command(5, {}, kafka=("other", 0)))
    apply(broker, configure_command(5, {}, kafka=("orders", 0)))  # repeated alike: no change
    apply(broker, encode(1, 6, b"data"))
    with pytest.raises(StreamConflictError, match="holds messages"):
        apply(broker, configure_command(6, {}, kafka=("orders", 1)))
    assert broker.committed.kafka_topics() == {"orders": {0: 5}}
    with pytest.raises(StreamConflictError, match="is topic 5 already"):  # one per partition
        apply(broker, configure_command(7, {}, kafka=("orders", 0)))
    assert broker.topic(7) is None
    apply(broker, configure_command(5, {MAX_SEGMENT_SIZE: 300}))
    broker.close()
    reopened = Broker.open(tmp_path)  # from the journal
    assert reopened.committed.kafka_topics() == {"orders": {0: 5}}
    assert reopened.settings(5).settings == {MAX_SEGMENT_SIZE: 300}
    apply(reopened, delete_command(5))
    assert reopened.committed.kafka_topics() == {}
    reopened.save_state()
    reopened.close()
    again = Broker.open(tmp_path)  # from broker.json
    assert again.committed.kafka_topics() == {}
    assert again.settings(5).deleted_at is not None
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
    assert broker.deleted_at(1) == 4 == broker.index  # the deletion's own index
    assert broker.subscribers(2) == {} and broker.topic(2) is not None
    # A publish creates it again, its indexes going on from the broker's.
    assert apply(broker, encode(1, 1, b"new")).first == 5
    commit_all(broker)
    assert contents(broker)[1] == [(5, b"new")]
    topic = broker.topic(1)
    assert topic is not None
    with pytest.raises(TopicDeletedError, match="first available index is 5") as raised:
        topic.reader(2).read_all()
    assert raised.value.first_index == 5 and raised.value.status == 410
    with topic.reader(5) as reader:
        assert len(reader.read_all()) > 0
    broker.close()
    reopened = Broker.open(tmp_path)
    assert reopened.deleted_at(1) == 4 and contents(reopened)[1] == [(5, b"new")]
    with pytest.raises(TopicDeletedError):
        reopened.topic(1).reader(1).read_all()
    reopened.close()


def test_a_read_resuming_right_after_the_old_topics_last_message_is_fenced(tmp_path: Path,
                                                                          ) -> None:
    """One topic alone: its last index L is the broker index when it is deleted. A reader
    that saw L resumes at L + 1; that must be 410 after a re-creation, never the new
    topic's first message as if it followed on; also after a restart."""
    broker = Broker.open(tmp_path)
    apply(broker, encode_batch(1, [b"a", b"b"]))
    apply(broker, delete_command(1))
    assert broker.deleted_at(1) == 3 == broker.index
    assert apply(broker, encode(1, 1, b"new")).first == 4
    commit_all(broker)
    topic = broker.topic(1)
    assert topic is not None
    with pytest.raises(TopicDeletedError, match="first available index is 4"):
        topic.reader(3).read_all()  # resumed right after the old topic's last message
    with topic.reader(4) as reader:
        assert len(reader.read_all()) > 0
    broker.close()
    reopened = Broker.open(tmp_path)
    with pytest.raises(TopicDeletedError):
        reopened.topic(1).reader(3).read_all()
    apply(reopened, delete_command(1))  # deleted again: the index goes on from the journal
    assert reopened.deleted_at(1) == 5
    assert apply(reopened, encode(1, 1, b"third")).first == 6
    reopened.close()


def test_a_refused_deletion_takes_no_index(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    with pytest.raises(BadRequestError, match="DELETE /v1/stream/"):
        apply(broker, delete_command(1 << 63))
    assert broker.index == 0 and broker.deleted_at(1 << 63) is None
    broker.close()


class _WatchedLock:
    """A lock that tells when an acquire has to wait (so a test knows, without sleeping,
    that a thread is blocked on it)."""

    def __init__(self, contended: threading.Event) -> None:
        self._lock = threading.Lock()
        self._contended = contended

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self._contended.set()
            self._lock.acquire()

    def __exit__(self, *_exc: object) -> None:
        self._lock.release()


def test_a_deletion_waits_for_a_retention_run_on_its_topic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        ) -> None:
    """Retention stopped at its tombstone write (the system-call boundary) while the writer
    deletes the same topic: the deletion waits for it (before: the tombstone went into a
    directory being deleted, an ERROR, or a half-deleted directory a re-creation reopened),
    and the topic created again afterwards starts empty, with no tombstone."""
    broker = Broker.open(tmp_path, max_segment_size=100)
    apply(broker, configure_command(1, {MAX_TOPIC_SIZE: 200}))
    for n in range(8):
        apply(broker, encode(1, 1, b"%d" % n * 60))
    commit_all(broker)
    at_tombstone, resume, progressed = threading.Event(), threading.Event(), threading.Event()

    def paused_write(path: Path, value: object, **options: bool) -> None:
        at_tombstone.set()
        assert resume.wait(10)
        write_json_atomic(path, value, **options)

    monkeypatch.setattr("messaging.topic.retention.write_json_atomic", paused_write)
    broker.retention.lock = _WatchedLock(progressed)  # type: ignore[assignment]
    retention = threading.Thread(target=broker.enforce_retention)
    retention.start()
    assert at_tombstone.wait(10)

    def delete() -> None:
        broker.write_group([delete_command(1)], durable=True)
        progressed.set()

    deletion = threading.Thread(target=delete)
    deletion.start()
    assert progressed.wait(10)  # the deletion is done, or waits for the retention run
    resume.set()
    retention.join(10)
    deletion.join(10)
    assert not retention.is_alive() and not deletion.is_alive()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert broker.topic(1) is None
    assert os.listdir(tmp_path / "topics") == []  # nothing left, under any name
    index = apply(broker, encode(1, 1, b"again")).first
    commit_all(broker)
    topic = broker.topic(1)
    assert topic is not None and topic.first_index == index
    assert not (topic.path / TOMBSTONE).exists()
    assert contents(broker)[1] == [(index, b"again")]
    broker.close()


def test_a_deletion_cut_short_leaves_nothing_under_the_topics_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The topic's directory is renamed away before its files are deleted: a deletion that
    fails midway (here: its first unlink) never leaves old segments for a re-creation to
    reopen, and the next start-up removes what it left."""
    broker = Broker.open(tmp_path, max_segment_size=100)
    for n in range(4):
        apply(broker, encode(1, 1, b"%d" % n * 60))
    commit_all(broker)
    real_unlink = os.unlink
    failed: list[str] = []

    def failing_unlink(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        if not failed and str(path).endswith(".seg"):
            failed.append(str(path))
            raise PermissionError(1, "Operation not permitted", str(path))
        real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", failing_unlink)
    apply(broker, delete_command(1))
    monkeypatch.undo()
    assert failed and not (tmp_path / "topics" / "1").exists()
    index = apply(broker, encode(1, 1, b"again")).first
    commit_all(broker)
    assert contents(broker)[1] == [(index, b"again")]
    broker.close()
    assert any(name.startswith(DELETING) for name in os.listdir(tmp_path / "topics"))
    reopened = Broker.open(tmp_path)
    assert os.listdir(tmp_path / "topics") == ["1"]
    assert contents(reopened)[1] == [(index, b"again")]
    reopened.close()


def test_a_group_with_a_deletion_in_the_middle_applies_in_order(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    results = broker.write_group([encode(1, 1, b"before"), delete_command(1),
                                  encode(1, 1, b"after"), encode(1, 2, b"other")],
                                 durable=True)
    assert [getattr(r, "first", None) for r in results] == [1, 0, 3, 4]
    assert contents(broker) == {1: [(3, b"after")], 2: [(4, b"other")]}
    assert broker.deleted_at(1) == 2
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
    assert contents(broker)[1] == [(4, b"c"), (5, b"d" * 50)]
    for start in range(len(commands)):
        broker.index, catalog = checkpoints[start]
        broker.catalog.restore(catalog)
        for command in commands[start:]:
            apply(broker, command)
        commit_all(broker)
        assert state_of(broker) == expected, start
    broker.close()


# -- a deletion forgets the topic's idempotent producers ------------------------------------------

_NOW = 1_700_000_000.0


def produce(topic: int, producer: tuple[str, int, int], data: bytes) -> bytes:
    """A native publish with producer headers, as the HTTP layer builds it."""
    return stream_command({"op": "produce", "topic": topic, "producer": list(producer),
                           "now": _NOW}, encode(1, topic, data))


def test_a_deleted_topic_forgets_its_producers(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    for seq in range(3):
        assert apply(broker, produce(1, ("p", 2, seq), b"old %d" % seq)).last == seq + 1
    assert apply(broker, produce(1, ("p", 2, 2), b"old 2")).stream.duplicate
    apply(broker, delete_command(1))
    assert broker.catalog.producers(1) == {}
    # The same request again is not a duplicate of data that is gone: a producer that is new
    # here must start at seq 0 (409), and one that does is stored, at an epoch of its choice.
    with pytest.raises(ProducerSequenceGapError, match="new here"):
        apply(broker, produce(1, ("p", 2, 2), b"old 2"))
    stored = apply(broker, produce(1, ("p", 1, 0), b"new"))
    assert stored.stream is not None and not stored.stream.duplicate
    assert stored.first == stored.last == 5  # after the deletion's own index, 4
    commit_all(broker)
    assert contents(broker)[1] == [(5, b"new")]
    broker.close()
    for fold in (False, True):  # replayed from the state journal, then from broker.json
        reopened = Broker.open(tmp_path)
        assert reopened.catalog.producers(1)["p"].epoch == 1
        assert apply(reopened, produce(1, ("p", 1, 0), b"new")).stream.duplicate
        if fold:
            reopened.save_state()
        reopened.close()


def test_a_deletion_in_the_journal_forgets_producers_on_replay(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    apply(broker, produce(1, ("p", 0, 0), b"a"))
    broker.save_state()  # broker.json knows the producer; the journal holds the deletion
    apply(broker, delete_command(1))
    broker.close()
    reopened = Broker.open(tmp_path)
    assert reopened.catalog.producers(1) == {}
    result = apply(reopened, produce(1, ("p", 0, 0), b"a"))
    assert result.stream is not None and not result.stream.duplicate and result.first == 3
    reopened.close()


def test_a_snapshot_between_delete_and_recreate_has_no_producers(tmp_path: Path) -> None:
    source = Broker.open(tmp_path / "a")
    apply(source, produce(1, ("p", 0, 0), b"a"))
    apply(source, produce(2, ("p", 0, 0), b"kept"))
    apply(source, delete_command(1))
    commit_all(source)
    stream = io.BytesIO()
    snapshot_format.write(source, stream)
    stream.seek(0)
    target = Broker.open(tmp_path / "b")
    target.install_snapshot(stream)
    assert target.catalog.producers(1) == {} and "p" in target.catalog.producers(2)
    assert "1" not in target.catalog.saved()["native"]
    for broker in (source, target):  # both recreate the topic the same way
        result = apply(broker, produce(1, ("p", 0, 0), b"a"))
        assert result.stream is not None and not result.stream.duplicate
        assert apply(broker, produce(2, ("p", 0, 0), b"kept")).stream.duplicate
        commit_all(broker)
    assert contents(target) == contents(source)
    source.close()
    target.close()


def test_a_deleted_topic_forgets_positions_its_group_recorded(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    apply(broker, encode_batch(1, [b"a", b"b"]))
    results = broker.write_group([heartbeat_command(1, 1, "late"),
                                  consumer_command(RESET, 1, "app", 2), delete_command(1)],
                                 durable=False)
    assert not any(isinstance(r, Exception) for r in results)
    assert broker.subscribers(1) == {}
    broker.close()
    assert Broker.open(tmp_path).subscribers(1) == {}


def test_a_freed_streams_positions_go_with_it(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    created = broker.write_group([stream_command({"op": "create", "name": "s", "now": _NOW,
                                                  "content_type": "text/plain"})],
                                 durable=False)[0]
    assert not isinstance(created, Exception)
    topic = broker.catalog.streams["s"].topic
    apply(broker, heartbeat_command(topic, 0, "reader"))
    assert broker.subscribers(topic) == {"reader": 0}
    apply(broker, stream_command({"op": "delete", "name": "s", "now": _NOW}))
    assert broker.subscribers(topic) == {}
    broker.close()
    reopened = Broker.open(tmp_path)
    assert reopened.subscribers(topic) == {}
    reopened.close()


# -- a Kafka batch takes a sequence number per record -----------------------------------------


def test_a_batch_spanning_sequence_numbers_is_stored_once_and_the_next_follows_it(
        tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    three = encode_batch(9, [b"a", b"b", b"c"])
    first = apply(broker, produce_command(9, ("p", 0, 0), 1.0, three, span=3))
    assert first.stream is not None and (first.first, first.last) == (1, 3)
    again = apply(broker, produce_command(9, ("p", 0, 0), 1.0, three, span=3))
    assert again.stream is not None and again.stream.duplicate
    assert (again.stream.first, again.stream.producer) == (1, (0, 2))
    with pytest.raises(ProducerSequenceGapError):  # must start at 3
        apply(broker, produce_command(9, ("p", 0, 4), 1.0, encode(1, 9, b"d"), span=1))
    apply(broker, produce_command(9, ("p", 0, 3), 1.0, encode_batch(9, [b"d", b"e"]), span=2))
    older = apply(broker, produce_command(9, ("p", 0, 0), 1.0, three, span=3))
    assert older.stream is not None and older.stream.duplicate
    assert older.stream.producer == (0, 4)  # the last stored: an older batch than it
    broker.close()
    reopened = Broker.open(tmp_path)  # the producer table is journaled with the frames
    assert contents(reopened)[9] == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d"), (5, b"e")]
    resent = produce_command(9, ("p", 0, 3), 1.0, encode_batch(9, [b"d", b"e"]), span=2)
    assert apply(reopened, resent).stream.duplicate
    settled = reopened.settled_result(resent)  # a snapshot's answer to the batch sent again
    assert settled is not None and settled.stream is not None
    assert (settled.stream.first, settled.stream.last) == (4, 5)
    reopened.close()
