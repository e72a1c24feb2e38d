"""Kafka records and stored messages: the envelope codec (property-tested), what a consumer
gets of any stored message, record batches built for Fetch, and Produce data checked and
opened (every codec a client may use, corrupt and unsupported batches refused)."""

from __future__ import annotations

import struct

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from messaging.broker.commands import validate_publish
from messaging.frames import HEADER_SIZE, Message
from messaging.kafka.records import (
    KAFKA_RECORD_TYPE,
    MAX_OFFSET_DELTA,
    PLAIN_TYPE,
    Record,
    RecordError,
    batch_end,
    framed,
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
                                  b"\x01\x01\x01\x00extra"])
def test_a_broken_envelope_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        open_envelope(data)


def test_a_fetch_batch_has_the_indexes_as_offsets_and_the_append_times() -> None:
    keyed = Record(b"k", b"v", (("h", b"1"),)).message()
    messages = [Message(100, keyed[0], 5, keyed[1]), Message(107, PLAIN_TYPE, 5, b"plain"),
                Message(108, PLAIN_TYPE, 5, b"")]
    batch = DefaultRecordBatch(record_batch([m.index for m in messages],
                                            [m.type for m in messages],
                                            [m.data for m in messages],
                                            [(100, 1000), (107, 1003), (108, None)]))
    assert batch.validate_crc() and batch.base_offset == 100
    assert [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in batch] == [
        (100, b"k", b"v", [("h", b"1")], 1000), (107, None, b"plain", [], 1003),
        (108, None, b"", [], -1)]


def _batch(codec: int, count: int = 3, producer_id: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, 0, producer_id, 0 if producer_id >= 0 else -1,
                                        0 if producer_id >= 0 else -1, 1 << 20)
    for i in range(count):
        builder.append(i, 1234, f"k{i}".encode(), b"v" * 100, [("h", str(i).encode())])
    return bytes(builder.build())


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_produced_batches_of_every_codec_open(codec: int) -> None:
    batches = produced_batches(_batch(codec) + _batch(codec, 2))
    assert [len(b.messages) for b in batches] == [3, 2]
    type_, data = batches[0].messages[1]
    assert record_of(Message(1, type_, 1, data)) == Record(b"k1", b"v" * 100, (("h", b"1"),))
    assert batches[0].producer_id == -1 and not batches[0].plain


def test_an_idempotent_batch_carries_its_producer() -> None:
    batch = produced_batches(_batch(0, producer_id=42))[0]
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (42, 0, 0)


def test_plain_records_frame_as_one_uniform_publish() -> None:
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for i in range(5):
        builder.append(i, 1234, None, b"%03d" % i, [])
    batch = produced_batches(bytes(builder.build()))[0]
    assert batch.plain
    command = framed(9, batch.messages)
    assert command.stride == HEADER_SIZE + 3 and list(command.offsets) == [
        i * (HEADER_SIZE + 3) for i in range(5)]
    assert validate_publish(bytes(command), topic=9) == command
    mixed = framed(9, [(PLAIN_TYPE, b"a"), Record(b"k", b"vv").message()])
    assert mixed.stride == 0 and validate_publish(bytes(mixed), topic=9) == mixed
    assert list(validate_publish(bytes(mixed), topic=9).offsets) == list(mixed.offsets)


def test_a_batch_ends_before_an_offset_delta_an_int32_cannot_hold() -> None:
    assert batch_end([10, 11, 12]) == 3
    assert batch_end([10, 10 + MAX_OFFSET_DELTA, 11 + MAX_OFFSET_DELTA]) == 2
    assert batch_end([5, 6 + MAX_OFFSET_DELTA]) == 1


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
        batches = produced_batches(_forged(records, count, codec))
    except RecordError:
        return  # refused with a reason, never another error (or a crash)
    assert len(batches) == 1


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


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
        produced_batches(damage(_batch(1)))
