"""Idempotent producers of native topics in the state journal: a group journals only the
producers it changed, however many the topic has seen, and a reopened broker (journal
replayed) holds exactly the tables the live one held, also after commands of a group that
failed in the middle of it, and after a deletion forgot a table."""

from __future__ import annotations

import json
from pathlib import Path

from messaging.broker.broker import Broker
from messaging.broker.commands import (
    ApplyResult,
    append_stream,
    configure_command,
    create_stream,
    delete_command,
    delete_stream,
    produce,
)
from messaging.broker.producers import MAX_PRODUCERS, PRODUCER_TTL, Producer, expired_producers
from messaging.broker.topic_settings import MAX_MESSAGE_SIZE
from messaging.errors import MessageTooLargeError, ProducerSequenceGapError
from messaging.frames import encode

TOPIC = 3
NOW = 1_800_000_000.0


def _produce(pid: str, seq: int, data: bytes = b"m", *, epoch: int = 0,
             now: float = NOW) -> bytes:
    return produce(TOPIC, (pid, epoch, seq), now, encode(1, TOPIC, data))


def _tables(broker: Broker) -> dict[str, tuple[int, int, int, int]]:
    return {pid: (s.epoch, s.seq, s.first, s.last)
            for pid, s in broker.catalog.producers(TOPIC).items()}


def _last_line(data: Path) -> dict[str, object]:
    lines = (data / "catalog.log").read_text().splitlines()
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def test_a_publish_journals_its_own_producer_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = Broker.open(data)
    try:
        for group in range(10):  # 500 producers, 50 per group
            results = broker.write_group([_produce(f"p{group}.{k}", 0) for k in range(50)],
                                         durable=True)
            assert all(isinstance(r, ApplyResult) for r in results)
        assert len(broker.catalog.producers(TOPIC)) == 500
        size = (data / "catalog.log").stat().st_size
        broker.write_group([_produce("p3.7", 1, b"again")], durable=True)
        line = _last_line(data)
        grown = (data / "catalog.log").stat().st_size - size
        live = _tables(broker)
    finally:
        broker.close()
    changes = line["changes"]
    assert isinstance(changes, dict)
    assert changes["producers"] == {str(TOPIC): {"p3.7": [0, 1, NOW, 501, 501]}}
    assert changes["native"] == {}
    assert grown < 400, f"one publish journaled {grown} bytes"
    reopened = Broker.open(data)
    try:
        assert _tables(reopened) == live
        duplicate = reopened.write_group([_produce("p3.7", 1, b"again")], durable=True)[0]
        assert isinstance(duplicate, ApplyResult) and duplicate.count == 0
    finally:
        reopened.close()


def test_a_group_with_failed_commands_journals_what_stayed(tmp_path: Path) -> None:
    """In one group: accepted publishes, a gap (refused before anything changed), one whose
    producer was staged and then undone (its message is over the topic's limit), and a
    producer that moved twice; the line and a replay agree with the live tables."""
    data = tmp_path / "data"
    broker = Broker.open(data)
    try:
        broker.write_group([configure_command(TOPIC, {MAX_MESSAGE_SIZE: 8})], durable=True)
        broker.write_group([_produce("a", 0), _produce("b", 0)], durable=True)
        results = broker.write_group([
            _produce("a", 1),
            _produce("c", 5),  # a gap: refused
            _produce("b", 1, b"far too long for the limit"),  # staged, then undone
            _produce("d", 0),
            _produce("a", 2),
        ], durable=True)
        assert [type(r) for r in results] == [ApplyResult, ProducerSequenceGapError,
                                            MessageTooLargeError, ApplyResult, ApplyResult]
        live = _tables(broker)
        line = _last_line(data)
    finally:
        broker.close()
    assert live["a"][:2] == (0, 2) and live["b"][:2] == (0, 0) and live["d"][:2] == (0, 0)
    assert "c" not in live
    changes = line["changes"]
    assert isinstance(changes, dict)
    assert sorted(changes["producers"][str(TOPIC)]) == ["a", "d"]
    reopened = Broker.open(data)
    try:
        assert _tables(reopened) == live
    finally:
        reopened.close()


def test_a_deletion_forgets_the_table_in_the_journal(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = Broker.open(data)
    try:
        broker.write_group([_produce("a", 0), _produce("b", 0)], durable=True)
        broker.write_group([delete_command(TOPIC)], durable=True)
        line = _last_line(data)
        broker.write_group([_produce("b", 0, b"new life")], durable=True)
        live = _tables(broker)
    finally:
        broker.close()
    changes = line["changes"]
    assert isinstance(changes, dict)
    assert changes["native"] == {str(TOPIC): {}}
    assert list(live) == ["b"]
    reopened = Broker.open(data)
    try:
        assert _tables(reopened) == live
    finally:
        reopened.close()


def test_the_oldest_beyond_the_limit_go_by_age_then_id() -> None:
    """Equally old producers beyond MAX_PRODUCERS are cut by id, whatever order the table
    was built in: a node that rebuilt it from its journal cuts the same ones as its peers."""
    states = {f"p{k:05d}": Producer(0, 0, NOW) for k in range(MAX_PRODUCERS + 3)}
    forward = dict(states)
    backward = dict(reversed(list(states.items())))
    assert expired_producers(forward, NOW) == expired_producers(backward, NOW) == [
        "p00000", "p00001", "p00002"]
    older = dict(forward)
    older["p09999"] = Producer(0, 0, NOW - 1)
    assert expired_producers(older, NOW)[0] == "p09999"


def test_producers_expire_after_the_ttl_as_a_full_scan_finds(tmp_path: Path) -> None:
    """Producers unused for PRODUCER_TTL go when a later publish finds them, also when
    their removal was undone once with a failed command, and the journal says so."""
    data = tmp_path / "data"
    broker = Broker.open(data)
    day = 24 * 3600.0
    try:
        broker.write_group([configure_command(TOPIC, {MAX_MESSAGE_SIZE: 8})], durable=True)
        for k in range(5):  # a, b, c, d, e: one a day
            broker.write_group([_produce(chr(97 + k), 0, now=NOW + k * day)], durable=True)
        # A week and a half after a's day: a, b and c expire, d and e stay. The first try
        # fails on its message size after the expiry was staged: nothing of it stays.
        late = NOW + PRODUCER_TTL + 2.5 * day
        failed = broker.write_group([_produce("f", 0, b"far too long for it", now=late)],
                                    durable=True)[0]
        assert isinstance(failed, MessageTooLargeError)
        assert sorted(_tables(broker)) == ["a", "b", "c", "d", "e"]
        ok = broker.write_group([_produce("f", 0, now=late)], durable=True)[0]
        assert isinstance(ok, ApplyResult)
        assert sorted(_tables(broker)) == ["d", "e", "f"]
        changes = _last_line(data)["changes"]
        assert isinstance(changes, dict)
        assert changes["producers"][str(TOPIC)] == {
            "a": None, "b": None, "c": None, "f": [0, 0, late, 6, 6]}
        # Nothing more is due: the next publishes find nothing to drop.
        broker.write_group([_produce("f", 1, now=late + 1)], durable=True)
        assert sorted(_tables(broker)) == ["d", "e", "f"]
        live = _tables(broker)
    finally:
        broker.close()
    reopened = Broker.open(data)
    try:
        assert _tables(reopened) == live
        # A day later d expires too, found after the replay as well.
        reopened.write_group([_produce("f", 2, now=late + 1.5 * day)], durable=True)
        assert sorted(_tables(reopened)) == ["e", "f"]
    finally:
        reopened.close()


# -- streams' producers ---------------------------------------------------------------------

def _stream_producers(broker: Broker, name: str) -> dict[str, tuple[int, int, int, int]]:
    stream = broker.catalog.get(name)
    assert stream is not None
    return {pid: (s.epoch, s.seq, s.first, s.last) for pid, s in stream.producers.items()}


def _append(name: str, data: bytes, producer: tuple[str, int, int] | None = None,
            now: float = NOW) -> bytes:
    return append_stream(name, now=now, messages=[data], producer=producer)


def test_a_stream_append_journals_only_what_it_changed(tmp_path: Path) -> None:
    """A stream that has seen 300 producers: an append with a producer journals that one
    producer, one without journals none; a group with a failed append journals what
    stayed; the replay holds exactly the live table."""
    data = tmp_path / "data"
    broker = Broker.open(data)
    try:
        assert isinstance(broker.write_group([create_stream("s", content_type=None, now=NOW)],
                                             durable=True)[0], ApplyResult)
        for group in range(6):
            results = broker.write_group([_append("s", b"m", (f"p{group}.{k}", 0, 0))
                                          for k in range(50)], durable=True)
            assert all(isinstance(r, ApplyResult) for r in results)
        before = (data / "catalog.log").stat().st_size
        broker.write_group([_append("s", b"plain")], durable=True)
        plain = _last_line(data)
        results = broker.write_group([
            _append("s", b"again", ("p2.3", 0, 1)),
            _append("s", b"gap", ("p2.4", 0, 7)),  # refused
            _append("s", b"new", ("q", 0, 0)),
        ], durable=True)
        assert [type(r) for r in results] == [ApplyResult, ProducerSequenceGapError,
                                            ApplyResult]
        mixed = _last_line(data)
        grown = (data / "catalog.log").stat().st_size - before
        live = _stream_producers(broker, "s")
    finally:
        broker.close()
    assert grown < 1500, f"two groups journaled {grown} bytes"
    changes = plain["changes"]
    assert isinstance(changes, dict)
    assert "stream_producers" not in changes and "producers" not in changes["streams"]["s"]
    changes = mixed["changes"]
    assert isinstance(changes, dict)
    assert sorted(changes["stream_producers"]["s"]) == ["p2.3", "q"]
    assert len(live) == 301 and live["p2.3"][:2] == (0, 1) and live["q"][:2] == (0, 0)
    reopened = Broker.open(data)
    try:
        assert _stream_producers(reopened, "s") == live
        duplicate = reopened.write_group([_append("s", b"new", ("q", 0, 0))], durable=True)[0]
        assert isinstance(duplicate, ApplyResult)
        assert duplicate.stream is not None and duplicate.stream.duplicate
    finally:
        reopened.close()


def test_a_stream_created_again_journals_its_new_producers_whole(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = Broker.open(data)
    try:
        broker.write_group([create_stream("s", content_type=None, now=NOW)], durable=True)
        broker.write_group([_append("s", b"a", ("old", 0, 0))], durable=True)
        broker.write_group([delete_stream("s")], durable=True)
        broker.write_group([create_stream("s", content_type=None, now=NOW),
                            _append("s", b"b", ("new", 0, 0))], durable=True)
        live = _stream_producers(broker, "s")
    finally:
        broker.close()
    assert list(live) == ["new"]
    reopened = Broker.open(data)
    try:
        assert _stream_producers(reopened, "s") == live
    finally:
        reopened.close()
