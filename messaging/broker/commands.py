"""The command vocabulary of the log: every command it carries is built by one function here,
and read back (stamped, decided) in one place.

- Publishes: a validated body (:class:`Command`, :func:`validate_publish`), or
  :func:`produce` for a publish with producer headers.
- Subscriber progress: :func:`heartbeat_command`; stored consumer positions:
  :func:`reset_consumer`, :func:`delete_consumer`.
- Named streams (Durable Streams): :func:`create_stream`, :func:`append_stream` (an append
  and/or a close), :func:`delete_stream`, :func:`expire_stream`; :func:`append_frames` lays
  out the messages of one append.
- Topics: :func:`configure_command`, :func:`delete_command`; the object store's manifest:
  :func:`offload_command`, :func:`expire_command`.

:func:`stamp` assigns a command's messages their broker indexes and finds the topics,
heartbeats and stream or topic operation it holds; :class:`ApplyResult` is what an applied
command answers. Pure: no I/O, so a model of the broker drives it in memory. The frame codec
itself, shared with the clients, is :mod:`messaging.frames`.
"""

from __future__ import annotations

import logging
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c

from messaging.broker.catalog import (
    APPEND_END,
    CONTINUED,
    STREAM_OP,
    Catalog,
    Decision,
    Position,
    StreamOutcome,
    stream_command,
)
from messaging.broker.subscribers import (
    CONSUMER_OP,
    DELETE,
    RESET,
    PositionChange,
    consumer_command,
    parse_consumer_command,
)
from messaging.broker.topic_settings import (
    TOPIC_OP,
    TopicOp,
    configure_command,
    delete_command,
    expire_command,
    offload_command,
    parse_settings,
    parse_topic_command,
)
from messaging.errors import (
    BadRequestError,
    ChecksumError,
    CorruptFrameError,
    FrameTooLargeError,
)
from messaging.frames import (
    CRC_START,
    FIELD_AT,
    HARD_MAX_MESSAGE_SIZE,
    HEADER,
    HEADER_FIELDS,
    HEADER_SIZE,
    INDEX,
    INTERNAL_TYPE,
    checksums_match,
    encode,
    header_unpacker,
    same_field,
    uniform_frames,
)
from messaging.placement import NAMED_TOPIC_BASE

log = logging.getLogger(__name__)

_FIELD_CODE = {name: code for name, code, _doc in HEADER_FIELDS}
_TOPIC = struct.Struct(">" + _FIELD_CODE["topic"])
_CRC = struct.Struct(">" + _FIELD_CODE["crc"])
_LENGTH = header_unpacker("length")
_TYPE = header_unpacker("type")

@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What one applied command did: its index range and the topics it touched."""

    first: int
    last: int
    topics: frozenset[int]
    stream: StreamOutcome | None = None
    created: bool = False  # a topic command created its (empty) topic

    @property
    def count(self) -> int:
        """How many messages the command held."""
        return self.last - self.first + 1 if self.last else 0


#: Internal command: data = u64 index + subscriber URL (UTF-8); the frame's topic field names
#: the topic.
SET_TOPIC_MAX_INDEX = INTERNAL_TYPE | 1
_U64 = struct.Struct(">Q")

_NAMED_RANGE = (f"topic ids from {NAMED_TOPIC_BASE} up belong to named streams: write to them "
                "through /v1/stream/{name}")


__all__ = ["ApplyResult", "Command", "configure_command", "delete_command", "expire_command",
           "offload_command", "parse_settings", "validate_publish"]


def heartbeat_command(topic: int, index: int, subscriber_id: str) -> bytes:
    """The internal frame that records a subscriber's progress."""
    return encode(SET_TOPIC_MAX_INDEX, topic, _U64.pack(index) + subscriber_id.encode())


def reset_consumer(topic: int, name: str, index: int) -> bytes:
    """The command that sets a stored consumer position in a topic to ``index`` (any way)."""
    return consumer_command(RESET, topic, name, index)


def delete_consumer(topic: int | None, name: str) -> bytes:
    """The command that forgets a consumer's position in ``topic`` (None: in every topic)."""
    return consumer_command(DELETE, topic, name)


# -- named streams and idempotent publishes (decided by messaging.broker.catalog) ---------------


@dataclass(frozen=True, slots=True)
class ForkSpec:
    """Where a new stream forks off: its source, the position it inherits through, and the
    request's own words for that position (compared when the create is repeated)."""

    source: str
    at: Position
    offset: str | None
    sub: int = 0


def append_frames(messages: Sequence[bytes]) -> bytes:
    """The frames of one append: every message but the last is CONTINUED (the stream's
    topic is set when the command is applied)."""
    last = len(messages) - 1
    return b"".join(encode(APPEND_END if i == last else CONTINUED, 0, m)
                    for i, m in enumerate(messages))


def create_stream(name: str, *, content_type: str | None, now: float,
                  ttl: int | None = None, expires_at: str | None = None,
                  expires: float | None = None, closed: bool = False,
                  fork: ForkSpec | None = None, replaces: int | None = None,
                  messages: Sequence[bytes] = ()) -> bytes:
    """The command that creates a stream (or a fork), with its first messages; repeated
    alike it changes nothing. ``replaces``: the topic of an expired stream of that name it
    takes the place of."""
    op: dict[str, Any] = {"op": "create", "name": name, "content_type": content_type,
                          "ttl": ttl, "expires_at": expires_at, "expires": expires,
                          "closed": closed, "now": now}
    if fork is not None:
        op["fork"] = {"source": fork.source, "at": list(fork.at), "offset": fork.offset,
                      "sub": fork.sub}
    if replaces is not None:
        op["replaces"] = replaces
    return stream_command(op, append_frames(messages))


def append_stream(name: str, *, now: float, messages: Sequence[bytes] = (),
                  content_type: str | None = None, close: bool = False,
                  seq: str | None = None, producer: tuple[str, int, int] | None = None,
                  ) -> bytes:
    """The command that appends one request's messages to a stream and/or closes it
    (``seq``: its ``Stream-Seq``; ``producer``: ``(id, epoch, seq)`` of an idempotent
    producer)."""
    op: dict[str, Any] = {"op": "append", "name": name, "close": close,
                          "count": len(messages), "now": now}
    if content_type is not None:
        op["content_type"] = content_type
    if seq is not None:
        op["seq"] = seq
    if producer is not None:
        op["producer"] = list(producer)
    return stream_command(op, append_frames(messages))


def delete_stream(name: str) -> bytes:
    """The command that deletes a stream (soft-deleted while forks read it)."""
    return stream_command({"op": "delete", "name": name})


def expire_stream(name: str, topic: int) -> bytes:
    """The command that deletes a stream found expired (nothing if its name holds another
    topic by then)."""
    return stream_command({"op": "expire", "name": name, "topic": topic})


def produce(topic: int, producer: tuple[str, int, int], now: float, frames: bytes,
            span: int = 1) -> bytes:
    """A native publish with producer headers: stored once however often it is sent
    (``span``: the sequence numbers it takes from ``producer``'s, see
    :func:`messaging.broker.producers.check_producer`)."""
    op: dict[str, Any] = {"op": "produce", "topic": topic, "producer": list(producer),
                          "now": now}
    if span != 1:
        op["span"] = span
    return stream_command(op, frames)


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive frames of one command for one topic, stamped; with the frames' offsets and
    first index when the command was validated (:class:`messaging.frames.Command`)."""

    frames: memoryview
    offsets: array[int] | None = None
    first: int = 0


@dataclass(frozen=True, slots=True)
class Stamped:
    """A command with indexes assigned: what the broker stages and records."""

    first: int  # its first message's index (0: it held none)
    index: int  # the broker index after it
    runs: list[tuple[int, Run]]
    heartbeats: list[PositionChange]
    stream: StreamOutcome | None
    topic_op: TopicOp | None = None  # a topic's settings or deletion (a command of its own)


def stamp(command: bytes | bytearray, index: int, catalog: Catalog) -> Stamped:
    """Assign indexes ``index + 1, ...`` to a command's messages (pure: no I/O).

    A command validated here (a :class:`Command`) or one that arrives as plain bytes (from
    the cluster's log) whose frames are all of one size, of one public type range and for
    one topic is stamped with strided copies: no Python step per message.
    """
    if isinstance(command, Command) and command.topic is not None:
        return _stamp_known(command, index)
    uniform = _uniform_publish(command)
    if uniform is not None:
        return _stamp_known(uniform, index)
    return _stamp(command, index, catalog)


def _uniform_publish(command: bytes | bytearray) -> Command | None:
    """A plain command of whole frames of one size, none internal, all for one numeric
    topic, as a :class:`Command` (their checksums were verified where the publish was
    taken); None when it is anything else (the per-frame walk stamps it)."""
    if isinstance(command, Command):
        return None
    uniform = uniform_frames(command)
    if uniform is None:
        return None
    stride, count = uniform
    if stride * count != len(command):
        return None
    topic_at, topic_size = FIELD_AT["topic"]
    type_at = FIELD_AT["type"][0]
    topic = _TOPIC.unpack_from(command, topic_at)[0]
    if topic >= NAMED_TOPIC_BASE or command[type_at::stride].translate(
            None, _PUBLIC_HIGH_BYTES):
        return None
    if not same_field(command, topic_at, topic_size, stride,
                      command[topic_at:topic_at + topic_size]):
        return None
    return Command.of(bytes(command), array("q", range(0, len(command), stride)), topic,
                      stride)


def _stamp_known(command: Command, index: int) -> Stamped:
    """Assign indexes to a validated single-topic command: no header is read again."""
    view = memoryview(bytearray(command))
    offsets = command.offsets
    assert command.topic is not None
    if command.topic >= NAMED_TOPIC_BASE:
        raise BadRequestError(_NAMED_RANGE)
    first = index + 1
    stamp_indexes(view, offsets, first, command.stride)
    index += len(offsets)
    return Stamped(first, index, [(command.topic, Run(view, offsets, first))], [], None)

def _stamp(command: bytes | bytearray, index: int, catalog: Catalog) -> Stamped:
    """Assign indexes to a command's messages.

    Returns its first index, the broker index after it, its runs of frames per topic, the
    heartbeats it records and what its stream operation did (the catalog's change is staged
    in ``catalog``, which the caller commits or rolls back). The frames after a stream
    operation (:data:`STREAM_OP`) go to that stream's topic (their topic field and checksum
    are set here) or, when the operation decides so (a retried append, a repeated create),
    are skipped.
    """
    view = memoryview(bytearray(command))
    size = len(view)
    runs: list[tuple[int, Run]] = []
    heartbeats: list[PositionChange] = []
    first = 0
    offset = run_start = 0
    run_topic = -1
    decision: Decision | None = None
    decision_first = 0
    outcome: StreamOutcome | None = None
    topic_op: TopicOp | None = None
    while offset < size:
        if size - offset < HEADER_SIZE:
            raise CorruptFrameError(f"command has an incomplete frame at byte {offset}")
        _index, _crc, type_, topic_id, length = HEADER.unpack_from(view, offset)
        end = offset + HEADER_SIZE + length
        if end > size:
            raise CorruptFrameError(f"command has an incomplete frame at byte {offset}")
        if decision is not None and not type_ & INTERNAL_TYPE:
            if decision.topic is None:  # skipped: nothing of it is stored
                offset = run_start = end
                continue
            if topic_id != decision.topic:
                if topic_id:
                    raise BadRequestError(f"a publish to topic {decision.topic} holds a "
                                          f"frame of topic {topic_id}")
                topic_id = decision.topic
                set_topic(view, offset, topic_id)
        elif topic_id >= NAMED_TOPIC_BASE and not type_ & INTERNAL_TYPE:
            raise BadRequestError(_NAMED_RANGE)
        if type_ & INTERNAL_TYPE or topic_id != run_topic:
            if run_topic >= 0 and offset > run_start:
                runs.append((run_topic, Run(view[run_start:offset])))
            run_start, run_topic = offset, topic_id
        if type_ & INTERNAL_TYPE:
            data = bytes(view[offset + HEADER_SIZE:end])
            if type_ == TOPIC_OP:
                if offset or end != size:
                    raise CorruptFrameError("a topic command is a command of its own")
                topic_op = parse_topic_command(topic_id, data)
            elif type_ == STREAM_OP:
                if decision is not None:
                    raise CorruptFrameError("a command holds one stream operation at most")
                decision = catalog.apply(data)
                decision_first = index + 1
            else:
                heartbeat = _internal(type_, topic_id, data)
                if heartbeat is not None:
                    heartbeats.append(heartbeat)
            run_start, run_topic = end, -1
        else:
            index += 1
            first = first or index
            stamp_index(view, offset, index)
        offset = end
    if run_topic >= 0 and offset > run_start:
        runs.append((run_topic, Run(view[run_start:offset])))
    if decision is not None:
        stored = index >= decision_first
        outcome = catalog.appended(decision, decision_first if stored else 0,
                                        index if stored else 0)
    return Stamped(first, index, runs, heartbeats, outcome, topic_op)


def _internal(type_: int, topic_id: int, data: bytes) -> PositionChange | None:
    """The position change an internal frame records, or None for a type this broker ignores."""
    if type_ == CONSUMER_OP:
        return parse_consumer_command(topic_id, data)
    if type_ != SET_TOPIC_MAX_INDEX:
        log.warning("ignoring unknown internal command type %#x", type_)
        return None
    if len(data) < _U64.size:
        raise CorruptFrameError("heartbeat command too short")
    try:
        subscriber_id = data[_U64.size:].decode()
    except UnicodeDecodeError as err:
        raise CorruptFrameError("heartbeat command with a subscriber id that is not UTF-8"
                                ) from err
    return PositionChange(topic_id, _U64.unpack_from(data)[0], subscriber_id)


def largest_message(run: Run) -> int:
    """The data length of the largest message in a run of complete frames."""
    frames = run.frames
    largest = offset = 0
    while offset < len(frames):
        length = _LENGTH.unpack_from(frames, offset)[0]
        largest = max(largest, length)
        offset += HEADER_SIZE + length
    return largest


def is_topic_command(command: bytes | bytearray) -> bool:
    """Whether a command is a topic's settings or deletion (:data:`TOPIC_OP`), which the
    broker applies as a group of its own."""
    return (not isinstance(command, Command) and len(command) >= HEADER_SIZE
            and _TYPE.unpack_from(command)[0] == TOPIC_OP)


# -- validating a publish body -------------------------------------------------------------------


class Command(bytes):
    """A publish body already validated: its frames' offsets, and the one topic they are for
    (None when they are for several), so the state machine and the topic need not walk the
    headers again. Where a command is replicated as plain bytes, they walk them.

    ``stride`` is the size of every frame when all are the same size (else 0): their indexes
    can then be stamped with a few strided copies instead of one call per frame.
    """

    offsets: array[int]
    topic: int | None
    stride: int

    @classmethod
    def of(cls, body: bytes, offsets: array[int], topic: int | None,
           stride: int = 0) -> Command:
        """Wrap a validated body."""
        command = cls(body)
        command.offsets = offsets
        command.topic = topic
        command.stride = stride
        return command


#: Byte values without the internal-type bit (the high byte of the type field).
_PUBLIC_HIGH_BYTES = bytes(range(INTERNAL_TYPE >> 8))


def _validate_uniform(body: bytes, topic: int | None, max_length: int) -> Command | None:
    """Validate a body whose frames all have the first frame's length, without a Python step
    per header: lengths, topics and types are checked with strided slices, and the checksums
    with one ``crc32c`` call per frame compared all at once. ``None``: the body is not like
    that, or something is wrong in it (the per-frame walk then names the first bad frame).
    """
    size = len(body)
    uniform = uniform_frames(body)
    if uniform is None or uniform[0] * uniform[1] != size or uniform[0] - HEADER_SIZE > max_length:
        return None
    stride = uniform[0]
    first_topic = _TOPIC.unpack_from(body, FIELD_AT["topic"][0])[0]
    if topic is not None and first_topic != topic:
        return None
    topic_at, topic_size = FIELD_AT["topic"]
    type_at = FIELD_AT["type"][0]
    if not (same_field(body, topic_at, topic_size, stride, body[topic_at:topic_at + topic_size])
            and not body[type_at::stride].translate(None, _PUBLIC_HIGH_BYTES)
            and checksums_match(body, stride)):
        return None
    return Command.of(body, array("q", range(0, size, stride)), first_topic, stride)


def validate_publish(body: bytes, *, topic: int | None = None,
                     max_length: int = HARD_MAX_MESSAGE_SIZE, uniform_fast: bool = True,
                     ) -> Command:
    """Check a publish body in one pass; returns it as a :class:`Command`.

    Every frame must be complete, within ``max_length``, of a public type (not broker-
    internal), for ``topic`` when one is given, and carry a matching CRC-32C. Raises
    :class:`CorruptFrameError` (or a subclass) naming the first bad frame's byte offset.
    Frames all of one size are checked with strided slices; ``uniform_fast=False`` walks
    them one by one instead (the reference the fast path is tested against).
    """
    if not body:
        raise CorruptFrameError("empty body: expected frames")
    uniform = _validate_uniform(body, topic, max_length) if uniform_fast else None
    return uniform if uniform is not None else _walk_publish(body, topic, max_length)


def _walk_publish(body: bytes, topic: int | None, max_length: int) -> Command:
    """:func:`validate_publish` one frame at a time: any body, and names the first bad frame."""
    view = memoryview(body)
    size = len(view)
    offsets: array[int] = array("q")
    record = offsets.append
    offset = 0
    first_topic = -1
    single = True
    unpack = HEADER.unpack_from
    while offset < size:
        if size - offset < HEADER_SIZE:
            raise CorruptFrameError(f"incomplete frame at byte {offset} of {size}")
        _index, crc, type_, frame_topic, length = unpack(view, offset)
        if length > max_length:
            raise FrameTooLargeError(f"frame at byte {offset}: data length {length} exceeds "
                                     f"{max_length}")
        end = offset + HEADER_SIZE + length
        if end > size:
            raise CorruptFrameError(f"incomplete frame at byte {offset} of {size}")
        if type_ & INTERNAL_TYPE:
            raise CorruptFrameError(f"frame at byte {offset}: type {type_:#x} is reserved for "
                                    "the broker")
        if topic is not None and frame_topic != topic:
            raise CorruptFrameError(f"frame at byte {offset} is for topic {frame_topic}, not "
                                    f"topicID {topic}")
        if crc32c(view[offset + CRC_START:end]) != crc:
            raise ChecksumError(f"frame at byte {offset}: checksum mismatch")
        if first_topic < 0:
            first_topic = frame_topic
        elif frame_topic != first_topic:
            single = False
        record(offset)
        offset = end
    return Command.of(body, offsets, first_topic if single else None)


# -- writing indexes and topics into frames ------------------------------------------------------


def stamp_index(buffer: bytearray | memoryview, offset: int, index: int) -> None:
    """Write the broker-assigned ``index`` into the frame at ``offset`` (the CRC is unchanged)."""
    INDEX.pack_into(buffer, offset, index)


def stamp_indexes(buffer: bytearray | memoryview, offsets: Sequence[int], first: int,
                  stride: int = 0) -> None:
    """Number the frames at ``offsets`` ``first``, ``first + 1``, ... (CRCs unchanged).

    With ``stride`` (every frame that size, the first at 0) each byte of the index field is
    written to all frames in one strided copy instead of one call per frame.
    """
    count = len(offsets)
    if not stride:
        pack = INDEX.pack_into
        for k, offset in enumerate(offsets):
            pack(buffer, offset, first + k)
        return
    at, size = FIELD_AT["index"]
    numbers = array(_FIELD_CODE["index"], range(first, first + count))  # built in C
    if sys.byteorder == "little":
        numbers.byteswap()  # the frame is big-endian
    indexes = numbers.tobytes()
    for j in range(size):
        buffer[at + j::stride] = indexes[j::size]


def set_topic(buffer: bytearray | memoryview, offset: int, topic: int) -> None:
    """Set the topic of the frame at ``offset`` and its checksum (which covers the topic)."""
    _TOPIC.pack_into(buffer, offset + FIELD_AT["topic"][0], topic)
    length = _LENGTH.unpack_from(buffer, offset)[0]
    end = offset + HEADER_SIZE + length
    _CRC.pack_into(buffer, offset + FIELD_AT["crc"][0],
                   crc32c(memoryview(buffer)[offset + CRC_START:end]))
