"""Kafka records and the broker's messages: one storage, two faces.

A record's value is the message's data, its offset the message's broker index (a partition's
offsets have gaps: the index counts every topic of the node), its timestamp the message's
append time. A record with neither key nor headers, and a value, is stored as a plain message
(type 1): an HTTP reader gets exactly the value. Any other record is stored as a message of
type :data:`KAFKA_RECORD_TYPE` whose data is an envelope:

    version (1 byte, 1) | key length (varint, -1: null) | key | value length (varint, -1:
    null) | value | header count (varint) | per header: name length (varint) | name (UTF-8) |
    value length (varint, -1: null) | value

(varints are zig-zag, as in Kafka's own record format). An HTTP reader sees the frame type and
can decode the envelope with :func:`open_envelope`. A message published over HTTP reaches a
Kafka consumer as a record with that data as its value, no key and no headers, whatever its
type (an envelope that does not decode is a plain value too).

Decoding and encoding Kafka's record batches (v2, every compression a client may use) is
aiokafka's record code (C where it is built); this module only moves between its records and
frames.
"""

from __future__ import annotations

import bisect
import struct
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import cramjam
from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.util import decode_varint, encode_varint

from messaging.broker.commands import Command
from messaging.errors import CorruptFrameError
from messaging.frames import HEADER_SIZE, Message, encode, encode_batch

#: The frame type of a message that holds a Kafka record's envelope (key and headers).
KAFKA_RECORD_TYPE = 0x4B01
#: The frame type of a plain message (data only), as HTTP publishes it by default.
PLAIN_TYPE = 1
_VERSION = 1
#: Batch header: base offset (int64) at 0, batch length (int32) at 8; records count at 57.
_BASE_OFFSET = struct.Struct(">q")
_BATCH_HEADER = struct.Struct(">qi")
_BATCH_OVERHEAD = 12  # base offset and length: the batch length counts what follows them
#: The smallest batch length: a v2 batch header is 61 bytes, 49 of them after the length.
_MIN_BATCH_LENGTH = 49
#: The largest offset delta a batch holds (an int32): a fetch's batch ends before it.
MAX_OFFSET_DELTA = (1 << 31) - 1
_MAGIC_AT = 16
#: Records v2 attributes, low three bits: the compression codec (0: none).
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class RecordError(CorruptFrameError):
    """A produced record batch that cannot be stored (Kafka's CORRUPT_MESSAGE)."""


class CodecError(RecordError):
    """A batch compressed with a codec this broker cannot read."""


Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record as a producer sent it (its timestamp is replaced by the append time)."""

    key: bytes | None
    value: bytes | None
    headers: Sequence[Header] = ()

    def message(self) -> tuple[int, bytes]:
        """The frame type and data that store it."""
        if self.key is None and not self.headers and self.value is not None:
            return PLAIN_TYPE, self.value
        return KAFKA_RECORD_TYPE, seal_envelope(self)


def seal_envelope(record: Record) -> bytes:
    """The envelope of a record with a key, headers or a null value."""
    out = bytearray((_VERSION,))
    _put_bytes(out, record.key)
    _put_bytes(out, record.value)
    encode_varint(len(record.headers), out.append)
    for name, value in record.headers:
        _put_bytes(out, name.encode())
        _put_bytes(out, value)
    return bytes(out)


def open_envelope(data: bytes) -> Record:
    """The record an envelope holds (ValueError when ``data`` is not one)."""
    if not data or data[0] != _VERSION:
        raise ValueError("not a Kafka record envelope")
    try:
        key, at = _get_bytes(data, 1)
        value, at = _get_bytes(data, at)
        count, at = decode_varint(data, at)
        headers: list[Header] = []
        for _ in range(count):
            name, at = _get_bytes(data, at)
            if name is None:
                raise ValueError("a header without a name")
            header_value, at = _get_bytes(data, at)
            headers.append((name.decode(), header_value))
    except (IndexError, UnicodeDecodeError) as err:
        raise ValueError(f"truncated Kafka record envelope: {err}") from err
    if at != len(data) or count < 0:
        raise ValueError("malformed Kafka record envelope")
    return Record(key, value, tuple(headers))


def record_of(message: Message) -> Record:
    """What a Kafka consumer gets of a stored message."""
    if message.type == KAFKA_RECORD_TYPE:
        try:
            return open_envelope(message.data)
        except ValueError:
            pass  # published over HTTP with this type: its data is the value
    return Record(None, message.data)


def _put_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        encode_varint(-1, out.append)
        return
    encode_varint(len(value), out.append)
    out += value


def _get_bytes(data: bytes, at: int) -> tuple[bytes | None, int]:
    length, at = decode_varint(data, at)
    if length < 0:
        return None, at
    end = at + length
    if end > len(data):
        raise IndexError(f"{length} bytes at {at} run past the end")
    return data[at:end], end


# -- record batches ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProducedBatch:
    """One record batch of a Produce request, as the messages that store its records."""

    #: Each record's frame type and data (see :meth:`Record.message`), in order.
    messages: list[tuple[int, bytes]]
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @property
    def plain(self) -> bool:
        """Whether every record is a plain value (no key, no headers)."""
        return all(type_ == PLAIN_TYPE for type_, _ in self.messages)


def _messages(batch: DefaultRecordBatch) -> list[tuple[int, bytes]]:
    """The messages of a batch's records (one pass; no object per record but the tuple)."""
    out: list[tuple[int, bytes]] = []
    append = out.append
    for r in batch:
        key, value, headers = r.key, r.value, r.headers
        if key is None and not headers and value is not None:
            append((PLAIN_TYPE, value))
        else:
            append((KAFKA_RECORD_TYPE, seal_envelope(Record(key, value, tuple(headers)))))
    return out


def produced_batches(data: bytes) -> list[ProducedBatch]:
    """The record batches of one partition's Produce data (v2 batches only: every client
    since Kafka 0.11 sends them), their checksums verified and compressed ones opened."""
    batches: list[ProducedBatch] = []
    at = 0
    size = len(data)
    while at < size:
        if size - at < _BATCH_OVERHEAD + _MIN_BATCH_LENGTH:
            raise RecordError(f"a truncated record batch at byte {at}")
        length = _BATCH_HEADER.unpack_from(data, at)[1]
        end = at + _BATCH_OVERHEAD + length
        if length < _MIN_BATCH_LENGTH:
            raise RecordError(f"a record batch at byte {at} is shorter than a batch header "
                              f"({length} bytes after its length field)")
        if end > size:
            raise RecordError(f"a record batch at byte {at} runs past the request's end")
        if data[at + _MAGIC_AT] != 2:
            raise RecordError(f"record batch magic {data[at + _MAGIC_AT]}: only v2 batches "
                              "(Kafka 0.11 and later clients) are accepted")
        batch = DefaultRecordBatch(data[at:end] if at or end != size else data)
        try:
            if not batch.validate_crc():
                raise RecordError(f"record batch at byte {at}: checksum mismatch")
            if batch.is_transactional or batch.is_control_batch:
                raise RecordError("transactional record batches are not supported")
            messages = _messages(batch)
        except UnsupportedCodecError as err:
            raise CodecError(str(err)) from err
        except RecordError:
            raise
        except (CorruptRecordException, ValueError, OSError, EOFError, IndexError,
                zlib.error, cramjam.DecompressionError) as err:
            # A client's bytes: damaged records, or a compressed payload that does not open
            # (each codec has its own error).
            raise RecordError(f"record batch at byte {at}: {err}") from err
        batches.append(ProducedBatch(messages, batch.producer_id, batch.producer_epoch,
                                     batch.base_sequence))
        at = end
    return batches


def framed(topic: int, messages: list[tuple[int, bytes]]) -> Command:
    """The publish command of some messages of ``topic`` (framed here, so valid by
    construction: their offsets and, when all are one size, their stride go with it)."""
    datas = [data for _, data in messages]
    if all(type_ == PLAIN_TYPE for type_, _ in messages):
        body = encode_batch(topic, datas)  # one checksum start per distinct length
    else:
        body = b"".join([encode(type_, topic, data) for type_, data in messages])
    sizes = [HEADER_SIZE + len(data) for data in datas]
    offsets = array("q", accumulate(sizes, initial=0))
    offsets.pop()
    stride = sizes[0] if min(sizes) == max(sizes) else 0
    return Command.of(body, offsets, topic, stride)


def record_batch(indexes: Sequence[int], types: Sequence[int], datas: Sequence[bytes],
                 runs: Sequence[tuple[int, int | None]]) -> bytes:
    """One uncompressed v2 record batch of a topic's messages, as columns (in index order,
    from :func:`messaging.frames.frame_columns`); each record's timestamp is its message's
    append time from ``runs`` ((first index, time) runs covering them, as
    :meth:`TopicView.times` gives them; -1 where unknown). Its base offset is the first
    message's index. Every index must be at most :data:`MAX_OFFSET_DELTA` above the first
    (see :func:`batch_end`)."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 31)
    append = builder.append
    base = indexes[0]
    bounds = [first for first, _ in runs[1:]]
    stamps = [-1 if stamp is None else stamp for _, stamp in runs]
    run, next_start = 0, bounds[0] if bounds else None
    for index, type_, data in zip(indexes, types, datas, strict=True):
        while next_start is not None and index >= next_start:
            run += 1
            next_start = bounds[run] if run < len(bounds) else None
        if type_ == KAFKA_RECORD_TYPE:
            record = record_of(Message(index, type_, 0, data))
            append(index - base, stamps[run], record.key, record.value, list(record.headers))
        else:
            append(index - base, stamps[run], None, data, [])
    batch = builder.build()
    _BASE_OFFSET.pack_into(batch, 0, base)  # not covered by the batch's checksum
    return bytes(batch)


def batch_end(indexes: Sequence[int]) -> int:
    """How many of ``indexes`` (increasing) one batch can hold: those within
    :data:`MAX_OFFSET_DELTA` of the first (a quiet partition beside busy ones has gaps that
    large)."""
    limit = indexes[0] + MAX_OFFSET_DELTA
    if indexes[-1] <= limit:
        return len(indexes)
    return bisect.bisect_right(indexes, limit)
