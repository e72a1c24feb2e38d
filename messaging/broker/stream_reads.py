"""Reading a named stream: its messages after a position, through its fork lineage.

A stream's content is the pieces its lineage names (:meth:`CommittedState.lineage
<messaging.broker.state.CommittedState.lineage>`): for a fork, its source's messages up to
the fork point (a position inside one append takes only that many bytes of it), then its
own. Part of the read model: it reads committed state and committed frames only. Everything
here is blocking file I/O: call it on a thread.
"""

from __future__ import annotations

import json
from itertools import accumulate, repeat
from typing import NamedTuple, Protocol

from messaging.broker.catalog import APPEND_END, Position, Stream
from messaging.errors import BadRequestError
from messaging.frames import HEADER, HEADER_SIZE, frame_columns
from messaging.topic.reader import READ_CHUNK
from messaging.topic.view import TopicView

#: Bytes of message data one catch-up read returns at most (one message more if it is bigger).
READ_LIMIT = 1 << 20


class TopicSource(Protocol):
    """Where readers find topics."""

    def topic(self, topic_id: int) -> TopicView | None: ...


class Lineages(Protocol):
    """Where readers find a stream's pieces (the read model, or the catalog itself)."""

    def lineage(self, stream: Stream) -> list[tuple[int, Position | None, Position]]: ...


class Item(NamedTuple):
    """One message of a stream: its data and the position after it."""

    position: Position
    data: bytes
    type: int


_new_tuple = tuple.__new__


def _whole(chunk: bytes, size: int, limit: int) -> tuple[list[Item], int]:
    """The items of a chunk of whole messages, up to the one that brings ``size`` bytes of
    data to ``limit``; and the data size then. Built from the frames' columns, with no
    Python step per message unless the limit falls inside the chunk."""
    indexes, types, _topics, datas = frame_columns(chunk)
    count = len(datas)
    if size + len(chunk) >= limit:  # a chunk holds more bytes than its data: else no stop
        for taken, total in enumerate(accumulate(map(len, datas), initial=size)):
            if total >= limit:
                count = taken
                break
    datas = datas[:count]
    positions = zip(indexes[:count], repeat(0))
    items = list(map(_new_tuple, repeat(Item), zip(positions, datas, types[:count],
                                                   strict=True)))
    return items, size + sum(map(len, datas))


def read(topics: TopicSource, catalog: Lineages, stream: Stream, after: Position,
         limit: int = READ_LIMIT) -> list[Item]:
    """The stream's messages after position ``after``, up to about ``limit`` bytes of data."""
    items: list[Item] = []
    size = 0
    for topic_id, through, start in catalog.lineage(stream):
        if through is not None and after >= through:
            continue
        topic = topics.topic(topic_id)
        if topic is None:
            continue
        first = max(after[0], start[0]) + 1
        partial = through[1] if through is not None else 0
        # Bytes of the partial append already delivered (a read resuming inside it).
        skip = after[1] if through is not None and after[0] == through[0] else 0
        passed = 0  # bytes of the partial append gone by
        reader = topic.reader(first)
        stop = False
        while not stop and (size < limit or not items):
            chunk = reader.read(READ_CHUNK)
            if not chunk:
                break
            if through is None or reader.last_index <= through[0]:  # no fork point in it
                whole, size = _whole(chunk, size, limit)
                items += whole
                stop = size >= limit
                continue
            offset = 0
            while offset < len(chunk):
                index, _crc, type_, _topic, length = HEADER.unpack_from(chunk, offset)
                data = chunk[offset + HEADER_SIZE:offset + HEADER_SIZE + length]
                offset += HEADER_SIZE + length
                if through is None or index <= through[0]:
                    items.append(Item((index, 0), data, type_))
                    size += len(data)
                    if size >= limit:
                        stop = True
                        break
                    continue
                # Past the fork point: only ``partial`` bytes of the append that follows.
                begin, end = passed, passed + len(data)
                passed = end
                piece = data[max(skip - begin, 0):max(min(partial, end) - begin, 0)]
                if end >= partial or type_ == APPEND_END:
                    if piece or skip < partial:
                        items.append(Item(through, piece, APPEND_END))
                        size += len(piece)
                    stop = True
                    break
                if piece:
                    items.append(Item((through[0], end), piece, type_))
                    size += len(piece)
        if size >= limit:
            break
        if items:
            after = items[-1].position
    return items


def position_at_time(topics: TopicSource, catalog: Lineages, stream: Stream,
                     moment: int) -> Position:
    """The position just before the stream's first message appended at or after ``moment``
    (ms since the epoch), through its fork lineage; the stream's tail when none is that
    recent (the next one to come). A bisection per piece of the lineage, never a scan."""
    for topic_id, through, start in catalog.lineage(stream):
        topic = topics.topic(topic_id)
        if topic is None:
            continue
        found = topic.index_at_time(moment)
        if found is None:
            continue
        found = max(found, start[0] + 1)  # times only grow along a topic
        if through is not None and found > through[0]:
            continue  # past this piece's fork point: in a later piece, if anywhere
        return (found - 1, 0)
    return stream.tail


def next_append(topics: TopicSource, catalog: Lineages, stream: Stream, after: Position,
                ) -> list[Item]:
    """The messages of the one append that follows position ``after`` (for sub-offsets)."""
    found: list[Item] = []
    position = after
    while True:
        items = read(topics, catalog, stream, position, 1 << 20)
        if not items:
            return found
        for item in items:
            found.append(item)
            if item.type == APPEND_END:
                return found
        position = items[-1].position


def resolve_sub_offset(topics: TopicSource, catalog: Lineages, source: Stream,
                       anchor: Position, sub: int) -> Position:
    """The fork point ``sub`` messages (JSON) or bytes (others) past ``anchor``.

    Raises :class:`BadRequestError` when that is beyond the append that follows the anchor.
    """
    if sub == 0:
        return anchor
    if anchor[1]:
        raise BadRequestError("Stream-Fork-Sub-Offset is not supported past an offset that "
                              "is itself inside an append")
    append = next_append(topics, catalog, source, anchor)
    if source.json:
        if sub > len(append):
            raise BadRequestError(f"Stream-Fork-Sub-Offset {sub} is past the next append "
                                  f"({len(append)} messages)")
        return append[sub - 1].position
    total = sum(len(item.data) for item in append)
    if sub > total:
        raise BadRequestError(f"Stream-Fork-Sub-Offset {sub} is past the next append "
                              f"({total} bytes)")
    taken = 0
    last_full = anchor[0]
    for item in append:
        if taken + len(item.data) <= sub:
            taken += len(item.data)
            last_full = item.position[0]
            if taken == sub:
                return item.position
            continue
        return (last_full, sub - taken)
    return append[-1].position


def body(stream: Stream, items: list[Item]) -> bytes:
    """A catch-up answer's body: the data, or for JSON a JSON array of the messages."""
    if stream.json:
        return b"[" + b",".join(item.data for item in items) + b"]"
    return b"".join(item.data for item in items)


def json_messages(body: bytes, *, allow_empty: bool) -> list[bytes]:
    """The messages of a JSON-mode body: an array's elements (one level), or the value."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadRequestError(f"Invalid JSON: {err}") from err
    if isinstance(value, list):
        if not value and not allow_empty:
            raise BadRequestError("Empty arrays are not allowed: an append needs a message")
        return [_dump(v) for v in value]
    return [_dump(value)]


#: One encoder for every message: ``json.dumps`` with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _dump(value: object) -> bytes:
    return _ENCODER.encode(value).encode()
