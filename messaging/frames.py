r"""The frame codec: pure functions on bytes and memoryviews, no I/O.

A frame is the wire, disk and stream format of one message (all integers big-endian)::

     0       8       12    14      22      26
    +-------+-------+-----+-------+-------+----------------+
    | index |  crc  | type| topic |length |  data ...      |
    |  u64  |  u32  | u16 |  u64  |  u32  | length bytes   |
    +-------+-------+-----+-------+-------+----------------+
                    \______________ CRC-32C ______________/

The index sits outside the checksum, so the broker stamps indexes without recomputing CRCs
and the CRC a publisher computed reaches every consumer unchanged.

Decoding tells an *incomplete* buffer (more bytes needed: the caller keeps the remaining
bytes) from a *corrupt* one (:class:`ChecksumError`, :class:`CorruptFrameError`).
"""

from __future__ import annotations

import functools
import operator
import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import NamedTuple

from crc32c import crc32c

from messaging.errors import ChecksumError, CorruptFrameError, FrameTooLargeError

#: The header, one row per field: name, struct code, meaning. Everything below (the header
#: struct, field offsets, partial unpackers) is derived from this table.
HEADER_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("index", "Q", "assigned by the broker when applied; 0 in a publish request"),
    ("crc", "I", "CRC-32C of type, topic, length and data"),
    ("type", "H", "bit 0x8000 marks broker-internal commands"),
    ("topic", "Q", "topic id"),
    ("length", "I", "data length in bytes"),
)
HEADER = struct.Struct(">" + "".join(code for _name, code, _doc in HEADER_FIELDS))
HEADER_SIZE = HEADER.size
#: Byte offset and size of each header field.
FIELD_AT: dict[str, tuple[int, int]] = {}
_offset = 0
for _name, _code, _doc in HEADER_FIELDS:
    FIELD_AT[_name] = (_offset, struct.calcsize(">" + _code))
    _offset += FIELD_AT[_name][1]


def header_unpacker(*names: str) -> struct.Struct:
    """A struct that unpacks only the named header fields (in header order), skipping the rest.

    ``header_unpacker("index", "length").unpack_from(buffer, offset)`` reads two fields of the
    frame at ``offset`` without building the others.
    """
    codes = []
    position = 0
    for name, code, _doc in HEADER_FIELDS:
        start, size = FIELD_AT[name]
        if name in names:
            if start > position:
                codes.append(f"{start - position}x")
            codes.append(code)
            position = start + size
    return struct.Struct(">" + "".join(codes))


INDEX = header_unpacker("index")
CRC_START = FIELD_AT["type"][0]  # the checksum covers everything from the type field on
LENGTH_OFFSET = FIELD_AT["length"][0]
_CHECKSUMMED_FIELDS = struct.Struct(">" + "".join(
    code for name, code, _doc in HEADER_FIELDS if FIELD_AT[name][0] >= CRC_START))
_CRC = struct.Struct(">" + dict((n, c) for n, c, _d in HEADER_FIELDS)["crc"])

INTERNAL_TYPE = 0x8000
MAX_TYPE = 0xFFFF
MAX_TOPIC = 2**64 - 1
MAX_INDEX = 2**64 - 1
#: Lengths above this can never be valid, whatever the configuration: the decoder treats them
#: as corruption rather than waiting forever for bytes that will not come.
HARD_MAX_MESSAGE_SIZE = 1 << 30
#: Frames is the media type of a body made of frames.
FRAMES_CONTENT_TYPE = "application/x-messaging-frames"

_unpack_header = HEADER.unpack_from
_unpack_index_crc_length = header_unpacker("index", "crc", "length").unpack_from  # for scan()
_pack_header = HEADER.pack_into
_LENGTH = header_unpacker("length")
_FIELD_CODE = {name: code for name, code, _doc in HEADER_FIELDS}
_TOPIC = struct.Struct(">" + dict((n, c) for n, c, _d in HEADER_FIELDS)["topic"])


class Message(NamedTuple):
    """One message: the broker-assigned index, its type, its topic and its data.

    A named tuple: immutable, hashable, no per-message dict, and built by the decoders in C
    (``tuple.__new__`` over zipped fields) for a few tenths of a microsecond less than a
    frozen dataclass costs.
    """

    index: int  # type: ignore[assignment]  # (shadows tuple.index, as intended)
    type: int
    topic: int
    data: bytes

    @property
    def time(self) -> int | None:
        """The message's append time in ms since the Unix epoch, when it was read with its
        times (``client.conn(topic, times=True)``, ``client.read(topic, times=True)``);
        None otherwise, and for a message the broker stored before times existed."""
        return None


_new_tuple = tuple.__new__


def _message(index: int, type_: int, topic: int, data: bytes) -> Message:
    message: Message = _new_tuple(Message, (index, type_, topic, data))
    return message


def _messages(indexes: Iterable[int], types: Iterable[int], topics: Iterable[int],
              datas: Iterable[bytes]) -> list[Message]:
    """Messages from their fields' columns, without a Python call per message."""
    return list(map(_new_tuple, repeat(Message), zip(indexes, types, topics, datas, strict=True)))


def _check_fields(index: int, type_: int, topic: int, length: int) -> None:
    if not 0 <= index <= MAX_INDEX:
        raise CorruptFrameError(f"index {index} out of range")
    if not 0 <= type_ <= MAX_TYPE:
        raise CorruptFrameError(f"type {type_} out of range 0..{MAX_TYPE}")
    if not 0 <= topic <= MAX_TOPIC:
        raise CorruptFrameError(f"topic {topic} out of range")
    if length > HARD_MAX_MESSAGE_SIZE:
        raise CorruptFrameError(f"data length {length} exceeds {HARD_MAX_MESSAGE_SIZE}")


def encode_into(buffer: bytearray, offset: int, index: int, type_: int, topic: int,
                data: bytes | memoryview) -> int:
    """Write one frame into ``buffer`` at ``offset`` and return the offset after it."""
    length = len(data)
    _check_fields(index, type_, topic, length)
    end = offset + HEADER_SIZE + length
    if len(buffer) < end:
        buffer.extend(bytes(end - len(buffer)))
    _pack_header(buffer, offset, index, 0, type_, topic, length)
    buffer[offset + HEADER_SIZE:end] = data
    crc = crc32c(memoryview(buffer)[offset + CRC_START:end])
    _CRC.pack_into(buffer, offset + FIELD_AT["crc"][0], crc)
    return end


def encode(type_: int, topic: int, data: bytes | memoryview, index: int = 0) -> bytes:
    """Encode one frame."""
    length = len(data)
    _check_fields(index, type_, topic, length)
    crc = crc32c(data, crc32c(_CHECKSUMMED_FIELDS.pack(type_, topic, length)))
    return HEADER.pack(index, crc, type_, topic, length) + bytes(data)


def encode_many(messages: Iterable[Message]) -> bytes:
    """Encode messages as consecutive frames."""
    buffer = bytearray()
    offset = 0
    for m in messages:
        offset = encode_into(buffer, offset, m.index, m.type, m.topic, m.data)
    return bytes(buffer)


def encode_batch(topic: int, datas: Sequence[bytes | memoryview], type_: int = 1) -> bytes:
    """Encode a publish batch: one frame per data, all for one topic, index 0.

    The CRC of the fixed fields (type, topic, length) is computed once per distinct length
    and continued over each message's data.
    """
    _check_fields(0, type_, topic, 0)
    parts: list[bytes | memoryview] = []
    append = parts.append
    pack = HEADER.pack
    fields_crc: dict[int, int] = {}
    for data in datas:
        length = len(data)
        start = fields_crc.get(length)
        if start is None:
            _check_fields(0, type_, topic, length)
            start = fields_crc[length] = crc32c(_CHECKSUMMED_FIELDS.pack(type_, topic, length))
        append(pack(0, crc32c(data, start), type_, topic, length))
        append(data)
    return b"".join(parts)


def frame_size(buffer: bytes | bytearray | memoryview, offset: int = 0) -> int | None:
    """The full size of the frame starting at ``offset``, or None if its header is incomplete."""
    if len(buffer) - offset < HEADER_SIZE:
        return None
    length: int = _LENGTH.unpack_from(buffer, offset)[0]
    return HEADER_SIZE + length


def decode(buffer: bytes | bytearray | memoryview, after: int | None = None,
           max_length: int = HARD_MAX_MESSAGE_SIZE) -> tuple[list[Message], int]:
    """Decode the complete frames at the start of ``buffer``.

    Returns the messages and the number of bytes they took; the bytes after that are an
    incomplete frame (or nothing). ``after``, when given, is the index of the previous message
    in the same topic: every index must then strictly increase. Raises
    :class:`ChecksumError` or :class:`CorruptFrameError` for a frame that can never be valid.
    """
    view = memoryview(buffer)
    size = len(view)
    messages: list[Message] = []
    append = messages.append
    offset = 0
    previous = after
    while size - offset >= HEADER_SIZE:
        index, crc, type_, topic, length = _unpack_header(view, offset)
        if length > max_length:
            raise FrameTooLargeError(f"frame at byte {offset}: data length {length} "
                                     f"exceeds {max_length}")
        end = offset + HEADER_SIZE + length
        if end > size:
            break
        if crc32c(view[offset + CRC_START:end]) != crc:
            raise ChecksumError(f"frame at byte {offset} (index {index}): checksum mismatch")
        if previous is not None:
            if index <= previous:
                raise CorruptFrameError(f"frame at byte {offset}: index {index} does not "
                                        f"follow {previous}")
            previous = index
        append(_message(index, type_, topic, bytes(view[offset + HEADER_SIZE:end])))
        offset = end
    return messages, offset


def _gather(buffer: bytes, field_name: str, stride: int, count: int) -> tuple[int, ...]:
    """One header field of every frame of a uniform buffer: the field's bytes gathered with
    one strided copy per byte, then unpacked at once."""
    at, size = FIELD_AT[field_name]
    gathered = bytearray(size * count)
    for j in range(size):
        gathered[j::size] = buffer[at + j::stride]
    return struct.unpack(f">{count}{_FIELD_CODE[field_name]}", gathered)


#: Indexes, types, topics and data of a run of frames, one sequence each.
FrameColumns = tuple[Sequence[int], Sequence[int], Sequence[int], list[bytes]]


def frame_columns(buffer: bytes) -> FrameColumns:
    """Indexes, types, topics and data of whole frames a :func:`scan` (or
    :class:`BatchDecoder`, or a topic reader) already checked, as columns: no checksum or order
    is checked again, and no object is made per message. Frames of one size are taken apart
    field by field with strided copies rather than header by header."""
    size = len(buffer)
    uniform = uniform_frames(buffer)
    if uniform is not None and uniform[0] * uniform[1] == size:
        stride, count = uniform
        datas = [buffer[offset:offset + stride - HEADER_SIZE]
                 for offset in range(HEADER_SIZE, HEADER_SIZE + count * stride, stride)]
        return (_gather(buffer, "index", stride, count), _gather(buffer, "type", stride, count),
                _gather(buffer, "topic", stride, count), datas)
    indexes: list[int] = []
    types: list[int] = []
    topics: list[int] = []
    datas = []
    offset = 0
    unpack = _unpack_header
    while size - offset >= HEADER_SIZE:
        index, _crc, type_, topic, length = unpack(buffer, offset)
        start = offset + HEADER_SIZE
        offset = start + length
        indexes.append(index)
        types.append(type_)
        topics.append(topic)
        datas.append(buffer[start:offset])
    return indexes, types, topics, datas


def decode_verified(buffer: bytes) -> list[Message]:
    """The messages of whole frames already checked (see :func:`decode_slices`)."""
    _at, messages = next(decode_slices(buffer, max(1, len(buffer))), (0, []))
    return messages


def decode_slices(buffer: bytes, size: int) -> Iterator[tuple[int, list[Message]]]:
    """The messages of whole frames already checked, ``size`` at a time, each list with the
    byte offset of its first frame.

    Made a slice at a time, messages die young when the caller is done with them before the
    next slice: a whole batch made at once waits in a list long enough to be promoted out of
    the young generation, and the full collections that brings cost more than making them.
    Frames of one size are unpacked by one struct per frame in C (no Python step each).
    """
    uniform = uniform_frames(buffer)
    if uniform is not None and uniform[0] * uniform[1] == len(buffer):
        stride, count = uniform
        unpack = _frame_struct(stride - HEADER_SIZE).iter_unpack
        view = memoryview(buffer)
        step = size * stride
        for start in range(0, count * stride, step):
            yield start, list(map(_new_tuple, repeat(Message), unpack(view[start:start + step])))
        return
    indexes, types, topics, datas = frame_columns(buffer)
    offset = 0
    for i in range(0, len(indexes), size):
        stop = i + size
        data = datas[i:stop]
        yield offset, _messages(indexes[i:stop], types[i:stop], topics[i:stop], data)
        offset += sum(map(len, data)) + HEADER_SIZE * len(data)


# _frame_struct relies on it: a Message's fields are header fields in header order, then data.
assert [n for n, _c, _d in HEADER_FIELDS if n in Message._fields] + ["data"] == [
    *Message._fields]


@functools.lru_cache(maxsize=64)
def _frame_struct(length: int) -> struct.Struct:
    """Unpacks one frame of ``length`` data bytes into a Message's fields, in order (the
    header fields a Message does not have are skipped as padding)."""
    codes = [code if name in Message._fields else f"{struct.calcsize(code)}x"
             for name, code, _doc in HEADER_FIELDS]
    return struct.Struct(">" + "".join(codes) + f"{length}s")


def decode_one(buffer: bytes | bytearray | memoryview) -> Message:
    """Decode a buffer that holds exactly one complete frame."""
    messages, used = decode(buffer)
    if len(messages) != 1 or used != len(buffer):
        raise CorruptFrameError(f"expected exactly one frame in {len(buffer)} bytes")
    return messages[0]


@dataclass(slots=True)
class FrameScan:
    """What :func:`scan` learnt about a run of frames, without a Python object per message.

    ``end`` is the offset after the last complete frame accepted; ``error`` is set when the scan
    stopped at a corrupt frame (``end`` is then that frame's offset); ``incomplete`` when the
    bytes after ``end`` are the start of a frame that needs more bytes. ``marks`` holds a
    ``(index, offset, ordinal)`` for the first frame at or past every ``mark_every`` bytes.
    """

    count: int = 0
    end: int = 0
    first_index: int = 0
    last_index: int = 0
    incomplete: bool = False
    stopped: bool = False
    error: CorruptFrameError | None = None
    marks: list[tuple[int, int, int]] = field(default_factory=list)


def scan(buffer: bytes | bytearray | memoryview, *, start: int = 0, after: int | None = None,
         verify: bool = True, stop_index: int | None = None, max_count: int | None = None,
         mark_every: int = 0, mark_base: int = 0, max_length: int = HARD_MAX_MESSAGE_SIZE,
         offsets: array[int] | None = None) -> FrameScan:
    """Verify and index the frames in ``buffer`` from ``start`` without decoding them.

    Stops before the first frame whose index is ``>= stop_index`` (``stopped``), after
    ``max_count`` frames (``stopped``), at an incomplete tail (``incomplete``) or at a corrupt
    frame (``error``, never raised: recovery truncates there, readers raise it). With
    ``verify=False`` only the headers are read (lengths and index order are still checked).
    ``mark_every`` > 0 records sparse marks; ``mark_base`` is added to their offsets.
    ``offsets``, when given, receives the start offset of every accepted frame.
    """
    view = memoryview(buffer)
    size = len(view)
    result = FrameScan(end=start)
    offset = start
    count = 0
    ordered = after is not None
    previous = after or 0
    stop = MAX_INDEX + 1 if stop_index is None else stop_index
    limit = -1 if max_count is None else max_count
    # Marks are compared in this buffer's offsets; with no marks wanted, never reached.
    next_mark = start if mark_every > 0 else size + 1
    marks = result.marks
    record = offsets.append if offsets is not None else None
    unpack = _unpack_index_crc_length
    if (start == 0 and verify and mark_every <= 0 and record is None and stop_index is None
            and max_count is None):
        prefix = _uniform_prefix(buffer, after, max_length)
        if prefix is not None:  # the rest is at most the start of one frame
            count, stride, previous = prefix
            offset = count * stride
    while count != limit:
        if size - offset < HEADER_SIZE:
            result.incomplete = offset < size
            break
        index, crc, length = unpack(view, offset)
        if length > max_length:
            result.error = FrameTooLargeError(
                f"frame at byte {offset + mark_base}: data length {length} exceeds {max_length}")
            break
        end = offset + HEADER_SIZE + length
        if end > size:
            result.incomplete = True
            break
        if index >= stop:
            result.stopped = True
            break
        if ordered and index <= previous:
            result.error = CorruptFrameError(
                f"frame at byte {offset + mark_base}: index {index} does not follow {previous}")
            break
        if verify and crc32c(view[offset + CRC_START:end]) != crc:
            result.error = ChecksumError(
                f"frame at byte {offset + mark_base} (index {index}): checksum mismatch")
            break
        if offset >= next_mark:
            marks.append((index, offset + mark_base, count))
            next_mark = offset + mark_every
        if record is not None:
            record(offset)
        previous = index
        count += 1
        offset = end
    else:
        result.stopped = True
    result.count = count
    result.end = offset
    if count:
        result.first_index = INDEX.unpack_from(view, start)[0]
        result.last_index = previous
    return result


#: Frames per body below which the per-frame walk is as quick as the strided checks.
_UNIFORM_MIN_FRAMES = 16


def same_field(body: bytes | bytearray | memoryview, start: int, size: int, stride: int,
                expected: bytes | bytearray | memoryview) -> bool:
    """Whether each of the whole frames of ``stride`` bytes at the start of ``body`` holds
    ``expected`` in the field at ``start``: one strided slice per byte, compared in C."""
    count = len(body) // stride
    end = count * stride
    return all(body[start + j:end:stride] == bytes(expected[j:j + 1]) * count
               for j in range(size))


def uniform_frames(buffer: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """``(stride, count)`` of the whole frames at the start of ``buffer`` when there are
    enough of them to be worth the strided checks and all have the first one's length (one
    strided slice per byte of the length field); ``None`` otherwise. Nothing else is checked.
    """
    if len(buffer) < HEADER_SIZE:
        return None
    stride = HEADER_SIZE + _LENGTH.unpack_from(buffer, 0)[0]
    count = len(buffer) // stride
    if count < _UNIFORM_MIN_FRAMES:
        return None
    if not same_field(buffer, LENGTH_OFFSET, FIELD_AT["length"][1], stride,
                       buffer[LENGTH_OFFSET:HEADER_SIZE]):
        return None
    return stride, count


def checksums_match(body: bytes, stride: int) -> bool:
    """Whether every frame of a uniform body carries its checksum: one ``crc32c`` call per
    frame, compared with the stored ones all at once."""
    view = memoryview(body)
    size = len(body)
    span = stride - CRC_START
    crcs = struct.pack(f">{size // stride}I", *[crc32c(view[offset:offset + span])
                                                for offset in range(CRC_START, size, stride)])
    crc_at, crc_size = FIELD_AT["crc"]
    return all(crcs[j::crc_size] == body[crc_at + j::stride] for j in range(crc_size))


def _uniform_prefix(buffer: bytes | bytearray | memoryview, after: int | None,
                    max_length: int) -> tuple[int, int, int] | None:
    """``(count, stride, last index)`` of the whole frames at the start of ``buffer`` when
    they all have the first one's length, carry their checksums and (with ``after``) indexes
    increasing from ``after``; checked with strided slices. ``None``: not so (or too few to
    be worth it): the per-frame walk then decides, and names any damage."""
    uniform = uniform_frames(buffer)
    if uniform is None or uniform[0] - HEADER_SIZE > max_length:
        return None
    stride, count = uniform
    body = bytes(buffer[:count * stride])
    indexes = _gather(body, "index", stride, count)
    if after is not None and (indexes[0] <= after
                              or not all(map(operator.lt, indexes, indexes[1:]))):
        return None
    if not checksums_match(body, stride):
        return None
    return count, stride, indexes[-1]


@dataclass(frozen=True, slots=True)
class FrameBatch:
    """Whole, verified frames over one buffer: no Python object per message until asked.

    ``offsets`` holds each frame's start in ``buffer`` when the decoder was asked for them.
    """

    buffer: bytes
    count: int
    first: int
    last: int
    offsets: array[int] | None = None
    topic: int = 0  # the topic its frames belong to, when one reader read them from one

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def messages(self) -> list[Message]:
        """Decode every message of the batch (its frames were verified when it was made)."""
        return decode_verified(self.buffer)


class BatchDecoder:
    """A streaming decoder: feed bytes as they arrive, get batches of verified frames back.

    Keeps an incomplete tail between calls (not an error while streaming; :meth:`finish` says
    when the stream ended inside a frame). With ``after`` (the index before the first
    expected frame) indexes must strictly increase. ``max_count`` bounds a batch's frames;
    ``offsets=True`` records every frame's start. Damage raises :class:`CorruptFrameError`
    (or a subclass), after the good frames before it were handed out by an earlier call.
    """

    def __init__(self, after: int | None = None, *, max_length: int = HARD_MAX_MESSAGE_SIZE,
                 max_count: int | None = None, offsets: bool = False) -> None:
        self._pending = bytearray()
        self._after = after
        self._max_length = max_length
        self._max_count = max_count
        self._offsets = offsets
        self._error: CorruptFrameError | None = None

    @property
    def pending(self) -> int:
        """How many bytes of an incomplete frame are buffered."""
        return len(self._pending)

    @property
    def last_index(self) -> int | None:
        """The index of the last frame handed out (or the ``after`` given)."""
        return self._after

    def feed(self, data: bytes | bytearray | memoryview) -> list[FrameBatch]:
        """Add ``data``; return every batch of whole frames it completes."""
        if self._error is not None:
            raise self._error
        self._pending += data
        batches: list[FrameBatch] = []
        while True:
            offsets: array[int] | None = array("q") if self._offsets else None
            result = scan(self._pending, after=self._after, max_count=self._max_count,
                          max_length=self._max_length, offsets=offsets)
            if result.count:
                batches.append(FrameBatch(bytes(self._pending[:result.end]), result.count,
                                          result.first_index, result.last_index, offsets))
                del self._pending[:result.end]
                if self._after is not None:
                    self._after = result.last_index
            if result.error is not None:
                if not batches:
                    raise result.error
                self._error = result.error  # hand out the good frames first
                return batches
            if not (result.stopped and result.count):
                return batches

    def finish(self) -> None:
        """Raise if the stream ended damaged or inside a frame."""
        if self._error is not None:
            raise self._error
        if self._pending:
            raise CorruptFrameError(f"the stream ended inside a frame ({len(self._pending)} "
                                    "bytes)")
