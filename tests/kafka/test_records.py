"""Kafka records and stored messages: the envelope codec (property-tested), what a consumer
gets of any stored message, record batches built for Fetch, and Produce data checked and
opened (every codec a client may use, corrupt and unsupported batches refused).

The conversions are C (``messaging.kafka._records``); they are checked here against aiokafka's
own record code both ways: batches aiokafka builds become exactly the frames
:meth:`Record.message` describes, and a fetched batch is byte for byte the one aiokafka's
builder makes of the same messages."""

from __future__ import annotations

import struct
from array import array

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from messaging.broker.commands import validate_publish
from messaging.frames import HEADER_SIZE, Message, decode, encode
from messaging.kafka import _records
from messaging.kafka.records import (
    KAFKA_RECORD_TYPE,
    MAX_OFFSET_DELTA,
    PLAIN_TYPE,
    Record,
    RecordError,
    RecordsTooLarge,
    index_range,
    joined,
    open_envelope,
    produced_batches,
    record_batch,
    record_of,
    seal_envelope,
)

MAYBE_BYTES = st.none() | st.binary(max_size=64)
HEADERS = st.lists(st.tuples(st.text(max_size=10), MAYBE_BYTES), max_size=4).map(tuple)
RECORDS = st.builds(Record, MAYBE_BYTES, MAYBE_BYTES, HEADERS)


@given(RECORDS)
def test_a_record_is_stored_and_read_back_whole(record: Record) -> None:
    type_, data = record.message()
    assert record_of(Message(1, type_, 2, data)) == record
    if record.key is None and not record.headers and record.value is not None:
        assert (type_, data) == (PLAIN_TYPE, record.value)  # HTTP readers get the value
    else:
        assert type_ == KAFKA_RECORD_TYPE and open_envelope(data) == record


@given(st.binary(max_size=64), st.integers(min_value=0, max_value=0xFFFF))
def test_any_stored_message_is_a_record(data: bytes, type_: int) -> None:
    record = record_of(Message(1, type_, 2, data))
    if type_ != KAFKA_RECORD_TYPE:
        assert record == Record(None, data)
    else:  # an envelope, or (published over HTTP with this type) plain data
        assert record == Record(None, data) or seal_envelope(record) == data


@pytest.mark.parametrize("data", [b"", b"\x02", b"\x01", b"\x01\x02k", b"\x01\x01\x01\x02",
                                  b"\x01\x01\x01\x00extra",
                                  b"\x01\x81\x80\x80\x80\x80\x00\x01\x00"])
def test_a_broken_envelope_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        open_envelope(data)


def test_an_envelope_reads_any_negative_length_as_null_and_no_varint_past_an_int32() -> None:
    assert open_envelope(b"\x01\x03\x01\x00") == Record(None, None)  # -2: null, as Kafka
    assert open_envelope(b"\x01\x81\x80\x80\x80\x00\x01\x00") == Record(None, None)
    overlong = b"\x01\x81\x80\x80\x80\x80\x00\x01\x00"  # 6 bytes: Java's Kafka refuses it
    message = Message(10, KAFKA_RECORD_TYPE, 1, overlong)
    (record,) = DefaultRecordBatch(record_batch(_frames([message]), [(0, 5)])[0])
    assert (record.key, record.value, record.headers) == (None, overlong, [])


def _frames(messages: list[Message]) -> bytes:
    return b"".join(encode(m.type, m.topic, m.data, m.index) for m in messages)


def test_a_fetch_batch_has_the_indexes_as_offsets_and_the_append_times() -> None:
    keyed = Record(b"k", b"v", (("h", b"1"),)).message()
    messages = [Message(100, keyed[0], 5, keyed[1]), Message(107, PLAIN_TYPE, 5, b"plain"),
                Message(108, PLAIN_TYPE, 5, b"")]
    data, count = record_batch(_frames(messages), [(100, 1000), (107, 1003), (108, None)])
    batch = DefaultRecordBatch(data)
    assert count == 3 and batch.validate_crc() and batch.base_offset == 100
    assert [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in batch] == [
        (100, b"k", b"v", [("h", b"1")], 1000), (107, None, b"plain", [], 1003),
        (108, None, b"", [], -1)]
    assert record_batch(b"", [(0, None)]) == (b"", 0)


def _built(messages: list[Message], stamps: list[int]) -> bytes:
    """What aiokafka's own builder makes of stored messages (the reference for the C code)."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 31)
    base = messages[0].index
    for message, stamp in zip(messages, stamps, strict=True):
        record = record_of(message)
        builder.append(message.index - base, stamp, record.key, record.value,
                       list(record.headers))
    batch = builder.build()
    struct.pack_into(">q", batch, 0, base)
    return bytes(batch)


STORED = st.one_of(
    RECORDS.map(Record.message),  # what a producer stored
    st.tuples(st.sampled_from([PLAIN_TYPE, KAFKA_RECORD_TYPE, 7]), st.binary(max_size=40)))


@given(st.lists(st.tuples(STORED, st.integers(1, 300)), min_size=1, max_size=30),
       st.integers(0, 2**40), st.lists(st.integers(-1, 2**41), min_size=1, max_size=5))
def test_a_fetched_batch_is_what_aiokafka_builds_of_the_messages(
        stored: list[tuple[tuple[int, bytes], int]], start: int, times: list[int]) -> None:
    indexes = []
    index = start
    for _, gap in stored:
        index += gap
        indexes.append(index)
    messages = [Message(i, type_, 3, data)
                for i, ((type_, data), _) in zip(indexes, stored, strict=True)]
    # each time holds from an evenly spaced index on; the first from before the first message
    runs = [(indexes[len(indexes) * k // len(times)] if k else 0, times[k])
            for k in range(len(times))]
    runs = [run for k, run in enumerate(runs) if k == 0 or run[0] > runs[k - 1][0]]
    stamps = [next(t for first, t in reversed(runs) if m.index >= first) for m in messages]
    data, count = record_batch(_frames(messages), runs)
    assert count == len(messages)
    if stamps[0] >= 0 and all(seal_envelope(record_of(m)) == m.data for m in messages
                              if record_of(m) != Record(None, m.data)):
        # (an envelope is carried as stored: aiokafka re-encodes a varint written longer than
        # it need be; and its builder takes a first timestamp of -1, unknown, for none)
        assert data == _built(messages, stamps)
    assert [Record(r.key, r.value, tuple(r.headers)) for r in DefaultRecordBatch(data)] == [
        record_of(m) for m in messages]
    assert [(r.offset, r.timestamp) for r in DefaultRecordBatch(data)] == list(
        zip(indexes, stamps, strict=True))


def test_a_batch_ends_before_an_offset_delta_an_int32_cannot_hold() -> None:
    def held(indexes: list[int]) -> int:
        return record_batch(_frames([Message(i, PLAIN_TYPE, 1, b"x") for i in indexes]),
                            [(0, None)])[1]
    assert held([10, 11, 12]) == 3
    assert held([10, 10 + MAX_OFFSET_DELTA, 11 + MAX_OFFSET_DELTA]) == 2
    assert held([5, 6 + MAX_OFFSET_DELTA]) == 1
    assert index_range(_frames([Message(i, PLAIN_TYPE, 1, b"x") for i in (4, 9, 30)])) == (4, 30)
    assert index_range(b"") == (-1, -1)


@given(st.binary(max_size=300))
def test_the_checksum_is_crc32c_with_the_cpu_instruction_and_without(data: bytes) -> None:
    assert _records.crc32c(data) == _records.crc32c(data, True) == crc32c(data)


def _batch(codec: int, count: int = 3, producer_id: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, 0, producer_id, 0 if producer_id >= 0 else -1,
                                        0 if producer_id >= 0 else -1, 1 << 20)
    for i in range(count):
        builder.append(i, 1234, f"k{i}".encode(), b"v" * 100, [("h", str(i).encode())])
    return bytes(builder.build())


def _stored(frames: bytes) -> list[tuple[int, bytes]]:
    """The (type, data) of each frame, every checksum verified."""
    messages, _rest = decode(frames)
    return [(m.type, m.data) for m in messages]


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_produced_batches_of_every_codec_open(codec: int) -> None:
    batches = produced_batches(_batch(codec) + _batch(codec, 2), 1)
    assert [b.count for b in batches] == [3, 2]
    type_, data = _stored(batches[0].frames)[1]
    assert record_of(Message(1, type_, 1, data)) == Record(b"k1", b"v" * 100, (("h", b"1"),))
    assert batches[0].producer_id == -1 and not batches[0].plain


@given(st.lists(RECORDS, min_size=1, max_size=20), st.sampled_from([0, 1, 2, 3, 4]))
def test_a_produced_batch_becomes_the_frames_its_records_are_stored_as(
        records: list[Record], codec: int) -> None:
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 30)
    for i, record in enumerate(records):
        builder.append(i, 1234 + i, record.key, record.value, list(record.headers))
    (batch,) = produced_batches(bytes(builder.build()), 6)
    assert _stored(batch.frames) == [record.message() for record in records]
    assert validate_publish(bytes(batch.frames), topic=6) == batch.frames
    assert list(validate_publish(bytes(batch.frames), topic=6).offsets) == list(
        batch.frames.offsets)
    assert batch.count == len(records) and batch.largest == max(
        len(record.message()[1]) for record in records)
    assert batch.plain == all(record.message()[0] == PLAIN_TYPE for record in records)


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_a_compressed_batch_opens_to_no_more_than_the_limit(codec: int) -> None:
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 30)
    for i in range(20):
        builder.append(i, 1234, None, bytes(100_000), [])  # 2 MB of zeros, a few KB packed
    data = bytes(builder.build())
    assert len(data) < 100_000
    with pytest.raises(RecordsTooLarge, match="open to"):
        produced_batches(data, 1, max_opened=1 << 20)
    (batch,) = produced_batches(data, 1, max_opened=4 << 20)  # from a small buffer up
    assert batch.count == 20 and batch.largest == 100_000


def test_an_idempotent_batch_carries_its_producer() -> None:
    batch = produced_batches(_batch(0, producer_id=42), 1)[0]
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (42, 0, 0)


def test_plain_records_frame_as_one_uniform_publish() -> None:
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for i in range(5):
        builder.append(i, 1234, None, b"%03d" % i, [])
    batch = produced_batches(bytes(builder.build()), 9)[0]
    assert batch.plain
    command = batch.frames
    assert command.stride == HEADER_SIZE + 3 and list(command.offsets) == [
        i * (HEADER_SIZE + 3) for i in range(5)]
    assert validate_publish(bytes(command), topic=9) == command
    keyed = produced_batches(_batch(0, 2), 9)[0].frames
    mixed = joined(9, [command, keyed])
    assert mixed.stride == 0 and validate_publish(bytes(mixed), topic=9) == mixed
    assert list(validate_publish(bytes(mixed), topic=9).offsets) == list(mixed.offsets)
    assert joined(9, [command, command]).stride == command.stride


def _forged(records: bytes, count: int, codec: int) -> bytes:
    """A batch whose checksum is right over whatever ``records`` hold (as a hostile client
    can make one): only the record code stands between it and the broker."""
    covered = struct.pack(">hiqqqhii", codec, count - 1, 1000, 1000, -1, -1, -1, count) + records
    body = struct.pack(">ib", 0, 2) + struct.pack(">I", crc32c(covered)) + covered
    return struct.pack(">qi", 0, len(body)) + body


@given(st.binary(max_size=80), st.sampled_from([1, 2, 3, 100, 2**31 - 1]),
       st.sampled_from([0, 1, 2, 3, 4]))
def test_a_forged_batch_with_a_good_checksum_opens_or_is_refused(
        records: bytes, count: int, codec: int) -> None:
    try:
        batches = produced_batches(_forged(records, count, codec), 1)
    except RecordError:
        return  # refused with a reason, never another error (or a crash)
    assert len(batches) == 1


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


def _record(body: bytes) -> bytes:
    """One record: its length (a one-byte varint), then ``body``."""
    return bytes([len(body) << 1]) + body


@pytest.mark.parametrize(("records", "count", "codec", "reason"), [
    # a key length written in 6 bytes (Java's Kafka reads at most 5)
    (_record(b"\x00\x00\x00\x83\x80\x80\x80\x80\x00k\x02v\x00"), 1, 0, "key"),
    (_record(b"\x00\x00\x00\x01\x02v\x00") * 2, 2**31 - 1, 0, "cannot fit"),
    (_record(b"\x00\x00\x00\x01\x02v\x00") + b"\x00", 1, 0, "follow the last record"),
    (_record(b"\x00\x00\x00\x01\x02v\x02\x01\x00"), 1, 0, "headers"),  # a null name
    (_record(b"\x00\x00\x00\x01\x02v\x02\x02\xff\x00"), 1, 0, "UTF-8"),
    (b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00", 1, 2, "snappy"),
])
def test_a_batch_whose_records_are_malformed_is_refused_with_the_reason(
        records: bytes, count: int, codec: int, reason: str) -> None:
    with pytest.raises(RecordError, match=reason):
        produced_batches(_forged(records, count, codec), 1)


def test_a_record_with_a_negative_key_length_is_a_null_key_as_kafka_reads_it() -> None:
    (batch,) = produced_batches(_forged(_record(b"\x00\x00\x00\x05\x02v\x00"), 1, 0), 1)
    assert _stored(batch.frames) == [(PLAIN_TYPE, b"v")]  # no key, no headers: plain


def test_runs_may_come_in_any_buffer() -> None:
    frames = _frames([Message(i, PLAIN_TYPE, 1, b"x") for i in (4, 9)])
    firsts, stamps = (b"\x00" + bytes(array("q", [0, 9]))), b"\x00" + bytes(array("q", [7, 8]))
    data, count = _records.batch_of_frames(frames, memoryview(firsts)[1:],
                                           memoryview(stamps)[1:])
    assert count == 2 and [r.timestamp for r in DefaultRecordBatch(data)] == [7, 8]
    with pytest.raises(ValueError, match="one stamp per run"):
        _records.batch_of_frames(frames, b"\x00" * 9, b"\x00" * 9)


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda b: b[:-1], "runs past"),
    (lambda b: b[:20], "truncated"),
    (lambda b: b[:8] + struct.pack(">i", 8) + b[12:], "shorter than a batch header"),
    (lambda b: b[:8] + struct.pack(">i", 48) + b[12:], "shorter than a batch header"),
    (lambda b: b[:10], "truncated"),
    (lambda b: _flip(b, len(b) - 3), "checksum"),
    (lambda b: _flip(b, 16), "magic"),
])
def test_a_damaged_batch_is_refused_with_the_reason(damage: object, reason: str) -> None:
    assert callable(damage)
    with pytest.raises(RecordError, match=reason):
        produced_batches(damage(_batch(1)), 1)
