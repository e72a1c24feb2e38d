"""Joining the plain publishes of one topic into one command, and cutting its result back."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from messaging.broker.broker import Broker
from messaging.broker.commands import ApplyResult, heartbeat_command, validate_publish
from messaging.errors import BadRequestError, MessagingError
from messaging.frames import decode, encode, encode_batch
from messaging.log.coalesce import coalesce, spread

# A command: a plain publish of `count` messages to `topic` (a validated Command), a publish
# spanning two topics (validated, no one topic), or a heartbeat (not a publish).
_command = st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 3), st.integers(1, 4),
              st.integers(0, 40)),
    st.tuples(st.just("mixed"), st.just(0), st.just(2), st.just(5)),
    st.tuples(st.just("heartbeat"), st.integers(1, 3), st.just(0), st.just(0)),
)


def _make(kind: str, topic: int, count: int, size: int, k: int) -> bytes:
    if kind == "publish":
        return validate_publish(encode_batch(topic, [bytes([k % 256]) * (size + m)
                                                     for m in range(count)]))
    if kind == "mixed":
        return validate_publish(encode(1, 1, b"a%d" % k) + encode(1, 2, b"b%d" % k))
    return heartbeat_command(topic, 0, f"http://subscriber-{k}")


@settings(max_examples=60, deadline=None)
@given(st.lists(_command, max_size=12))
def test_joined_commands_apply_to_the_same_messages_and_results(
        specs: list[tuple[str, int, int, int]]) -> None:
    """Applying the joined commands stores the same messages at the same indexes as applying
    them one by one, and the spread results are the one-by-one results."""
    commands = [_make(*spec, k) for k, spec in enumerate(specs)]
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as joined:
        alone = Broker.open(Path(one))
        together = Broker.open(Path(joined))
        try:
            expected = alone.write_group([bytes(c) for c in commands], durable=False)
            put, parts = coalesce(commands)
            if parts is None:
                assert put == commands
                got = together.write_group([bytes(c) for c in put], durable=False)
            else:
                assert len(put) == len(parts) < len(commands)
                got = spread(together.write_group([bytes(c) for c in put], durable=False),
                             parts)
            assert [_outcome(r) for r in got] == [_outcome(r) for r in expected]
            for topic in (1, 2, 3):
                assert _stored(together, topic) == _stored(alone, topic)
        finally:
            alone.close()
            together.close()


def _outcome(result: ApplyResult | MessagingError) -> object:
    if isinstance(result, ApplyResult):
        return (result.first, result.last, result.topics)
    return type(result).__name__


def _stored(broker: Broker, topic_id: int) -> list[tuple[int, bytes]]:
    topic = broker.topic(topic_id)
    if topic is None:
        return []
    with topic.reader(topic.first_index) as reader:
        return [(m.index, bytes(m.data)) for m in decode(reader.read_all(), after=0)[0]]


def test_only_consecutive_plain_publishes_of_one_topic_are_joined() -> None:
    """A heartbeat, a publish spanning topics or a publish for another topic ends a run."""
    a1, a2, a3 = (validate_publish(encode_batch(1, [b"x%d" % k])) for k in range(3))
    b = validate_publish(encode_batch(2, [b"y", b"z"]))
    beat = heartbeat_command(1, 0, "http://s")
    put, parts = coalesce([a1, a2, beat, a3, b, bytes(a1)])  # the last: not validated
    assert put == [a1 + a2, beat, a3, b, bytes(a1)]
    assert parts == [[1, 1], None, None, None, None]
    assert coalesce([a1, b, a2]) == ([a1, b, a2], None)  # nothing joined: as they were


def test_a_joined_command_that_fails_fails_every_publish_in_it() -> None:
    """The whole command's error goes to each of its publishes; others keep their own."""
    error = BadRequestError("topic 1 was deleted")
    fine = ApplyResult(9, 9, frozenset({2}))
    assert spread([error, fine], [[2, 1], None]) == [error, error, fine]
    assert spread([ApplyResult(5, 8, frozenset({1}))], [[1, 3]]) == [
        ApplyResult(5, 5, frozenset({1})), ApplyResult(6, 8, frozenset({1}))]
