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

Records and frames are converted both ways by :mod:`messaging.kafka._records`, in C: one pass
over the bytes each way, since a Python step per record made a Kafka record cost the broker
more than an HTTP frame (``bench/kafka``). A stored envelope is the record's own bytes from its
key length on, behind the version byte. Compressed batches (gzip, snappy raw or in Java's
xerial blocks, lz4, zstd: every compression a client may use) are opened with cramjam, into
at most :data:`MAX_OPENED` bytes, what one request may hold uncompressed.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cramjam
from aiokafka.record.util import decode_varint, encode_varint
from crc32c import crc32c

from messaging.broker.commands import Command
from messaging.errors import CorruptFrameError
from messaging.frames import Message
from messaging.kafka._records import KAFKA_RECORD_TYPE as KAFKA_RECORD_TYPE
from messaging.kafka._records import MAX_OFFSET_DELTA as MAX_OFFSET_DELTA
from messaging.kafka._records import PLAIN_TYPE as PLAIN_TYPE
from messaging.kafka._records import batch_of_frames, frames_of_records
from messaging.kafka._records import index_range as index_range
from messaging.kafka.protocol import MAX_REQUEST_SIZE

_VERSION = 1
_MAX_VARINT32 = 5
#: Batch header: base offset (int64) at 0, batch length (int32) at 8.
_BATCH_HEADER = struct.Struct(">qi")
#: The whole v2 batch header: base offset, length, partition leader epoch, magic, CRC,
#: attributes, last offset delta, first and max timestamps, producer id and epoch, base
#: sequence, records count. The CRC covers everything from the attributes on.
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
_ATTRIBUTES_AT = 21
_CODEC_MASK = 0x07
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_BATCH_OVERHEAD = 12  # base offset and length: the batch length counts what follows them
#: The smallest batch length: a v2 batch header is 61 bytes, 49 of them after the length.
_MIN_BATCH_LENGTH = 49
#: Records v2 attributes, low three bits: the compression codec (0: none).
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_SNAPPY = 2
#: Decompress into a buffer, the number of bytes written (an error when it is too small).
_INTO: dict[int, Callable[[bytes | memoryview, bytearray], int]] = {
    1: cramjam.gzip.decompress_into, 3: cramjam.lz4.decompress_into,
    4: cramjam.zstd.decompress_into}
_FULL = "failed to write whole buffer"
_FIRST_BUFFER = 64 << 10
#: Java clients' snappy framing: a magic header, then blocks each behind its int32 length.
_XERIAL = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16
#: The most a compressed batch's records may open to: what one request may hold uncompressed.
MAX_OPENED = MAX_REQUEST_SIZE


class RecordError(CorruptFrameError):
    """A produced record batch that cannot be stored (Kafka's CORRUPT_MESSAGE)."""


class CodecError(RecordError):
    """A batch compressed with a codec this broker cannot read."""


class RecordsTooLarge(RecordError):
    """A compressed batch whose records open to more than a request may hold."""


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
        count, at = _varint32(data, at)
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


def _varint32(data: bytes, at: int) -> tuple[int, int]:
    """The varint of an int32 at ``at``: at most 5 bytes (Java's Kafka reads no longer one)."""
    value, end = decode_varint(data, at)
    if end - at > _MAX_VARINT32 or not -(1 << 31) <= value < 1 << 31:
        raise ValueError(f"the varint at byte {at} is not an int32's")
    return value, end


def _get_bytes(data: bytes, at: int) -> tuple[bytes | None, int]:
    length, at = _varint32(data, at)
    if length < 0:  # null, as Kafka reads any negative length
        return None, at
    end = at + length
    if end > len(data):
        raise IndexError(f"{length} bytes at {at} run past the end")
    return data[at:end], end


# -- record batches ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProducedBatch:
    """One record batch of a Produce request, as the frames that store its records."""

    #: The records' frames, a validated publish of the partition's topic.
    frames: Command
    #: How many records (one sequence number each, for an idempotent producer).
    count: int
    #: The largest frame data length among them.
    largest: int
    #: Whether every record is a plain value (no key, no headers).
    plain: bool
    producer_id: int
    producer_epoch: int
    base_sequence: int


def produced_batches(data: bytes, topic: int, max_opened: int = MAX_OPENED,
                     ) -> list[ProducedBatch]:
    """The record batches of one partition's Produce data as frames of ``topic`` (v2 batches
    only: every client since Kafka 0.11 sends them), their checksums verified, compressed ones
    opened (to at most ``max_opened`` bytes each) and every record checked."""
    batches: list[ProducedBatch] = []
    view = memoryview(data)
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
        (_base, _length, _epoch, magic, crc, attributes, _last_delta, _first_time, _max_time,
         producer_id, producer_epoch, base_sequence, count) = _V2_HEADER.unpack_from(data, at)
        if magic != 2:
            raise RecordError(f"record batch magic {magic}: only v2 batches (Kafka 0.11 and "
                              "later clients) are accepted")
        if crc32c(view[at + _ATTRIBUTES_AT:end]) != crc:
            raise RecordError(f"record batch at byte {at}: checksum mismatch")
        if attributes & (_TRANSACTIONAL | _CONTROL):
            raise RecordError("transactional record batches are not supported")
        records: bytes | memoryview = view[at + _V2_HEADER.size:end]
        if attributes & _CODEC_MASK:
            records = _opened(attributes & _CODEC_MASK, records, at, max_opened)
        if count <= 0:
            raise RecordError(f"record batch at byte {at}: a record batch without records")
        try:
            body, starts, stride, largest, plain = frames_of_records(records, count, topic)
        except (ValueError, MemoryError) as err:
            raise RecordError(f"record batch at byte {at}: {err}") from err
        offsets = array("q")
        offsets.frombytes(starts)
        batches.append(ProducedBatch(Command.of(body, offsets, topic, stride), count, largest,
                                     plain, producer_id, producer_epoch, base_sequence))
        at = end
    return batches


def _opened(codec: int, records: bytes | memoryview, at: int, limit: int,
            ) -> bytes | memoryview:
    """A compressed batch's records, decompressed into at most ``limit`` bytes: a batch that
    opens to more is refused before it takes more memory (a few kilobytes of gzip can hold
    gigabytes of zeros)."""
    if codec not in CODECS or codec == 0:
        raise CodecError(f"record batch at byte {at}: unknown compression codec {codec}")
    try:
        if codec == _SNAPPY:
            return _snappy(records, at, limit)
        return _bounded(_INTO[codec], records, at, limit)
    except (ValueError, OSError, EOFError, IndexError, struct.error,
            cramjam.DecompressionError) as err:
        raise RecordError(f"record batch at byte {at}: its {CODECS[codec]} records do not "
                          f"open: {err}") from err


def _bounded(into: Callable[[bytes | memoryview, bytearray], int],
             records: bytes | memoryview, at: int, limit: int) -> memoryview:
    """Decompress into a buffer that grows fourfold (from 8 times the input) up to ``limit``."""
    size = min(limit, max(_FIRST_BUFFER, 8 * len(records)))
    while True:
        out = bytearray(size)
        try:
            return memoryview(out)[:into(records, out)]
        except cramjam.DecompressionError as err:
            if _FULL not in str(err):
                raise
            if size >= limit:
                raise RecordsTooLarge(
                    f"record batch at byte {at}: its records open to more than {limit} "
                    "bytes") from err
            size = min(limit, size * 4)


def _snappy(records: bytes | memoryview, at: int, limit: int) -> bytes:
    """Snappy records, raw or in xerial blocks (as Java clients write them); each block's
    length is read from its header before it is opened."""
    view = memoryview(records)
    if bytes(view[:len(_XERIAL)]) != _XERIAL:
        blocks = [view]
    else:
        blocks, cursor = [], _XERIAL_HEADER
        while cursor < len(view):
            size = struct.unpack_from(">i", view, cursor)[0]
            cursor += 4
            if size < 0 or cursor + size > len(view):
                raise ValueError(f"a snappy block of {size} bytes runs past the end")
            blocks.append(view[cursor:cursor + size])
            cursor += size
    total = sum(cramjam.snappy.decompress_raw_len(block) for block in blocks)
    if total > limit:
        raise RecordsTooLarge(f"record batch at byte {at}: its records open to {total} "
                              f"bytes, more than {limit}")
    return b"".join(bytes(cramjam.snappy.decompress_raw(block)) for block in blocks)


def joined(topic: int, parts: Sequence[Command]) -> Command:
    """One publish of ``topic`` made of several (in order)."""
    if len(parts) == 1:
        return parts[0]
    offsets = array("q")
    base = 0
    for part in parts:
        offsets.extend([base + start for start in part.offsets])
        base += len(part)
    strides = {part.stride for part in parts}
    stride = strides.pop() if len(strides) == 1 else 0
    return Command.of(b"".join(parts), offsets, topic, stride)


def record_batch(frames: bytes, runs: Sequence[tuple[int, int | None]]) -> tuple[bytes, int]:
    """One uncompressed v2 record batch of a topic's whole, verified frames (in index order),
    and how many of them it holds: those within :data:`MAX_OFFSET_DELTA` of the first (a
    quiet partition beside busy ones has gaps that large; the rest go in the next batch). Its
    base offset is the first frame's index; each record's timestamp is its message's append
    time from ``runs`` ((first index, time) runs covering them, as :meth:`TopicView.times`
    gives them; -1 where unknown)."""
    firsts = array("q", [first for first, _ in runs])
    stamps = array("q", [-1 if stamp is None else stamp for _, stamp in runs])
    return batch_of_frames(frames, firsts, stamps)

