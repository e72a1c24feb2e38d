"""Publishes to one topic in a row are staged as one command: the same answers, the same
segment and time files, as staging them one by one (every group of one command), whatever
else the group holds; a publish a run cannot take is answered on its own, and the others in
its run are stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messaging.broker.broker import Broker
from messaging.broker.coalesce import JOIN_MESSAGES, joined, lone_topic, run_end, split
from messaging.broker.commands import (
    ApplyResult,
    configure_command,
    heartbeat_command,
    validate_publish,
)
from messaging.broker.topic_settings import MAX_MESSAGE_SIZE
from messaging.errors import MessageTooLargeError, MessagingError
from messaging.frames import encode
from messaging.placement import NAMED_TOPIC_BASE
from messaging.topic.times import TIME_RESOLUTION_MS

NOW = 1_800_000_000_000


def lone(topic: int, size: int, type_: int = 1) -> bytes:
    return encode(type_, topic, b"m" * size)


def topic_files(root: Path) -> dict[str, bytes]:
    """Every segment and time index, by path under ``root``."""
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted((root / "topics").rglob("*")) if path.is_file()}


def answers(results: list[ApplyResult | MessagingError]) -> list[object]:
    return [type(r).__name__ if isinstance(r, MessagingError) else (r.first, r.last, r.topics)
            for r in results]


#: One command of a group: a single publish (topic, size), a batch of two frames for a topic,
#: one too big to join a run, a batch spanning both topics, or a subscriber's heartbeat.
commands = st.one_of(
    st.tuples(st.just("lone"), st.sampled_from([3, 4]), st.integers(0, 40)),
    st.tuples(st.just("batch"), st.sampled_from([3, 4]), st.integers(0, 40)),
    st.tuples(st.just("big"), st.sampled_from([3, 4]), st.integers(0, 4)),
    st.tuples(st.just("mixed"), st.just(3), st.integers(0, 40)),
    st.tuples(st.just("heartbeat"), st.sampled_from([3, 4]), st.integers(0, 5)),
)


def build(kind: str, topic: int, n: int, validated: bool) -> bytes:
    """A command as the node that took it holds it (``validated``: a Command) or as the
    cluster's log carries it (plain bytes)."""
    if kind == "lone":
        frame = lone(topic, n)
        return validate_publish(frame, topic=topic) if validated else frame
    if kind == "batch":
        # Enough frames of one size to be stamped strided, or two, their sizes alike or not.
        body = (lone(topic, n % 7) * 20 if n % 3 == 0
                else lone(topic, n) + lone(topic, n + n % 2))
        return validate_publish(body, topic=topic) if validated else body
    if kind == "big":  # staged on its own, between runs
        body = lone(topic, n) * (JOIN_MESSAGES + 1)
        return validate_publish(body, topic=topic) if validated else body
    if kind == "mixed":
        body = lone(3, n) + lone(4, n)
        return validate_publish(body) if validated else body
    return heartbeat_command(topic, n, "http://sub")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(st.lists(st.tuples(commands, st.integers(0, 2)), min_size=1,
                                max_size=30), min_size=1, max_size=6),
       validated=st.booleans())
def test_a_run_gives_the_answers_and_files_of_staging_one_by_one(
        tmp_path_factory: pytest.TempPathFactory,
        groups: list[list[tuple[tuple[str, int, int], int]]], validated: bool) -> None:
    together = Broker.open(tmp_path_factory.mktemp("together"), max_segment_size=300)
    apart = Broker.open(tmp_path_factory.mktemp("apart"), max_segment_size=300)
    step = 0
    for group in groups:
        built = [build(kind, topic, n, validated) for (kind, topic, n), _later in group]
        times: list[int | None] = []
        for _spec, later in group:
            step += later
            times.append(NOW + step * TIME_RESOLUTION_MS)
        got = together.write_group(built, durable=False, times=times)
        one_by_one: list[ApplyResult | MessagingError] = []
        for command, time_ms in zip(built, times, strict=True):
            one_by_one.extend(apart.write_group([command], durable=False, times=[time_ms]))
        assert answers(got) == answers(one_by_one)
    assert together.index == apart.index
    assert topic_files(together.path) == topic_files(apart.path)
    together.close()
    apart.close()


def test_a_publish_the_run_cannot_take_gets_its_own_answer(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    broker.write_group([configure_command(3, {MAX_MESSAGE_SIZE: 8})], durable=True)
    group = [lone(3, 4), lone(3, 5), lone(3, 50), lone(3, 6)]
    results = broker.write_group(group, durable=True, times=[NOW] * 4)
    assert isinstance(results[2], MessageTooLargeError)
    assert [(r.first, r.last) for r in results if isinstance(r, ApplyResult)] == [
        (1, 1), (2, 2), (3, 3)]
    broker.close()
    reopened = Broker.open(tmp_path)
    assert reopened.index == 3
    reopened.close()


def test_what_makes_a_run() -> None:
    assert lone_topic(lone(3, 10)) == 3
    assert lone_topic(validate_publish(lone(3, 10), topic=3)) == 3
    assert lone_topic(validate_publish(lone(3, 1) + lone(3, 2), topic=3)) == 3  # validated
    assert lone_topic(lone(3, 10) + lone(3, 10)) is None  # a batch as the log carries it
    few = b"".join(lone(3, 1) for _ in range(JOIN_MESSAGES))
    assert lone_topic(validate_publish(few, topic=3)) == 3  # a small batch joins a run
    many = few + lone(3, 1)
    assert lone_topic(validate_publish(many, topic=3)) is None  # a big one is staged alone
    assert lone_topic(validate_publish(lone(3, 1) + lone(4, 1))) is None  # two topics
    assert lone_topic(heartbeat_command(3, 1, "http://sub")) is None  # internal
    assert lone_topic(lone(NAMED_TOPIC_BASE + 1, 10)) is None  # a named stream's topic
    assert lone_topic(lone(3, 10)[:-1]) is None  # cut short
    assert lone_topic(b"") is None
    group = [lone(3, 1), lone(3, 2), lone(4, 1), lone(4, 1), lone(4, 1)]
    times = [NOW, NOW, NOW, NOW, NOW + 1]
    assert run_end(group, times, 0, 3) == 2
    assert run_end(group, times, 2, 4) == 4  # the last has another time
    command, counts = joined(group[2:4], 4)
    assert list(command.offsets) == [0, len(group[2])] and command.stride == len(group[2])
    assert counts == [1, 1]
    assert joined(group[:2], 3)[0].stride == 0  # sizes differ
    size = len(group[2])
    batch = validate_publish(lone(4, 1) * 3, topic=4)  # too few frames to check strided
    command, counts = joined([group[2], batch, group[3]], 4)
    assert list(command.offsets) == [size * k for k in range(5)]
    assert counts == [1, 3, 1] and command.stride == 0
    batch = validate_publish(lone(4, 1) * 40, topic=4)
    assert batch.stride == size
    command, counts = joined([group[2], batch, group[3]], 4)
    assert list(command.offsets) == [size * k for k in range(42)]
    assert counts == [1, 40, 1] and command.stride == size
    assert split(ApplyResult(7, 11, frozenset({4})), [1, 3, 1]) == [
        ApplyResult(7, 7, frozenset({4})), ApplyResult(8, 10, frozenset({4})),
        ApplyResult(11, 11, frozenset({4}))]
