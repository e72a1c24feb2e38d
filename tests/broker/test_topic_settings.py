"""Per-topic settings: the request body's validation, the command codec (property-tested),
the table's transactions and persistence, and the effective settings with their sources."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messaging.broker.commands import is_topic_command
from messaging.broker.topic_settings import (
    CONFIGURE,
    DELETE,
    KEYS,
    MAX_MESSAGE_SIZE,
    MAX_SEGMENT_SIZE,
    MAX_TOPIC_SIZE,
    RETENTION_AGE,
    TOPIC_OP,
    TopicEntry,
    TopicTable,
    configure_command,
    delete_command,
    effective,
    parse_settings,
    parse_topic_command,
)
from messaging.config import DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_MAX_SEGMENT_SIZE
from messaging.errors import BadRequestError, CorruptFrameError
from messaging.frames import decode_one, encode

SIZES = st.integers(min_value=1, max_value=(1 << 63) - 1)
SETTINGS = st.dictionaries(st.sampled_from(KEYS), st.none() | SIZES)
TOPICS = st.integers(min_value=0, max_value=(1 << 64) - 1)


# -- the request body -------------------------------------------------------------------------


def test_sizes_are_numbers_or_size_texts_and_null_resets() -> None:
    body = {MAX_TOPIC_SIZE: "1G", MAX_SEGMENT_SIZE: 4096, MAX_MESSAGE_SIZE: None}
    assert parse_settings(body, DEFAULT_MAX_MESSAGE_SIZE) == {
        MAX_TOPIC_SIZE: 1 << 30, MAX_SEGMENT_SIZE: 4096, MAX_MESSAGE_SIZE: None}
    assert parse_settings({MAX_MESSAGE_SIZE: "10k"}, 1 << 20) == {MAX_MESSAGE_SIZE: 10 << 10}


@pytest.mark.parametrize(("value", "ms"), [("12s", 12_000), ("12h", 43_200_000),
                                           ("7d", 604_800_000), ("500ms", 500), ("1.5s", 1500),
                                           (0, 0), ("0", 0), ("0s", 0)])
def test_a_retention_age_is_a_duration_with_its_unit_kept_in_ms(value: object, ms: int,
                                                                ) -> None:
    """The body takes what the broker's flag takes; the command in the log keeps ms."""
    assert parse_settings({RETENTION_AGE: value}, DEFAULT_MAX_MESSAGE_SIZE) == {
        RETENTION_AGE: ms}


@pytest.mark.parametrize(("body", "reason"), [
    ([], "JSON object"),
    ("1G", "JSON object"),
    ({"retention-age": "soon"}, "invalid retention-age"),
    ({"retention-age": -1}, "invalid retention-age '-1'"),
    ({"retention-age": True}, "expected a duration"),
    ({"retention-age": 12}, "invalid retention-age 12: add a unit: 12s, 12h"),
    ({"retention-age": "12"}, "invalid retention-age 12: add a unit: 12s, 12h"),
    ({"retention-age": 0.5}, "add a unit: 0.5s"),
    ({"retention-age": "0.4ms"}, "below 1ms"),
    ({"retention-age": "99999999999999999d"}, "must be at most"),
    ({"max-topic-sizes": 1}, "unknown setting 'max-topic-sizes'"),
    ({MAX_TOPIC_SIZE: "lots"}, "invalid max-topic-size"),
    ({MAX_TOPIC_SIZE: 0}, "must be from 1"),
    ({MAX_TOPIC_SIZE: -5}, "must be from 1"),
    ({MAX_TOPIC_SIZE: 1 << 63}, "must be from 1"),
    ({MAX_TOPIC_SIZE: 1.5}, "expected a size"),
    ({MAX_TOPIC_SIZE: True}, "expected a size"),
    ({MAX_SEGMENT_SIZE: [1]}, "expected a size"),
    ({MAX_MESSAGE_SIZE: "2M"}, "above this broker's maximum of 1048576"),
])
def test_bad_bodies_are_refused_with_the_reason(body: object, reason: str) -> None:
    with pytest.raises(BadRequestError, match=reason):
        parse_settings(body, DEFAULT_MAX_MESSAGE_SIZE)


# -- the command ------------------------------------------------------------------------------


@settings(max_examples=50)  # the unit run stays fast
@given(TOPICS, SETTINGS, st.booleans())
def test_a_configure_command_reads_back_as_written(topic: int, change: dict[str, int | None],
                                                   create: bool) -> None:
    command = configure_command(topic, change, create=create)
    assert is_topic_command(command)
    frame = decode_one(command)
    assert (frame.type, frame.topic) == (TOPIC_OP, topic)
    op = parse_topic_command(frame.topic, frame.data)
    assert (op.topic, op.kind, dict(op.settings), op.create) == (topic, CONFIGURE, change,
                                                                 create)


LABELS = st.tuples(st.text(st.sampled_from("abc._-0"), min_size=1, max_size=20),
                   st.integers(min_value=0, max_value=1023))


@settings(max_examples=50)
@given(TOPICS, SETTINGS, LABELS)
def test_a_kafka_label_reads_back_and_is_kept_by_later_settings(
        topic: int, change: dict[str, int | None], label: tuple[str, int]) -> None:
    op = parse_topic_command(topic, decode_one(configure_command(topic, change,
                                                                 kafka=label)).data)
    assert op.kafka == label and dict(op.settings) == change
    entry = TopicEntry().configured(op.settings, op.kafka)
    assert entry.kafka == label and not entry.empty
    assert entry.configured({MAX_TOPIC_SIZE: 5}).kafka == label  # settings keep it
    assert TopicEntry.restore(entry.saved()) == entry


@pytest.mark.parametrize("label", ['"x"', '["", 0]', '["x", -1]', '[1, 0]', '["x", 0, 1]'])
def test_a_bad_kafka_label_is_a_corrupt_command(label: str) -> None:
    data = f'{{"op":"configure","settings":{{}},"kafka":{label}}}'.encode()
    with pytest.raises(CorruptFrameError):
        parse_topic_command(1, data)


def test_the_kafka_index_follows_commits_rollbacks_and_replays() -> None:
    table = TopicTable()
    table.stage(7, TopicEntry().configured({}, ("orders", 0)))
    table.stage(8, TopicEntry().configured({}, ("orders", 1)))
    assert table.kafka == {}  # readers see committed labels only
    table.commit()
    assert table.kafka == {"orders": {0: 7, 1: 8}}
    table.stage(9, TopicEntry().configured({}, ("orders", 2)))
    table.rollback()
    table.commit()
    assert table.kafka == {"orders": {0: 7, 1: 8}}
    table.stage(8, TopicEntry(deleted_at=40))  # a deletion drops the label
    changes = table.changes()
    table.commit()
    assert table.kafka == {"orders": {0: 7}}
    restored = TopicTable()
    restored.restore(table.saved())
    assert restored.kafka == table.kafka
    replayed = TopicTable()
    replayed.restore({"7": {"kafka": ["orders", 0]}, "8": {"kafka": ["orders", 1]}})
    replayed.replay(changes)
    assert replayed.kafka == table.kafka


@given(TOPICS)
def test_a_delete_command_reads_back_as_written(topic: int) -> None:
    frame = decode_one(delete_command(topic))
    op = parse_topic_command(frame.topic, frame.data)
    assert (op.topic, op.kind, dict(op.settings)) == (topic, DELETE, {})


@given(st.binary(max_size=64))
def test_any_bytes_parse_or_are_a_corrupt_frame(data: bytes) -> None:
    try:
        op = parse_topic_command(1, data)
    except CorruptFrameError:
        return
    assert op.kind in (CONFIGURE, DELETE)


@pytest.mark.parametrize("data", [
    b'{"op": "rename"}', b'{"op": "configure", "settings": {"max-topic-size": 0}}',
    b'{"op": "configure", "settings": {"colour": 1}}', b'{"op": "configure", "settings": 3}',
    b"[]", b"not json",
])
def test_invalid_commands_are_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptFrameError):
        parse_topic_command(1, data)


def test_only_topic_commands_are_topic_commands() -> None:
    assert not is_topic_command(encode(1, 5, b"data"))
    assert not is_topic_command(b"short")


# -- the table --------------------------------------------------------------------------------


def test_the_table_stages_commits_and_rolls_back() -> None:
    table = TopicTable()
    table.stage(1, TopicEntry({MAX_TOPIC_SIZE: 10}))
    mark = table.mark()
    table.stage(1, table.get(1).configured({MAX_SEGMENT_SIZE: 20}))
    assert table.get(1).settings == {MAX_TOPIC_SIZE: 10, MAX_SEGMENT_SIZE: 20}
    assert table.committed(1) == TopicEntry()  # readers see committed entries only
    table.rollback(mark)
    assert table.get(1).settings == {MAX_TOPIC_SIZE: 10}
    assert table.changes() == {"1": {"settings": {MAX_TOPIC_SIZE: 10}}}
    table.commit()
    assert table.committed(1).settings == {MAX_TOPIC_SIZE: 10} and not table.pending
    table.stage(1, table.get(1).configured({MAX_TOPIC_SIZE: None}))
    table.commit()
    assert 1 not in table.entries  # an entry that says nothing is not kept


@settings(max_examples=30)
@given(st.dictionaries(TOPICS, st.tuples(SETTINGS, st.none() | st.integers(0, 1 << 40)),
                       max_size=4))
def test_saved_restored_and_replayed_tables_agree(
        entries: dict[int, tuple[dict[str, int | None], int | None]]) -> None:
    table = TopicTable()
    for topic, (change, deleted_at) in entries.items():
        table.stage(topic, TopicEntry(deleted_at=deleted_at).configured(change))
    changes = table.changes()
    table.commit()
    restored, replayed = TopicTable(), TopicTable()
    restored.restore(table.saved())
    replayed.replay(changes)
    assert restored.entries == replayed.entries == table.entries


def test_effective_settings_say_where_each_came_from() -> None:
    broker = {MAX_TOPIC_SIZE: 5 << 30, MAX_SEGMENT_SIZE: DEFAULT_MAX_SEGMENT_SIZE,
              MAX_MESSAGE_SIZE: DEFAULT_MAX_MESSAGE_SIZE, RETENTION_AGE: None}
    shown = effective(TopicEntry({MAX_MESSAGE_SIZE: 100}), broker)
    assert shown == {MAX_TOPIC_SIZE: {"value": 5 << 30, "source": "broker"},
                     RETENTION_AGE: {"value": None, "source": "default"},
                     MAX_SEGMENT_SIZE: {"value": DEFAULT_MAX_SEGMENT_SIZE, "source": "default"},
                     MAX_MESSAGE_SIZE: {"value": 100, "source": "topic"}}
