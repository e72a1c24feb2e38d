"""The broker state machine: indexes, internal commands, replay, retention, the data
directory; storage faults (acknowledged means safe); the open-file budget of groups.

Snapshots are tests/broker/test_snapshot.py (and tests/http/test_snapshot.py between peers).
"""

from __future__ import annotations

import errno
import os
import random
import threading
from pathlib import Path

import pytest

from messaging.broker.broker import ApplyResult, Broker
from messaging.broker.commands import heartbeat_command
from messaging.errors import DataDirectoryError, DiskFullError, StorageError, StorageFailedError
from messaging.frames import Message, decode, encode, encode_batch, encode_many
from messaging.topic.topic import Topic
from tests.conftest import apply
from tests.faults import Faults, inject, open_files_under


def commit_all(broker: Broker) -> None:
    """fsync every topic (Broker.apply already made its commands visible)."""
    broker.sync([t.id for t in broker.topics()])


def contents(broker: Broker) -> dict[int, list[tuple[int, bytes]]]:
    out = {}
    for topic in broker.topics():
        with topic.reader(topic.first_index) as reader:
            out[topic.id] = [(m.index, m.data) for m in decode(reader.read_all())[0]]
    return out


def test_indexes_are_assigned_across_topics(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    assert apply(broker, encode(1, 10, b"a")).first == 1
    result = apply(broker, encode_batch(20, [b"b", b"c"]))
    assert (result.first, result.last, result.count, result.topics) == (2, 3, 2, {20})
    mixed = encode(1, 10, b"d") + encode(1, 20, b"e") + encode(1, 10, b"f")
    assert apply(broker, mixed).topics == {10, 20}
    commit_all(broker)
    assert contents(broker) == {10: [(1, b"a"), (4, b"d"), (6, b"f")],
                                20: [(2, b"b"), (3, b"c"), (5, b"e")]}
    broker.close()


def test_internal_commands_record_subscribers_and_are_not_stored(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    apply(broker, encode_batch(1, [b"x", b"y"]))
    result = apply(broker, heartbeat_command(1, 2, "reader-1"))
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
        apply(broker, command)
    commit_all(broker)
    before = contents(broker)
    broker.index = 1  # as a log restored at a snapshot taken after the first command
    replayed = [apply(broker, c) for c in commands[1:]]
    assert [(r.first, r.last) for r in replayed] == [(2, 3), (4, 4)]
    commit_all(broker)
    assert contents(broker) == before
    broker.close()


def test_retention_keeps_what_live_subscribers_need(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path, max_segment_size=50, max_topic_size=0,
                         subscriber_timeout=60)
    for _i in range(20):
        apply(broker, encode(1, 1, b"0123456789" * 3))
    commit_all(broker)
    broker.positions.record(1, 5, "slow")
    broker.positions.record(1, 15, "fast")
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
        apply(broker, encode(1, 1, b"x" * 60) + encode(1, 2, b"y" * 60))
    commit_all(broker)
    first_segment = broker.topic(1).segments()[0]
    heartbeat = first_segment.last_index
    broker.positions.record(1, heartbeat, "reporter")
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


# -- faults: acknowledged means safe ---------------------------------------------------------
#
# Failed and short writes, full disks, failed fsyncs, failed rolls. Faults are injected at the
# system-call boundary (tests/faults.py) under the broker's data directory; every test then
# checks the files, the in-memory state, and what a restart recovers.

Model = dict[int, list[tuple[int, bytes]]]


def publish(broker: Broker, model: Model, topic: int, datas: list[bytes]) -> None:
    """Publish one batch that must succeed, and record it in the model."""
    result = broker.write_group([encode_batch(topic, datas)], durable=True)[0]
    assert not isinstance(result, Exception), result
    model.setdefault(topic, []).extend(zip(range(result.first, result.last + 1), datas,
                                           strict=True))


def kept(broker: Broker) -> Model:
    """Every topic that holds messages, as (index, data) pairs."""
    out: Model = {}
    for topic in broker.topics():
        with topic.reader(topic.first_index) as reader:
            messages, _used = decode(reader.read_all(), after=0)
        out[topic.id] = [(m.index, m.data) for m in messages]
    return {t: m for t, m in out.items() if m}


def assert_files_match_memory(broker: Broker) -> None:
    """Every segment file is exactly as long as what the topic has committed."""
    for topic in broker.topics():
        for segment in topic.segments():
            assert segment.size == segment.committed_size
            assert segment.path.stat().st_size == segment.committed_size, segment.path


def reopen(broker: Broker, path: Path, **options: object) -> Broker:
    broker.close()
    reopened = Broker.open(path, **options)
    for topic in reopened.topics():
        assert topic.stats.recovered_truncated_bytes == 0, "a failed write left a torn tail"
    return reopened


def test_short_write_then_disk_full_keeps_nothing_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path)
    model: Model = {}
    for n in range(5):
        publish(broker, model, 1, [f"before {n}-{k}".encode() for k in range(10)])
    index = broker.index
    with inject(monkeypatch, Faults(tmp_path, write_budget=100)) as faults:
        for attempt in range(50):  # short write, then ENOSPC on every try
            results = broker.write_group(
                [encode_batch(1, [f"lost {attempt}-{k}".encode() for k in range(10)])],
                durable=True)
            assert all(isinstance(r, DiskFullError) and r.status == 507 for r in results)
            assert "disk full" in str(results[0])
            assert broker.index == index
            assert_files_match_memory(broker)
            assert kept(broker) == model  # reads keep working, nothing half-visible
        assert faults.injected >= 50
        faults.heal()
        publish(broker, model, 1, [b"after space came back"])
    assert model[1][-1][0] == index + 1  # the failed groups left no gap and no duplicate
    broker = reopen(broker, tmp_path)
    assert kept(broker) == model
    broker.close()


def test_a_group_failing_in_one_topic_keeps_nothing_in_any(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path)
    model: Model = {}
    publish(broker, model, 1, [b"one"])
    publish(broker, model, 2, [b"two"])
    commands = [encode(1, 1, b"a"), encode(1, 2, b"b"), encode(1, 1, b"c") + encode(1, 3, b"d")]
    topic2 = str(tmp_path / "topics" / "2")
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.startswith(topic2),
                                    write_budget=0, write_errno=errno.EIO)):
        results = broker.write_group(commands, durable=True)
    assert all(isinstance(r, StorageError) and r.status == 500 for r in results)
    assert_files_match_memory(broker)
    assert kept(broker) == model
    publish(broker, model, 2, [b"later"])
    broker = reopen(broker, tmp_path)
    assert kept(broker) == model
    broker.close()


def test_a_failed_roll_in_the_middle_of_a_batch_keeps_none_of_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path, max_segment_size=300)
    model: Model = {}
    publish(broker, model, 1, [b"x" * 100])
    segments = [s.path.name for s in broker.topic(1).segments()]
    batch = [f"batch {k}".encode() * 10 for k in range(10)]  # rolls after about 3 frames
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.endswith(".seg"),
                                    create_failures=1)):
        result = broker.write_group([encode_batch(1, batch)], durable=True)[0]
    assert isinstance(result, StorageError) and "Too many open files" in str(result)
    assert [s.path.name for s in broker.topic(1).segments()] == segments
    assert sorted(p.name for p in (tmp_path / "topics" / "1").glob("*.seg")) == segments
    assert_files_match_memory(broker)
    assert kept(broker) == model
    broker = reopen(broker, tmp_path, max_segment_size=300)
    assert kept(broker) == model
    publish(broker, model, 1, batch)
    assert kept(broker) == model
    broker.close()


def test_a_failed_fsync_stops_the_topic_until_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path)
    model: Model = {}
    publish(broker, model, 1, [b"kept"])
    publish(broker, model, 2, [b"other"])
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.endswith(".seg"),
                                    sync_failures=1)) as faults:
        result = broker.write_group([encode(1, 1, b"never visible")], durable=True)[0]
        assert isinstance(result, StorageFailedError) and result.status == 503
        assert "fsync failed" in str(result) and "restart" in str(result)
        assert faults.sync_failures == 0
        # The disk "works" again, but the pages of the failed fsync may be gone: the topic
        # keeps refusing writes; other topics carry on.
        again = broker.write_group([encode(1, 1, b"refused")], durable=True)[0]
        assert isinstance(again, StorageFailedError)
        publish(broker, model, 2, [b"still fine"])
    assert broker.topic(1).failure is not None
    info = {t["id"]: t for t in broker.diagnostics()["topics"]}
    assert info[1]["writable"] is False and "fsync failed" in info[1]["failure"]
    assert b'messaging_topic_writable{topic="1"} 0.0' in broker.metrics.render()
    assert b'messaging_write_failures_total{reason="stopped"} 1.0' in broker.metrics.render()
    assert_files_match_memory(broker)
    assert kept(broker) == model
    broker = reopen(broker, tmp_path)
    assert kept(broker) == model  # the failed publish never becomes visible
    publish(broker, model, 1, [b"after restart"])
    assert kept(broker) == model
    broker.close()


def test_topics_fsynced_side_by_side_fail_as_one_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group over several topics fsyncs them on several threads; one failed fdatasync
    fails the whole group (nothing of it visible, in memory or on disk), stops that topic
    only, and every other topic's fsync still ran to its end."""
    broker = Broker.open(tmp_path)
    model: Model = {}
    for topic in range(1, 6):
        publish(broker, model, topic, [b"before %d" % topic])
    failing = str(tmp_path / "topics" / "3") + "/"
    synced: list[str] = []
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.startswith(failing),
                                    sync_failures=1)) as faults:
        real = os.fdatasync

        def recording(fd: int) -> None:
            synced.append(threading.current_thread().name)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", recording)
        results = broker.write_group(
            [encode(1, topic, b"group %d" % topic) for topic in range(1, 6)], durable=True)
        assert faults.injected == 1
    assert all(isinstance(result, StorageFailedError) for result in results), results
    # Five topics and the group's journal line: one on this thread, the others beside it.
    here = threading.current_thread().name
    assert len(synced) == 6 and synced.count(here) == 1
    assert all(name.startswith("messaging-fsync") for name in synced if name != here)
    assert broker.topic(3).failure is not None
    assert all(broker.topic(topic).failure is None for topic in (1, 2, 4, 5))
    assert_files_match_memory(broker)
    assert kept(broker) == model
    publish(broker, model, 1, [b"after"])
    broker = reopen(broker, tmp_path)
    assert kept(broker) == model
    broker.close()


def test_a_failed_fsync_during_a_roll_closes_every_descriptor_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with inject(monkeypatch, Faults(tmp_path)) as faults:
        broker = Broker.open(tmp_path, max_segment_size=300)
        model: Model = {}
        publish(broker, model, 1, [b"x" * 200])
        faults.sync_failures = 1  # the rolled-away segment's fdatasync fails
        result = broker.write_group([encode_batch(1, [b"y" * 200] * 4)], durable=True)[0]
        assert isinstance(result, StorageFailedError)
        assert_files_match_memory(broker)
        assert kept(broker) == model
        broker.close()
        assert open_files_under(tmp_path / "topics") == []
        assert all(faults.closed[fd] == count for fd, count in faults.opened.items())
    broker = reopen(Broker.open(tmp_path, max_segment_size=300), tmp_path)
    assert kept(broker) == model
    broker.close()


def test_a_failed_directory_fsync_after_a_roll_is_a_failed_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path, max_segment_size=300)
    model: Model = {}
    publish(broker, model, 1, [b"x" * 200])
    directory = str(tmp_path / "topics" / "1")
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p == directory,
                                    sync_failures=1)):
        result = broker.write_group([encode_batch(1, [b"y" * 200] * 3)], durable=True)[0]
    assert isinstance(result, StorageFailedError)
    assert len(broker.topic(1).segments()) == 1
    assert kept(broker) == model
    broker.close()


def test_interval_mode_fsync_failure_stops_the_topic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path)
    result = broker.write_group([encode(1, 1, b"acknowledged before the fsync")],
                                durable=False)[0]
    assert not isinstance(result, Exception)
    with inject(monkeypatch, Faults(tmp_path, sync_failures=1)), \
            pytest.raises(StorageFailedError):
        broker.sync([1])
    assert isinstance(broker.write_group([encode(1, 1, b"no")], durable=False)[0],
                      StorageFailedError)
    broker.close()


def test_a_failed_fsync_of_the_commit_mark_stops_every_write_until_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal line is every group's commit mark: when its fsync fails the group fails
    (nothing of it visible, before or after a restart) and no topic takes writes until a
    restart re-reads the journal."""
    broker = Broker.open(tmp_path)
    model: Model = {}
    publish(broker, model, 1, [b"kept"])
    publish(broker, model, 2, [b"other"])
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.endswith("catalog.log"),
                                    sync_failures=1)) as faults:
        result = broker.write_group([encode(1, 1, b"never visible")], durable=True)[0]
        assert faults.sync_failures == 0
    assert isinstance(result, StorageFailedError) and result.status == 503
    assert "could not be made durable" in str(result) and "restart" in str(result)
    refused = broker.write_group([encode(2, 1, b"refused")], durable=True)[0]
    assert isinstance(refused, StorageFailedError)
    assert kept(broker) == model
    assert_files_match_memory(broker)
    broker = reopen(broker, tmp_path)
    assert kept(broker) == model
    publish(broker, model, 2, [b"after restart"])
    assert kept(broker) == model
    broker.close()


def test_heartbeats_are_saved_before_they_are_acknowledged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path)
    model: Model = {}
    publish(broker, model, 1, [b"a", b"b", b"c"])
    assert broker.write_group([heartbeat_command(1, 2, "reader")], durable=True) != []
    assert Broker.state(broker)["subscribers"] == {"1": {"reader": 2}}
    with inject(monkeypatch, Faults(tmp_path, match=lambda p: p.endswith("catalog.log"),
                                    write_budget=0)):
        result = broker.write_group([heartbeat_command(1, 3, "reader"),
                                     encode(1, 1, b"in the same group")], durable=True)
    assert all(isinstance(r, DiskFullError) for r in result)
    assert broker.subscribers(1) == {"reader": 2}  # not moved by a failed heartbeat
    assert kept(broker) == model  # nor was the publish that shared its group kept
    assert list(tmp_path.glob("broker.json.*")) == []  # no temporary file left behind
    broker.close()  # a kill -9 here keeps the same: the 200 came after the save
    reopened = Broker.open(tmp_path)
    assert reopened.subscribers(1) == {"reader": 2}
    reopened.close()


def test_concurrent_state_saves_never_collide(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    errors: list[BaseException] = []

    def save() -> None:
        for _ in range(300):
            try:
                broker.save_state(durable=False)
            except BaseException as err:
                errors.append(err)

    threads = [threading.Thread(target=save) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert list(tmp_path.glob("broker.json.*")) == []
    broker.close()


def test_close_waits_for_a_retention_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         ) -> None:
    broker = Broker.open(tmp_path, max_segment_size=100, max_topic_size=100)
    model: Model = {}
    for n in range(5):
        publish(broker, model, 1, [b"z" * 100, f"{n}".encode()])
    started, release = threading.Event(), threading.Event()
    truncate = Topic.truncate

    def slow_truncate(topic: Topic, max_size: int, floor: int,
                      older_than: int | None = None) -> int:
        started.set()
        assert release.wait(10)
        return truncate(topic, max_size, floor, older_than)

    monkeypatch.setattr(Topic, "truncate", slow_truncate)
    retention = threading.Thread(target=broker.enforce_retention)
    retention.start()
    assert started.wait(10)
    closer = threading.Thread(target=broker.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # still waiting for the retention run
    release.set()
    retention.join(10)
    closer.join(10)
    assert not closer.is_alive()
    assert broker.enforce_retention() == 0  # after close: nothing runs


def test_a_broker_on_a_full_disk_starts_without_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path)
    model: Model = {}
    publish(broker, model, 1, [b"a"])
    broker.close()
    with inject(monkeypatch, Faults(tmp_path, write_budget=0, create_failures=100,
                                    create_errno=errno.ENOSPC)):
        reopened = Broker.open(tmp_path)
        assert kept(reopened) == model
        result = reopened.write_group([encode(1, 1, b"b")], durable=True)[0]
        assert isinstance(result, DiskFullError)
        reopened.close()


# -- the open-file budget -------------------------------------------------------------------


def test_groups_never_hold_more_write_files_than_the_budget(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    """Files other topics still hold are closed before a group opens its own, in slices too."""
    budget = 8
    broker = Broker.open(tmp_path, max_open_files=budget)
    peak = 0
    write = Topic.write

    def counting_write(topic: Topic) -> None:
        nonlocal peak
        write(topic)
        peak = max(peak, sum(t.holds_file for t in broker.topics()))

    monkeypatch.setattr(Topic, "write", counting_write)
    rng = random.Random(budget)
    model: dict[int, list[Message]] = {}
    try:
        for _ in range(40):
            topics = rng.sample(range(1, 41), rng.choice([1, 3, budget, 3 * budget]))
            command = b"".join(encode(1, topic, b"%d" % topic) for topic in topics)
            result = broker.write_group([command], durable=True)[0]
            assert isinstance(result, ApplyResult)
            for k, topic in enumerate(topics):
                model.setdefault(topic, []).append(Message(result.first + k, 1, topic,
                                                           b"%d" % topic))
            assert peak <= budget
        for topic, messages in model.items():
            assert broker.topic(topic).reader(0).read_all() == encode_many(messages)
    finally:
        broker.close()
