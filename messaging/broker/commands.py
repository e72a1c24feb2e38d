"""Commands of the log as the state machine reads them: stamping (assigning broker indexes to
a command's messages and finding the topics, heartbeats and stream operation it holds), and
the internal heartbeat command. Pure: no I/O, so a model of the broker can drive it in memory.
"""

from __future__ import annotations

import logging
import struct
from array import array
from dataclasses import dataclass

from messaging.broker.catalog import (
    NAMED_TOPIC_BASE,
    STREAM_OP,
    Catalog,
    Decision,
    StreamOutcome,
)
from messaging.broker.subscribers import CONSUMER_OP, PositionChange, parse_consumer_command
from messaging.errors import BadRequestError, CorruptFrameError
from messaging.frames import (
    HEADER,
    HEADER_SIZE,
    INTERNAL_TYPE,
    Command,
    encode,
    set_topic,
    stamp_index,
    stamp_indexes,
)

log = logging.getLogger(__name__)

#: Internal command: data = u64 index + subscriber URL (UTF-8); the frame's topic field names
#: the topic.
SET_TOPIC_MAX_INDEX = INTERNAL_TYPE | 1
_U64 = struct.Struct(">Q")

_NAMED_RANGE = (f"topic ids from {NAMED_TOPIC_BASE} up belong to named streams: write to them "
                "through /v1/stream/{name}")


def heartbeat_command(topic: int, index: int, subscriber_id: str) -> bytes:
    """The internal frame that records a subscriber's progress."""
    return encode(SET_TOPIC_MAX_INDEX, topic, _U64.pack(index) + subscriber_id.encode())


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


def stamp(command: bytes | bytearray, index: int, catalog: Catalog) -> Stamped:
    """Assign indexes ``index + 1, ...`` to a command's messages (pure: no I/O)."""
    if isinstance(command, Command) and command.topic is not None:
        return _stamp_known(command, index)
    return _stamp(command, index, catalog)


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
            if type_ == STREAM_OP:
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
    return Stamped(first, index, runs, heartbeats, outcome)


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
