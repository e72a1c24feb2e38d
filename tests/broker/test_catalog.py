"""The catalog of named topics (streams) as a state machine, driven through the Broker.

Every test writes real commands (:func:`messaging.broker.catalog.stream_command` followed by the
frames an append carries) with ``Broker.write_group(..., durable=True)``: the decisions of the
catalog (create, append with producer headers, ``Stream-Seq``, close, delete, forks and their
garbage collection) are checked on the outcome, on what the stream then holds, and on the files
in the data directory; a failed group must leave the catalog as it was; the catalog must survive
closing and reopening the broker; frames a crash left beyond the catalog's tail are cut at open.

A Hypothesis state machine checks idempotent producers against a model of the protocol's
validation logic (PROTOCOL.md §5.2.1), closing and reopening the broker in the middle.
"""

from __future__ import annotations

import copy
import errno
import io
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from messaging.broker import snapshot as snapshot_format
from messaging.broker import stream_reads
from messaging.broker.broker import ApplyResult, Broker
from messaging.broker.catalog import (
    APPEND_END,
    CONTINUED,
    Catalog,
    StreamOutcome,
    stream_command,
    token,
)
from messaging.broker.commands import heartbeat_command
from messaging.broker.producers import PRODUCER_TTL
from messaging.broker.state_log import CatalogLog
from messaging.errors import (
    BadRequestError,
    DiskFullError,
    MessagingError,
    ProducerFencedError,
    ProducerSequenceGapError,
    StorageError,
    StreamClosedError,
    StreamConflictError,
    StreamGoneError,
    StreamNotFoundError,
)
from messaging.frames import encode
from messaging.placement import NAMED_TOPIC_BASE
from messaging.topic.topic import Topic
from tests.examples import examples
from tests.faults import Faults, inject

#: The clock every command carries (producer state is dropped after 7 days of it).
NOW = 1_700_000_000.0
OCTET = "application/octet-stream"


# -- helpers (tests/broker/test_stream_reads.py uses them too) -------------------------------------


def frames_of(messages: Sequence[bytes]) -> bytes:
    """The frames of one append: every message but the last is CONTINUED (as the HTTP layer
    builds them)."""
    last = len(messages) - 1
    return b"".join(encode(APPEND_END if i == last else CONTINUED, 0, m)
                    for i, m in enumerate(messages))


def pieces(body: bytes, size: int) -> list[bytes]:
    """A body cut into messages of at most ``size`` bytes (an append over the message size)."""
    return [body[i:i + size] for i in range(0, len(body), size)]


def run(broker: Broker, op: dict[str, Any], messages: Sequence[bytes] = (), *,
        durable: bool = True) -> ApplyResult | MessagingError:
    """Apply one stream command as its own group (fsynced when ``durable``); its result or
    its error."""
    command = stream_command({"now": NOW, **op}, frames_of(messages))
    return broker.write_group([command], durable=durable)[0]


def ok(result: ApplyResult | MessagingError) -> StreamOutcome:
    """The outcome of a command that must have applied."""
    assert isinstance(result, ApplyResult), f"expected success, got {result!r}"
    assert result.stream is not None
    return result.stream


def create(broker: Broker, name: str, content_type: str | None = OCTET,
           messages: Sequence[bytes] = (), **extra: Any) -> StreamOutcome:
    """Create a stream (or a fork, with ``fork={...}``) that must not exist yet."""
    outcome = ok(run(broker, {"op": "create", "name": name, "content_type": content_type,
                              **extra}, messages))
    assert outcome.created
    return outcome


def fork_op(source: str, at: tuple[int, int], sub: int = 0,
            offset: str | None = None) -> dict[str, Any]:
    """The ``fork`` part of a create command (``at`` already resolved)."""
    return {"source": source, "at": list(at), "offset": offset, "sub": sub}


def append(broker: Broker, name: str, *messages: bytes,
           producer: tuple[str, int, int] | None = None, seq: str | None = None,
           close: bool = False, content_type: str | None = OCTET, durable: bool = True,
           ) -> ApplyResult | MessagingError:
    """An append (of one HTTP request's messages) and/or a close."""
    op: dict[str, Any] = {"op": "append", "name": name, "close": close,
                          "count": len(messages)}
    if messages:
        op["content_type"] = content_type
    if producer is not None:
        op["producer"] = list(producer)
    if seq is not None:
        op["seq"] = seq
    return run(broker, op, messages, durable=durable)


def delete(broker: Broker, name: str) -> ApplyResult | MessagingError:
    """A DELETE of a stream."""
    return run(broker, {"op": "delete", "name": name})


def items(broker: Broker, name: str, after: tuple[int, int] = (0, 0),
          limit: int = stream_reads.READ_LIMIT) -> list[stream_reads.Item]:
    """The committed stream's messages after ``after`` (one read)."""
    stream = broker.catalog.streams[name]
    return stream_reads.read(broker, broker.catalog, stream, after, limit)


def content(broker: Broker, name: str) -> list[bytes]:
    """Every message the stream holds, read through its fork lineage."""
    return [item.data for item in items(broker, name)]


def topic_dir(broker: Broker, topic_id: int) -> Path:
    """Where a topic's segment files live."""
    return broker.path / "topics" / str(topic_id)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker on a fresh data directory, closed at the end."""
    opened = Broker.open(tmp_path / "data")
    yield opened
    opened.close()


def reopen(broker: Broker) -> Broker:
    """Close the broker and open its data directory again."""
    broker.close()
    return Broker.open(broker.path)


# -- create -------------------------------------------------------------------------------------


def test_create_is_idempotent_and_conflicts_on_another_configuration(broker: Broker) -> None:
    first = create(broker, "s", "text/plain", [b"initial"], ttl=60)
    assert first.created and first.content_type == "text/plain"
    stream = broker.catalog.streams["s"]
    assert stream.topic >= NAMED_TOPIC_BASE and stream.ttl == 60
    assert broker.catalog.name_of(stream.topic) == "s"
    index = broker.index

    # The same configuration again (media type parameters and case do not count): 200, and a
    # body it carries is not appended a second time.
    again = ok(run(broker, {"op": "create", "name": "s", "content_type": "Text/Plain; x=1",
                            "ttl": 60}, [b"initial"]))
    assert not again.created and not again.duplicate
    assert again.tail == stream.tail
    assert broker.index == index
    assert content(broker, "s") == [b"initial"]

    for other in ({"content_type": "application/json", "ttl": 60},
                  {"content_type": "text/plain", "ttl": 61},
                  {"content_type": "text/plain"},
                  {"content_type": "text/plain", "ttl": 60, "closed": True}):
        error = run(broker, {"op": "create", "name": "s", **other})
        assert isinstance(error, StreamConflictError), other
        assert error.status == 409
    assert broker.catalog.streams["s"] == stream  # unchanged
    assert broker.index == index


def test_create_closed_and_repeated_create_compares_closure(broker: Broker) -> None:
    outcome = create(broker, "done", OCTET, [b"final"], closed=True)
    assert outcome.closed
    assert content(broker, "done") == [b"final"]
    assert ok(run(broker, {"op": "create", "name": "done", "content_type": OCTET,
                           "closed": True})).created is False
    error = run(broker, {"op": "create", "name": "done", "content_type": OCTET})
    assert isinstance(error, StreamConflictError)
    # An open stream is not "the same" as a create that asks for a closed one either.
    create(broker, "open", OCTET)
    assert isinstance(run(broker, {"op": "create", "name": "open", "content_type": OCTET,
                                   "closed": True}), StreamConflictError)


def test_streams_get_distinct_topics_in_the_named_range(broker: Broker) -> None:
    for name in ("a", "b", "c"):
        create(broker, name, messages=[name.encode()])
    topics = {broker.catalog.streams[n].topic for n in ("a", "b", "c")}
    assert len(topics) == 3 and min(topics) >= NAMED_TOPIC_BASE
    for name in ("a", "b", "c"):
        assert content(broker, name) == [name.encode()]
    assert isinstance(append(broker, "missing", b"x"), StreamNotFoundError)


# -- producers ----------------------------------------------------------------------------------


def test_producer_validation(broker: Broker) -> None:
    create(broker, "s")

    # A producer the stream does not know must start at seq 0.
    gap = append(broker, "s", b"early", producer=("p", 0, 1))
    assert isinstance(gap, ProducerSequenceGapError) and gap.status == 409
    assert (gap.expected, gap.received) == (0, 1)
    assert gap.headers() == {"Producer-Expected-Seq": "0", "Producer-Received-Seq": "1"}
    assert content(broker, "s") == []
    assert broker.catalog.streams["s"].producers == {}

    first = ok(append(broker, "s", b"m0", producer=("p", 0, 0)))
    assert first.producer == (0, 0) and not first.duplicate
    assert ok(append(broker, "s", b"m1", producer=("p", 0, 1))).producer == (0, 1)

    # Retries of seq 1 (the last) and of seq 0 (older) are duplicates: nothing stored.
    index, tail = broker.index, broker.catalog.streams["s"].tail
    for retry in (1, 0, 1):
        result = append(broker, "s", b"retry", producer=("p", 0, retry))
        outcome = ok(result)
        assert outcome.duplicate and outcome.producer == (0, 1)
        assert isinstance(result, ApplyResult) and result.count == 0
    assert broker.index == index and broker.catalog.streams["s"].tail == tail
    assert content(broker, "s") == [b"m0", b"m1"]

    # A gap in the same epoch: 409 with what was expected and what came.
    gap = append(broker, "s", b"m3", producer=("p", 0, 3))
    assert isinstance(gap, ProducerSequenceGapError)
    assert gap.headers() == {"Producer-Expected-Seq": "2", "Producer-Received-Seq": "3"}

    # A new epoch must start at 0 (400), then fences the old one (403 with the epoch).
    bad = append(broker, "s", b"e1", producer=("p", 1, 5))
    assert isinstance(bad, BadRequestError) and bad.status == 400
    assert ok(append(broker, "s", b"e1s0", producer=("p", 1, 0))).producer == (1, 0)
    for zombie_seq in (0, 2, 9):
        fenced = append(broker, "s", b"zombie", producer=("p", 0, zombie_seq))
        assert isinstance(fenced, ProducerFencedError) and fenced.status == 403
        assert fenced.epoch == 1 and fenced.headers() == {"Producer-Epoch": "1"}
    assert ok(append(broker, "s", b"e1s1", producer=("p", 1, 1))).producer == (1, 1)

    # Another producer has its own sequence; producer state is per stream.
    assert ok(append(broker, "s", b"q0", producer=("q", 7, 0))).producer == (7, 0)
    create(broker, "t")
    assert ok(append(broker, "t", b"other", producer=("p", 0, 0))).producer == (0, 0)

    assert content(broker, "s") == [b"m0", b"m1", b"e1s0", b"e1s1", b"q0"]
    producers = broker.catalog.streams["s"].producers
    assert {pid: (p.epoch, p.seq) for pid, p in producers.items()} == {"p": (1, 1),
                                                                       "q": (7, 0)}


def test_producer_state_is_forgotten_after_the_ttl(broker: Broker) -> None:
    create(broker, "s")
    ok(append(broker, "s", b"a", producer=("p", 3, 0)))
    ok(run(broker, {"op": "append", "name": "s", "count": 1, "content_type": OCTET,
                    "producer": ["p", 3, 1], "now": NOW + PRODUCER_TTL - 1}, [b"b"]))
    # Used again within the TTL of its last use: still known (a zombie is still fenced).
    later = NOW + PRODUCER_TTL + 10
    fenced = run(broker, {"op": "append", "name": "s", "count": 1, "content_type": OCTET,
                          "producer": ["p", 0, 0], "now": later}, [b"zombie"])
    assert isinstance(fenced, ProducerFencedError)
    # Unused for longer than the TTL (by the clock the commands carry): a new producer.
    forgotten = NOW + 2 * PRODUCER_TTL + 10
    gap = run(broker, {"op": "append", "name": "s", "count": 1, "content_type": OCTET,
                       "producer": ["p", 3, 2], "now": forgotten}, [b"c"])
    assert isinstance(gap, ProducerSequenceGapError) and gap.expected == 0
    outcome = ok(run(broker, {"op": "append", "name": "s", "count": 1,
                              "content_type": OCTET, "producer": ["p", 0, 0],
                              "now": forgotten}, [b"fresh"]))
    assert outcome.producer == (0, 0) and not outcome.duplicate
    assert content(broker, "s") == [b"a", b"b", b"fresh"]


def test_stream_seq_must_increase(broker: Broker) -> None:
    create(broker, "s")
    assert ok(append(broker, "s", b"1", seq="b"))
    for stale in ("b", "a", "B", "0999"):
        error = append(broker, "s", b"stale", seq=stale)
        assert isinstance(error, StreamConflictError) and error.status == 409, stale
    assert ok(append(broker, "s", b"2", seq="ba"))
    assert ok(append(broker, "s", b"3", seq="c"))
    assert ok(append(broker, "s", b"4"))  # Stream-Seq is optional on each append
    assert isinstance(append(broker, "s", b"stale", seq="bz"), StreamConflictError)
    assert content(broker, "s") == [b"1", b"2", b"3", b"4"]
    assert broker.catalog.streams["s"].seq == "c"


def test_content_type_of_an_append_must_match(broker: Broker) -> None:
    create(broker, "s", "text/plain")
    assert ok(append(broker, "s", b"a", content_type="text/plain; charset=utf-8"))
    error = append(broker, "s", b"b", content_type="application/json")
    assert isinstance(error, StreamConflictError)
    assert content(broker, "s") == [b"a"]


# -- close --------------------------------------------------------------------------------------


def test_closed_stream_refuses_appends(broker: Broker) -> None:
    create(broker, "s")
    closing = ok(append(broker, "s", b"last", close=True))
    assert closing.closed
    tail = broker.catalog.streams["s"].tail
    assert tail == closing.tail and tail[0] > 0

    error = append(broker, "s", b"more")
    assert isinstance(error, StreamClosedError) and error.status == 409
    assert error.headers() == {"Stream-Closed": "true", "Stream-Next-Offset": token(tail)}
    # Append-and-close to a closed stream is not idempotent without producer headers...
    assert isinstance(append(broker, "s", b"more", close=True), StreamClosedError)
    # ...close-only is.
    again = ok(append(broker, "s", close=True))
    assert again.closed and again.tail == tail
    assert content(broker, "s") == [b"last"]


def test_closed_is_reported_before_other_conflicts(broker: Broker) -> None:
    create(broker, "s", "text/plain")
    ok(append(broker, "s", b"a", seq="5", content_type="text/plain", close=True))
    for attempt in (append(broker, "s", b"x", content_type="application/json"),
                    append(broker, "s", b"x", content_type="text/plain", seq="1"),
                    append(broker, "s", b"x", content_type="text/plain",
                           producer=("p", 0, 7))):
        assert isinstance(attempt, StreamClosedError), attempt


def test_close_only_of_an_open_stream_appends_nothing(broker: Broker) -> None:
    create(broker, "s", messages=[b"x"])
    tail = broker.catalog.streams["s"].tail
    outcome = ok(append(broker, "s", close=True))
    assert outcome.closed and outcome.tail == tail
    assert broker.catalog.streams["s"].closed


def test_close_by_a_producer_is_deduplicated(broker: Broker) -> None:
    create(broker, "s")
    assert ok(append(broker, "s", b"a", producer=("p", 0, 0))).producer == (0, 0)
    closing = ok(append(broker, "s", b"final", producer=("p", 0, 1), close=True))
    assert closing.closed and closing.producer == (0, 1)
    index = broker.index

    # The very request that closed the stream, retried: a duplicate success.
    retry = ok(append(broker, "s", b"final", producer=("p", 0, 1), close=True))
    assert retry.duplicate and retry.closed and retry.producer == (0, 1)
    assert broker.index == index
    # Anything else from that producer (or another) is refused as closed.
    for producer in (("p", 0, 2), ("p", 0, 0), ("p", 1, 0), ("q", 0, 0)):
        error = append(broker, "s", b"late", producer=producer)
        assert isinstance(error, StreamClosedError), producer
    assert content(broker, "s") == [b"a", b"final"]
    assert broker.catalog.streams["s"].closed_by == ("p", 0, 1)


# -- delete, forks, garbage collection ----------------------------------------------------------


def test_delete_without_forks_removes_stream_and_files(broker: Broker) -> None:
    create(broker, "s", messages=[b"data"])
    topic = broker.catalog.streams["s"].topic
    assert topic_dir(broker, topic).is_dir()
    assert ok(delete(broker, "s"))
    assert "s" not in broker.catalog.streams and broker.catalog.name_of(topic) is None
    assert not topic_dir(broker, topic).exists()
    assert broker.topic(topic) is None
    assert isinstance(delete(broker, "s"), StreamNotFoundError)
    # The name can be used again, for a new, empty stream on another topic.
    create(broker, "s", "text/plain")
    assert content(broker, "s") == []
    assert broker.catalog.streams["s"].topic != topic


def test_delete_with_forks_soft_deletes_and_last_fork_collects(broker: Broker) -> None:
    create(broker, "src", messages=[b"a"])
    ok(append(broker, "src", b"b"))
    source = broker.catalog.streams["src"]
    create(broker, "f1", fork=fork_op("src", source.tail))
    create(broker, "f2", fork=fork_op("src", source.tail))
    ok(append(broker, "f1", b"f1-own"))
    assert broker.catalog.streams["src"].forks == 2

    assert ok(delete(broker, "src"))
    gone = broker.catalog.streams["src"]
    assert gone.deleted and gone.forks == 2
    assert topic_dir(broker, gone.topic).is_dir()
    # 410 to its own writers and deleters, 409 to re-creation and to new forks.
    assert isinstance(append(broker, "src", b"x"), StreamGoneError)
    assert StreamGoneError("").status == 410
    assert isinstance(delete(broker, "src"), StreamGoneError)
    assert isinstance(run(broker, {"op": "create", "name": "src", "content_type": OCTET}),
                      StreamConflictError)
    assert isinstance(run(broker, {"op": "create", "name": "f3", "content_type": OCTET,
                                   "fork": fork_op("src", (0, 0))}), StreamConflictError)
    # Forks still read through it.
    assert content(broker, "f1") == [b"a", b"b", b"f1-own"]
    assert content(broker, "f2") == [b"a", b"b"]

    assert ok(delete(broker, "f1"))
    assert broker.catalog.streams["src"].forks == 1
    assert topic_dir(broker, gone.topic).is_dir()
    assert ok(delete(broker, "f2"))
    assert "src" not in broker.catalog.streams
    assert not topic_dir(broker, gone.topic).exists()
    assert sorted(broker.catalog.streams) == []
    # Collected: the name is free again.
    create(broker, "src")


def test_garbage_collection_cascades_through_a_chain(broker: Broker) -> None:
    create(broker, "a", messages=[b"1"])
    create(broker, "b", fork=fork_op("a", broker.catalog.streams["a"].tail))
    ok(append(broker, "b", b"2"))
    create(broker, "c", fork=fork_op("b", broker.catalog.streams["b"].tail))
    ok(append(broker, "c", b"3"))
    topics = {n: broker.catalog.streams[n].topic for n in "abc"}
    assert content(broker, "c") == [b"1", b"2", b"3"]

    ok(delete(broker, "a"))
    ok(delete(broker, "b"))
    assert broker.catalog.streams["a"].deleted and broker.catalog.streams["b"].deleted
    assert content(broker, "c") == [b"1", b"2", b"3"]
    assert all(topic_dir(broker, t).is_dir() for t in topics.values())

    broker = reopen(broker)  # soft-deletion is durable
    try:
        assert broker.catalog.streams["b"].deleted
        assert content(broker, "c") == [b"1", b"2", b"3"]
        ok(delete(broker, "c"))
        assert broker.catalog.streams == {}
        assert not any(topic_dir(broker, t).exists() for t in topics.values())
    finally:
        broker.close()


def test_deleting_a_fork_first_leaves_the_source(broker: Broker) -> None:
    create(broker, "src", messages=[b"a"])
    create(broker, "f", fork=fork_op("src", broker.catalog.streams["src"].tail))
    ok(delete(broker, "f"))
    source = broker.catalog.streams["src"]
    assert source.forks == 0 and not source.deleted
    assert content(broker, "src") == [b"a"]
    ok(delete(broker, "src"))
    assert not topic_dir(broker, source.topic).exists()


def test_fork_errors(broker: Broker) -> None:
    create(broker, "src", "text/plain", [b"abc"])
    tail = broker.catalog.streams["src"].tail
    missing = run(broker, {"op": "create", "name": "f", "fork": fork_op("nope", (0, 0))})
    assert isinstance(missing, StreamNotFoundError) and missing.status == 404
    beyond = run(broker, {"op": "create", "name": "f", "fork": fork_op("src", (tail[0] + 1, 0))})
    assert isinstance(beyond, BadRequestError)
    other_type = run(broker, {"op": "create", "name": "f", "content_type": "application/json",
                              "fork": fork_op("src", tail)})
    assert isinstance(other_type, StreamConflictError)
    assert "f" not in broker.catalog.streams
    assert broker.catalog.streams["src"].forks == 0

    # Inherits the content type and expiry; idempotent on the same fork, 409 on another.
    create(broker, "f", None, fork=fork_op("src", tail, offset=token(tail)))
    fork = broker.catalog.streams["f"]
    assert fork.content_type == "text/plain" and fork.tail == tail
    assert not ok(run(broker, {"op": "create", "name": "f",
                               "fork": fork_op("src", tail, offset=token(tail))})).created
    assert isinstance(run(broker, {"op": "create", "name": "f",
                                   "fork": fork_op("src", (0, 0), offset=token((0, 0)))}),
                      StreamConflictError)
    assert broker.catalog.streams["src"].forks == 1


def test_fork_of_a_closed_source_is_open_and_inherits_expiry(broker: Broker) -> None:
    create(broker, "src", "text/plain", [b"abc"], ttl=600, closed=True)
    source = broker.catalog.streams["src"]
    create(broker, "f", None, fork=fork_op("src", source.tail))
    fork = broker.catalog.streams["f"]
    assert not fork.closed and fork.ttl == 600 and fork.content_type == "text/plain"
    assert ok(append(broker, "f", b"def", content_type="text/plain")).tail > source.tail
    assert content(broker, "f") == [b"abc", b"def"]
    create(broker, "g", None, ttl=5, fork=fork_op("src", source.tail))
    assert broker.catalog.streams["g"].ttl == 5
    create(broker, "h", None, expires_at="2100-01-01T00:00:00Z", expires=4102444800.0,
           fork=fork_op("src", source.tail))
    assert (broker.catalog.streams["h"].ttl, broker.catalog.streams["h"].expires) == (
        None, 4102444800.0)


def test_forks_do_not_inherit_producer_or_seq_state(broker: Broker) -> None:
    create(broker, "src")
    ok(append(broker, "src", b"a", producer=("p", 3, 0), seq="m"))
    create(broker, "f", fork=fork_op("src", broker.catalog.streams["src"].tail))
    # Epoch 0 would be fenced and seq "a" refused on the source; the fork starts afresh.
    assert ok(append(broker, "f", b"b", producer=("p", 0, 0), seq="a")).producer == (0, 0)
    assert content(broker, "f") == [b"a", b"b"]
    assert isinstance(append(broker, "src", b"x", producer=("p", 0, 1)), ProducerFencedError)


# -- failed groups ------------------------------------------------------------------------------


def test_failed_save_rolls_the_catalog_back(broker: Broker,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    create(broker, "s")
    ok(append(broker, "s", b"m0", producer=("p", 0, 0)))
    before = copy.deepcopy(broker.catalog.streams)
    index = broker.index

    def fail(self: object, *args: object, durable: bool = True) -> None:
        raise OSError(errno.EIO, "injected: broker.json cannot be written")

    with monkeypatch.context() as patch:
        patch.setattr(Broker, "save_state", fail)
        patch.setattr(CatalogLog, "append", fail)  # the catalog's journal
        appended = append(broker, "s", b"m1", producer=("p", 0, 1), seq="x")
        assert isinstance(appended, StorageError) and appended.status == 500
        created = run(broker, {"op": "create", "name": "new", "content_type": OCTET},
                      [b"never"])
        assert isinstance(created, StorageError)
        closed = append(broker, "s", close=True)
        assert isinstance(closed, StorageError)
        deleted = delete(broker, "s")
        assert isinstance(deleted, StorageError)

    assert broker.catalog.streams == before
    assert "new" not in broker.catalog.streams
    assert broker.index == index
    assert content(broker, "s") == [b"m0"]
    # The producer's seq 1 was never accepted: the retry is new data, not a duplicate.
    retry = ok(append(broker, "s", b"m1", producer=("p", 0, 1), seq="x"))
    assert not retry.duplicate and retry.producer == (0, 1)
    assert content(broker, "s") == [b"m0", b"m1"]
    create(broker, "new", messages=[b"now"])
    assert content(broker, "new") == [b"now"]


def test_failed_topic_write_rolls_the_catalog_back(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker.open(tmp_path / "data")
    try:
        create(broker, "s", messages=[b"a"])
        before = copy.deepcopy(broker.catalog.streams)
        faults = Faults(tmp_path / "data" / "topics", write_budget=0)
        with inject(monkeypatch, faults):
            full = append(broker, "s", b"b", producer=("p", 0, 0))
            assert isinstance(full, DiskFullError) and full.status == 507
            failed_create = run(broker, {"op": "create", "name": "t", "content_type": OCTET},
                                [b"t0"])
            assert isinstance(failed_create, DiskFullError)
            # Several commands in one group: all of it is undone.
            results = broker.write_group([
                stream_command({"op": "append", "name": "s", "count": 1,
                                "content_type": OCTET, "producer": ["q", 0, 0], "now": NOW},
                               frames_of([b"q"])),
                stream_command({"op": "create", "name": "u", "content_type": OCTET,
                                "now": NOW}, frames_of([b"u"])),
            ], durable=True)
            assert all(isinstance(r, DiskFullError) for r in results)
        assert faults.injected > 0
        assert broker.catalog.streams == before
        assert content(broker, "s") == [b"a"]
        # Space came back: the same requests apply, once.
        assert ok(append(broker, "s", b"b", producer=("p", 0, 0))).producer == (0, 0)
        create(broker, "t", messages=[b"t0"])
        assert content(broker, "s") == [b"a", b"b"] and content(broker, "t") == [b"t0"]
    finally:
        broker.close()
    # Whatever directory the failed creates made is reused or removed: after a restart every
    # topic directory belongs to a stream, and the streams read as acknowledged.
    reopened = Broker.open(tmp_path / "data")
    try:
        kept = {str(s.topic) for s in reopened.catalog.streams.values()}
        on_disk = {p.name for p in (tmp_path / "data" / "topics").iterdir()}
        assert on_disk == kept
        assert content(reopened, "s") == [b"a", b"b"] and content(reopened, "t") == [b"t0"]
    finally:
        reopened.close()


def test_invalid_command_fails_alone_in_its_group(broker: Broker) -> None:
    create(broker, "s")
    results = broker.write_group([
        stream_command({"op": "append", "name": "s", "count": 1, "content_type": OCTET,
                        "producer": ["p", 0, 0], "now": NOW}, frames_of([b"ok"])),
        stream_command({"op": "append", "name": "s", "count": 1, "content_type": OCTET,
                        "producer": ["p", 0, 5], "now": NOW}, frames_of([b"gap"])),
        stream_command({"op": "append", "name": "s", "count": 1, "content_type": OCTET,
                        "producer": ["p", 0, 1], "now": NOW}, frames_of([b"next"])),
        stream_command({"op": "bogus", "name": "s"}),
    ], durable=True)
    assert isinstance(results[0], ApplyResult) and isinstance(results[2], ApplyResult)
    assert isinstance(results[1], ProducerSequenceGapError)
    assert isinstance(results[3], MessagingError) and results[3].status == 400
    assert content(broker, "s") == [b"ok", b"next"]


# -- persistence --------------------------------------------------------------------------------


def test_catalog_survives_close_and_reopen(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path / "data")
    create(broker, "plain", messages=pieces(b"0123456789", 4))
    ok(append(broker, "plain", b"more", producer=("p", 2, 0), seq="s1"))
    create(broker, "json", "application/json", [b'{"a":1}', b"[2]"], ttl=30)
    create(broker, "closed", "text/plain", [b"done"], closed=True)
    ok(append(broker, "plain", b"x", producer=("q", 0, 0)))
    create(broker, "expiring", expires_at="2100-01-01T00:00:00Z", expires=4102444800.0)
    create(broker, "fork", fork=fork_op("plain", broker.catalog.streams["plain"].tail))
    ok(append(broker, "fork", b"own", producer=("p", 0, 0), close=True))
    create(broker, "gone", messages=[b"soon"])
    ok(delete(broker, "gone"))
    create(broker, "soft", messages=[b"s"])
    create(broker, "soft-fork", fork=fork_op("soft", broker.catalog.streams["soft"].tail))
    ok(delete(broker, "soft"))
    streams = copy.deepcopy(broker.catalog.streams)
    contents = {name: content(broker, name) for name in streams}
    index, next_topic = broker.index, broker.catalog.next_topic
    broker.close()

    broker = Broker.open(tmp_path / "data")
    try:
        assert broker.catalog.streams == streams
        assert {name: content(broker, name) for name in streams} == contents
        assert broker.index == index and broker.catalog.next_topic == next_topic
        assert broker.catalog.streams["closed"].closed
        assert broker.catalog.streams["fork"].closed_by == ("p", 0, 0)
        assert broker.catalog.streams["soft"].deleted
        assert "gone" not in broker.catalog.streams
        # Decisions after the restart use the restored state.
        assert ok(append(broker, "plain", b"more", producer=("p", 2, 0))).duplicate
        assert isinstance(append(broker, "plain", b"y", seq="s0"), StreamConflictError)
        assert ok(append(broker, "fork", b"own", producer=("p", 0, 0), close=True)).duplicate
        assert isinstance(append(broker, "closed", b"z"), StreamClosedError)
        assert isinstance(append(broker, "soft", b"z"), StreamGoneError)
        new = create(broker, "new")
        assert new.created
        assert broker.catalog.streams["new"].topic not in {s.topic for s in streams.values()}
    finally:
        broker.close()


def test_frames_beyond_the_catalog_tail_are_cut_at_open(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path / "data", max_segment_size=200)
    create(broker, "s", messages=[b"kept-1"])
    ok(append(broker, "s", b"kept-2"))
    stream = broker.catalog.streams["s"]
    topic = broker.topic(stream.topic)
    assert topic is not None
    # What a crash between writing a group's frames and saving broker.json leaves behind:
    # frames in the named topic (several segments of them) that the catalog never took.
    first = broker.index + 1
    ghosts = b"".join(encode(APPEND_END, stream.topic, b"ghost-%d" % k + bytes(60), first + k)
                      for k in range(8))
    assert topic.append(ghosts) == 8
    topic.write()
    topic.sync()
    topic.commit()
    assert topic.last_index == first + 7 and topic.segment_count > 1
    # A named topic whose create never reached the catalog.
    orphan_id = broker.catalog.next_topic + 5
    orphan = Topic.open(broker.path / "topics" / str(orphan_id), orphan_id)
    orphan.append(encode(APPEND_END, orphan_id, b"orphan", first))
    orphan.write()
    orphan.sync()
    orphan.commit()
    orphan.close()
    broker.close()

    def segment_bytes() -> bytes:
        return b"".join(p.read_bytes() for p in sorted(topic_dir(broker, stream.topic).iterdir())
                        if p.suffix == ".seg")

    assert b"ghost-0" in segment_bytes()
    broker = Broker.open(tmp_path / "data", max_segment_size=200)
    try:
        assert b"ghost" not in segment_bytes()
        reopened = broker.topic(stream.topic)
        assert reopened is not None and reopened.last_index == stream.tail[0]
        assert content(broker, "s") == [b"kept-1", b"kept-2"]
        assert not (broker.path / "topics" / str(orphan_id)).exists()
        assert broker.index == stream.tail[0]
        outcome = ok(append(broker, "s", b"after"))
        assert outcome.tail[0] == stream.tail[0] + 1
        assert content(broker, "s") == [b"kept-1", b"kept-2", b"after"]
    finally:
        broker.close()


def test_catalog_travels_in_snapshots(tmp_path: Path) -> None:
    source = Broker.open(tmp_path / "a")
    target = Broker.open(tmp_path / "b")
    try:
        create(source, "s", "text/plain", [b"one"])
        ok(append(source, "s", b"two", producer=("p", 1, 0), seq="x",
                  content_type="text/plain"))
        create(source, "f", None, fork=fork_op("s", source.catalog.streams["s"].tail))
        ok(append(source, "f", b"three", close=True, content_type="text/plain"))
        ok(delete(source, "s"))
        create(target, "other", messages=[b"replaced"])
        snapshot = io.BytesIO()
        snapshot_format.write(source, snapshot)
        snapshot.seek(0)
        target.install_snapshot(snapshot)
        assert target.catalog.streams == source.catalog.streams
        assert content(target, "f") == [b"one", b"two", b"three"]
        assert "other" not in target.catalog.streams
        assert isinstance(append(target, "s", b"x"), StreamGoneError)
        assert isinstance(append(target, "f", b"x"), StreamClosedError)
        ok(delete(target, "f"))
        assert target.catalog.streams == {}
    finally:
        source.close()
        target.close()


class Watched(dict[Any, Any]):
    """A dict that, after every change, records whether ``key`` is in it: what a reader on
    another thread would see if it looked right then (a thread may run between any two
    bytecodes of the writer)."""

    def __init__(self, items: dict[Any, Any], key: Any, seen: list[bool]) -> None:
        super().__init__(items)
        self.key = key
        self.seen = seen

    def _look(self) -> None:
        self.seen.append(self.key in self)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._look()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self._look()

    def pop(self, key: Any, *default: Any) -> Any:
        value = super().pop(key, *default)
        self._look()
        return value


def test_readers_on_other_threads_never_see_a_stream_vanish(broker: Broker) -> None:
    """The catalog's contract: readers on other threads (the event loop's request handlers
    read ``catalog.streams``) see only committed streams, each replaced whole. An append
    replaces its stream; an existing stream must never be missing from ``streams`` (nor its
    topic from ``by_topic``) at any instant of the commit, or a request arriving then gets
    404, a long-poll ends with 404 and an SSE response ends without ``streamClosed``."""
    create(broker, "s", messages=[b"x"])
    create(broker, "other")
    topic = broker.catalog.streams["s"].topic
    seen_name: list[bool] = []
    seen_topic: list[bool] = []
    catalog = broker.catalog
    catalog.streams = Watched(catalog.streams, "s", seen_name)
    catalog.by_topic = Watched(catalog.by_topic, topic, seen_topic)
    ok(append(broker, "s", b"y"))
    ok(append(broker, "s", b"z", producer=("p", 0, 0), close=True))
    ok(append(broker, "other", b"o"))
    create(broker, "f", fork=fork_op("s", catalog.streams["s"].tail))
    assert content(broker, "s") == [b"x", b"y", b"z"]
    assert seen_name and seen_topic  # the commits did change the dicts
    assert all(seen_name), f"'s' looked missing at {seen_name.count(False)} instants"
    assert all(seen_topic), f"its topic looked unnamed at {seen_topic.count(False)} instants"


# -- idempotent producers against a model -------------------------------------------------------


PRODUCERS = ("p0", "p1", "p2")


def expected_outcome(state: tuple[int, int] | None, epoch: int, seq: int
                     ) -> tuple[str, int, int]:
    """PROTOCOL.md §5.2.1's validation logic: (what happens, epoch, seq) where the numbers
    are the producer state after an accept or duplicate, the current epoch for "fenced", and
    (expected, received) for "gap". A producer the stream does not know must start at 0."""
    if state is None:
        return ("accept", epoch, 0) if seq == 0 else ("gap", 0, seq)
    last_epoch, last_seq = state
    if epoch < last_epoch:
        return "fenced", last_epoch, 0
    if epoch > last_epoch:
        return ("accept", epoch, 0) if seq == 0 else ("bad", 0, 0)
    if seq <= last_seq:
        return "duplicate", last_epoch, last_seq
    if seq == last_seq + 1:
        return "accept", epoch, seq
    return "gap", last_seq + 1, seq


class ProducerMachine(RuleBasedStateMachine):
    """One stream, up to three producers: fresh sends, retries of anything sent before,
    zombies (old epochs), new epochs, gaps; the broker closed and reopened in between."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="producer-machine-"))
        self.broker = Broker.open(self.dir)
        create(self.broker, "s")
        self.state: dict[str, tuple[int, int]] = {}
        self.stored: list[bytes] = []
        self.sent: list[tuple[str, int, int]] = []
        self.count = 0

    def teardown(self) -> None:
        self.broker.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def send(self, pid: str, epoch: int, seq: int) -> None:
        self.count += 1
        data = f"{pid}:{epoch}:{seq}#{self.count}".encode()
        self.sent.append((pid, epoch, seq))
        kind, a, b = expected_outcome(self.state.get(pid), epoch, seq)
        # Not fsynced, for speed: durability is the other tests' subject, and closing the
        # broker (the ``reopen`` rule) syncs everything.
        result = append(self.broker, "s", data, producer=(pid, epoch, seq), durable=False)
        if kind == "accept":
            outcome = ok(result)
            assert not outcome.duplicate and outcome.producer == (a, b)
            self.state[pid] = (a, b)
            self.stored.append(data)
        elif kind == "duplicate":
            outcome = ok(result)
            assert outcome.duplicate and outcome.producer == (a, b)
            assert isinstance(result, ApplyResult) and result.count == 0
        elif kind == "fenced":
            assert isinstance(result, ProducerFencedError), result
            assert result.status == 403 and result.headers() == {"Producer-Epoch": str(a)}
        elif kind == "bad":
            assert isinstance(result, BadRequestError), result
            assert result.status == 400
        else:
            assert isinstance(result, ProducerSequenceGapError), result
            assert result.status == 409 and (result.expected, result.received) == (a, b)

    @rule(pid=st.sampled_from(PRODUCERS), epoch_step=st.sampled_from([0, 0, 0, 1, -1]),
          seq_step=st.sampled_from([1, 1, 1, 0, -1, 2, 3]))
    def near(self, pid: str, epoch_step: int, seq_step: int) -> None:
        """Mostly the next seq; sometimes a retry, an older seq, a gap, a zombie, a new
        epoch (starting at 0, or wrongly not)."""
        epoch, seq = self.state.get(pid, (0, -1))
        epoch = max(epoch + epoch_step, 0)
        seq = 0 if epoch_step > 0 and seq_step == 1 else max(seq + seq_step, 0)
        self.send(pid, epoch, seq)

    @rule(pid=st.sampled_from(PRODUCERS), epoch=st.integers(0, 3), seq=st.integers(0, 4))
    def anything(self, pid: str, epoch: int, seq: int) -> None:
        self.send(pid, epoch, seq)

    @precondition(lambda self: bool(self.sent))
    @rule(pick=st.integers(0, 1 << 16))
    def retry(self, pick: int) -> None:
        """A request sent before, sent again (a client retry, or a zombie's)."""
        self.send(*self.sent[pick % len(self.sent)])

    @rule()
    def reopen(self) -> None:
        self.broker = reopen(self.broker)

    @invariant()
    def stream_matches_model(self) -> None:
        assert content(self.broker, "s") == self.stored
        producers = self.broker.catalog.streams["s"].producers
        assert {pid: (p.epoch, p.seq) for pid, p in producers.items()} == self.state


ProducerMachine.TestCase.settings = settings(max_examples=examples(25), stateful_step_count=25,
                                             deadline=None)
test_idempotent_producers_follow_the_model = ProducerMachine.TestCase


def test_model_covers_every_branch() -> None:
    """The model itself, on the protocol's own examples."""
    cases: Iterable[tuple[tuple[int, int] | None, int, int, str]] = [
        (None, 0, 0, "accept"), (None, 0, 1, "gap"), (None, 4, 0, "accept"),
        ((1, 3), 0, 9, "fenced"), ((1, 3), 2, 0, "accept"), ((1, 3), 2, 1, "bad"),
        ((1, 3), 1, 3, "duplicate"), ((1, 3), 1, 0, "duplicate"), ((1, 3), 1, 4, "accept"),
        ((1, 3), 1, 6, "gap"),
    ]
    for state, epoch, seq, kind in cases:
        assert expected_outcome(state, epoch, seq)[0] == kind


# -- the state journal (messaging.broker.state_log) ------------------------------------------------


_CHILD = """
import os, sys, time
from messaging.broker.broker import Broker
from messaging.broker.catalog import stream_command
from messaging.frames import encode
broker = Broker.open(sys.argv[1])
broker.write_group([stream_command({"op": "create", "name": "s",
                                    "content_type": "application/octet-stream"})], durable=True)
for seq in range(5):
    frame = encode(1, 0, b"m%d" % seq)
    broker.write_group([stream_command({"op": "append", "name": "s", "count": 1,
                                        "producer": ["p", 0, seq], "now": time.time()},
                                       frame)], durable=True)
os._exit(0)  # a crash: no close, broker.json is not saved again
"""


def test_journal_holds_each_group_and_is_replayed(tmp_path: Path) -> None:
    """A group that changes the catalog appends one line; a restart after a crash replays
    the lines after broker.json's copy, and a heartbeat's full save folds the journal in."""
    data = tmp_path / "data"
    subprocess.run([sys.executable, "-c", _CHILD, str(data)], check=True, timeout=60)
    journal = (data / "catalog.log").read_text().splitlines()
    assert len(journal) == 6  # one line per group, each with only what it changed
    assert all(len(line) < 1000 for line in journal)
    reopened = Broker.open(data)
    try:
        assert content(reopened, "s") == [b"m%d" % i for i in range(5)]
        assert ok(append(reopened, "s", b"m4", producer=("p", 0, 4))).duplicate
        reopened.write_group([heartbeat_command(1, 0, "c")], durable=True)
        assert len((data / "catalog.log").read_text().splitlines()) == 7  # one more line
        reopened.save_state()
        assert (data / "catalog.log").stat().st_size == 0  # folded into broker.json
        ok(append(reopened, "s", b"m5", producer=("p", 0, 5)))
    finally:
        reopened.close()
    again = Broker.open(data)
    try:
        assert content(again, "s") == [b"m%d" % i for i in range(6)]
        assert ok(append(again, "s", b"m5", producer=("p", 0, 5))).duplicate
    finally:
        again.close()


def test_journal_torn_line_and_failed_sync(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    broker = Broker.open(data)
    create(broker, "s")
    ok(append(broker, "s", b"kept", producer=("p", 0, 0)))
    size = (data / "catalog.log").stat().st_size
    with inject(monkeypatch, Faults(data, match=lambda p: p.endswith("catalog.log"),
                                    sync_failures=1)):
        failed = append(broker, "s", b"lost", producer=("p", 0, 1))
    assert isinstance(failed, StorageError) and failed.status == 503
    assert (data / "catalog.log").stat().st_size == size  # the line was taken back
    again = append(broker, "s", b"later", producer=("p", 0, 1))
    assert isinstance(again, StorageError) and again.status == 503  # until a restart
    broker.close()
    with (data / "catalog.log").open("ab") as f:
        f.write(b'{"seq": 99, "chan')  # a crash in the middle of a line
    reopened = Broker.open(data)
    try:
        assert content(reopened, "s") == [b"kept"]
        ok(append(reopened, "s", b"after", producer=("p", 0, 1)))
        assert content(reopened, "s") == [b"kept", b"after"]
    finally:
        reopened.close()


def test_journal_folds_when_large(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("messaging.broker.state_log.COMPACT_BYTES", 2000)
    data = tmp_path / "data"
    broker = Broker.open(data)
    try:
        create(broker, "s")
        for seq in range(40):
            ok(append(broker, "s", b"%d" % seq, producer=("p", 0, seq)))
            assert (data / "catalog.log").stat().st_size < 2500
    finally:
        broker.close()
    reopened = Broker.open(data)
    try:
        assert content(reopened, "s") == [b"%d" % i for i in range(40)]
        assert ok(append(reopened, "s", b"39", producer=("p", 0, 39))).duplicate
    finally:
        reopened.close()


def test_journal_line_without_its_newline_is_torn(tmp_path: Path) -> None:
    """A line whose write stopped just before its newline was never acknowledged: it goes,
    and the next line does not run into it."""
    data = tmp_path / "data"
    subprocess.run([sys.executable, "-c", _CHILD, str(data)], check=True, timeout=60)
    journal = data / "catalog.log"
    intact = journal.read_bytes()
    journal.write_bytes(intact + b'{"seq":99,"changes":{}}')  # whole JSON, no newline
    reopened = Broker.open(data)
    try:
        assert journal.read_bytes() == intact
        ok(append(reopened, "s", b"m5", producer=("p", 0, 5)))
        lines = journal.read_bytes().split(b"\n")
        assert lines[-1] == b"" and [json.loads(line)["seq"] for line in lines[:-1]] == [
            1, 2, 3, 4, 5, 6, 7]
    finally:
        reopened.close()


# -- the catalog alone, in memory ------------------------------------------------------------------

NATIVE_TOPIC = 5


class CatalogMachine(RuleBasedStateMachine):
    """The catalog with no broker and no files: native producer publishes applied in groups
    that commit (writing the journal line :meth:`Catalog.changes` gives, as the broker does)
    or fail (rolled back); a restart rebuilds the catalog from the last folded state plus the
    journal lines since, and must decide every later request exactly as before."""

    def __init__(self) -> None:
        super().__init__()
        self.catalog = Catalog()
        self.folded = json.loads(json.dumps(self.catalog.saved()))
        self.journal: list[dict[str, Any]] = []
        self.state: dict[str, tuple[int, int]] = {}
        self.ranges: dict[str, tuple[int, int]] = {}
        self.index = 0

    def group(self, requests: list[tuple[str, int, int]], fails: bool) -> None:
        """One group of publishes; ``fails``: the disk refused it and it is rolled back."""
        model = dict(self.state)
        ranges = dict(self.ranges)
        index = self.index
        for pid, epoch, seq in requests:
            mark = self.catalog.mark()
            op = {"op": "produce", "topic": NATIVE_TOPIC, "producer": [pid, epoch, seq],
                  "now": NOW}
            kind, a, b = expected_outcome(model.get(pid), epoch, seq)
            try:
                decision = self.catalog.apply(json.dumps(op).encode())
            except MessagingError as err:
                self.catalog.rollback(mark)
                assert kind in ("fenced", "bad", "gap"), (kind, err)
                continue
            if kind == "duplicate":
                assert decision.topic is None
                outcome = self.catalog.appended(decision, 0, 0)
                assert outcome.duplicate and outcome.producer == (a, b)
                assert (outcome.first, outcome.last) == ranges[pid]
                continue
            assert kind == "accept" and decision.topic == NATIVE_TOPIC, kind
            outcome = self.catalog.appended(decision, index + 1, index + 1)
            assert not outcome.duplicate and outcome.producer == (a, b)
            index += 1
            model[pid] = (a, b)
            ranges[pid] = (index, index)
        if fails:
            self.catalog.rollback()
            return
        if self.catalog.pending:
            self.journal.append(json.loads(json.dumps(self.catalog.changes())))
        self.catalog.commit()
        self.state, self.ranges, self.index = model, ranges, index

    @rule(requests=st.lists(st.tuples(st.sampled_from(PRODUCERS), st.integers(0, 2),
                                      st.integers(0, 3)), min_size=1, max_size=4),
          fails=st.booleans())
    def publish(self, requests: list[tuple[str, int, int]], fails: bool) -> None:
        self.group(requests, fails)

    @rule(pid=st.sampled_from(PRODUCERS), fails=st.booleans())
    def next_seq(self, pid: str, fails: bool) -> None:
        """Mostly the request a well-behaved producer sends next."""
        epoch, seq = self.state.get(pid, (0, -1))
        self.group([(pid, epoch, seq + 1)], fails)

    @rule()
    def fold(self) -> None:
        """broker.json rewritten with the committed catalog; the journal starts afresh."""
        self.folded = json.loads(json.dumps(self.catalog.saved()))
        self.journal = []

    @rule()
    def restart(self) -> None:
        """A new process: the folded catalog, then every journal line since."""
        self.catalog = Catalog()
        self.catalog.restore(copy.deepcopy(self.folded))
        for line in self.journal:
            self.catalog.replay(copy.deepcopy(line))

    @invariant()
    def producers_match_the_model(self) -> None:
        producers = self.catalog.native.get(NATIVE_TOPIC, {})
        assert {pid: (p.epoch, p.seq) for pid, p in producers.items()} == self.state
        assert {pid: (p.first, p.last) for pid, p in producers.items()} == self.ranges


CatalogMachine.TestCase.settings = settings(max_examples=examples(60), stateful_step_count=30,
                                            deadline=None)
test_the_catalog_alone_follows_the_model = CatalogMachine.TestCase


def test_an_applied_native_publish_is_settled_from_the_producer_state(broker: Broker) -> None:
    """What a node answers for a publish an installed snapshot applied: the producer's last
    accepted request gets its duplicate answer with its indexes; an older request, another
    kind of command or garbage gets None (the caller answers 504 and the client retries)."""
    def produce(seq: int, data: bytes) -> bytes:
        return stream_command({"op": "produce", "topic": 5, "producer": ["p", 0, seq],
                               "now": NOW}, encode(1, 5, data))

    for seq in range(3):
        ok(broker.write_group([produce(seq, b"m%d" % seq)], durable=False)[0])
    result = broker.settled_result(produce(2, b"m2"))
    assert result is not None and result.stream is not None
    assert result.stream.duplicate and result.stream.producer == (0, 2)
    assert (result.stream.first, result.stream.last) == (3, 3)
    assert broker.settled_result(produce(1, b"m1")) is None  # not its last request
    assert broker.settled_result(encode(1, 5, b"plain")) is None
    assert broker.settled_result(stream_command({"op": "create", "name": "s"})) is None
    assert broker.settled_result(b"\x00garbage") is None


def test_stream_commands_take_the_log_time_not_the_receiving_nodes(tmp_path: Path) -> None:
    """A stream command's time (its creation, producers' last use, TTLs) is the time the log
    gave the command, as a publish's append time: the ``now`` the receiving node wrote into
    it counts only for commands applied without a time."""
    broker = Broker.open(tmp_path)
    untimed = stream_command({"op": "create", "name": "old", "content_type": "text/plain",
                              "now": 5.0})
    broker.write_group([untimed], durable=True)
    assert broker.catalog.streams["old"].created == 5.0
    timed = stream_command({"op": "create", "name": "new", "content_type": "text/plain",
                            "now": 3_600.0})  # the receiving node's clock, far off
    broker.write_group([timed], durable=True, times=[1_795_000_000_000])
    assert broker.catalog.streams["new"].created == 1_795_000_000.0
    broker.close()
