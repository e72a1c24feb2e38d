"""The catalog: named topics (streams), their metadata, forks and producer state.

Every change is a command in the log (a broker-internal frame of type :data:`STREAM_OP`
followed by the frames it appends), applied by :meth:`Catalog.apply` inside the broker's
group transaction: the catalog is durable, replicated, in snapshots and replayed exactly as
the topics are. Validation that decides what a command does (does the stream exist, is it
closed, is this producer fenced, is this a retry) happens here, in the state machine, so that
the answer is the same on every node and after every replay.

A stream's offsets are positions ``(index, part)``: ``index`` is the broker index of the last
message at or before the position; ``part`` counts bytes (or, for JSON, nothing: JSON forks
resolve to whole messages) of the append that follows it, which only a fork boundary inside
one append needs. Tokens are ``f"{index:020d}_{part:010d}"``: fixed width, so they sort as
strings sort.

Rules this module documents:

- ``Stream-Seq`` is scoped per stream (one writer sequence for all writers of a stream).
- Producer state (``Producer-Id`` → epoch, last seq) is kept per stream; an entry unused for
  :data:`PRODUCER_TTL` (7 days, by the log's time: the command's append time) is
  dropped at the stream's next append, and a stream keeps at most :data:`MAX_PRODUCERS`
  (the least recently used goes first; among equally old ones, by id).
- A fork is a reference ``(source, position)``, never a copy; a stream with forks that is
  deleted is soft-deleted (410 to its own readers and writers) until its last fork is gone.

This module is over 600 lines because it holds every rule of the Durable Streams state
machine (create, append, close, fork, delete, expiry, idempotent producers) beside the
staging overlay those rules change, down to single producers (copied once per group,
changed and undone one at a time, journaled as changes): splitting them apart would put a
rule's check and its change, or a change and its undo, in two places. What needs no
overlay (validation, expiry, the journal's encoding of a producer) is in
:mod:`messaging.broker.producers`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from messaging.broker.producers import (
    MAX_PRODUCERS,
    PRODUCER_TTL,
    Producer,
    apply_changes,
    check_producer,
    expired_producers,
    state_list,
)
from messaging.broker.topic_settings import TopicTable
from messaging.errors import (
    BadRequestError,
    CorruptFrameError,
    StreamClosedError,
    StreamConflictError,
    StreamGoneError,
    StreamNotFoundError,
)
from messaging.frames import INTERNAL_TYPE, encode
from messaging.placement import NAMED_TOPIC_BASE

#: Internal command: JSON describing a catalog operation; the frames after it in the same
#: command are the data it appends (their topic field is set when applied).
STREAM_OP = INTERNAL_TYPE | 2
#: Frame type of a stream message that ends an append; a message that an append continues
#: after (one item of a JSON batch, or one piece of a body over the message size) has
#: :data:`CONTINUED`.
APPEND_END = 1
CONTINUED = 2

Position = tuple[int, int]


def token(position: Position) -> str:
    """The offset token of a position (sorts as the positions do)."""
    return f"{position[0]:020d}_{position[1]:010d}"


def parse_token(text: str) -> Position | None:
    """The position of an offset token (``digits_digits``), or None if it is not one."""
    index, sep, part = text.partition("_")
    if (not sep or not 0 < len(index) <= 20 or not 0 < len(part) <= 20
            or not index.isascii() or not part.isascii() or not index.isdigit()
            or not part.isdigit()):
        return None
    return int(index), int(part)


def media_type(content_type: str) -> str:
    """A content type compared as the protocol compares them: no parameters, lower case."""
    return content_type.split(";", 1)[0].strip().lower()


@dataclass(slots=True)
class Fork:
    """Where a fork branches off: its source stream and the last position it inherits.

    ``offset``/``sub`` are the request's own words, compared when the create is repeated.
    """

    source: str
    at: Position
    offset: str | None
    sub: int


@dataclass(slots=True)
class Stream:
    """A named topic and its metadata."""

    name: str
    topic: int
    content_type: str
    created: float
    ttl: int | None = None
    expires_at: str | None = None
    expires: float | None = None  # expires_at as a POSIX time
    closed: bool = False
    closed_by: tuple[str, int, int] | None = None
    fork: Fork | None = None
    forks: int = 0
    deleted: bool = False
    tail: Position = (0, 0)
    seq: str | None = None
    producers: dict[str, Producer] = field(default_factory=dict)

    @property
    def json(self) -> bool:
        """Whether the stream is in JSON mode (messages are JSON values)."""
        return media_type(self.content_type) == "application/json"

    def saved(self) -> dict[str, Any]:
        """The stream as kept in ``broker.json`` and snapshots."""
        return asdict(self)

    @classmethod
    def restore(cls, data: dict[str, Any]) -> Stream:
        """The stream from :meth:`saved`."""
        fork = data.get("fork")
        closed_by = data.get("closed_by")
        return cls(**{
            **data,
            "tail": tuple(data.get("tail", (0, 0))),
            "closed_by": tuple(closed_by) if closed_by else None,
            "fork": Fork(fork["source"], tuple(fork["at"]), fork.get("offset"),
                         int(fork.get("sub", 0))) if fork else None,
            "producers": {k: Producer(**v) for k, v in data.get("producers", {}).items()},
        })


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """What an applied stream command did, for the answer to its request."""

    name: str
    tail: Position
    closed: bool
    created: bool = False
    duplicate: bool = False
    producer: tuple[int, int] | None = None  # (epoch, highest accepted seq)
    content_type: str = ""
    first: int = 0  # a native publish's index range (a duplicate's: the original's)
    last: int = 0


def stream_command(op: dict[str, Any], frames: bytes = b"") -> bytes:
    """A command for the catalog: the operation, then the frames it appends."""
    return encode(STREAM_OP, 0, json.dumps(op, separators=(",", ":")).encode()) + frames


@dataclass(slots=True)
class Decision:
    """What the frames after a stream operation become: appended to ``topic``, or skipped."""

    topic: int | None
    op: dict[str, Any]


_MISSING = object()


class Catalog:
    """Streams by name, changed only by :meth:`apply` (the broker's writer thread).

    The group being applied changes an overlay that :meth:`commit` folds in and
    :meth:`rollback` drops (to a savepoint): readers on other threads see only committed
    streams, and a stream is replaced whole, never changed in place.
    """

    def __init__(self, first_topic: int = NAMED_TOPIC_BASE) -> None:
        #: The id the first stream gets (named topics have ids from 2^63 up; in a cluster of
        #: topic groups each group has its own range:
        #: :func:`messaging.placement.first_named_topic`).
        self.first_topic = first_topic
        self.streams: dict[str, Stream] = {}
        self.by_topic: dict[int, str] = {}
        self.next_topic = self._committed_next = first_topic
        self._pending: dict[str, Stream | None] = {}  # None: removed by the group
        #: Idempotent producers of numeric topics (native publishes), by topic.
        self.native: dict[int, dict[str, Producer]] = {}
        self._native_pending: dict[int, dict[str, Producer]] = {}
        #: The time of the command being decided (ms since the epoch, the log's: the same
        #: on every node, held within the cluster's clock bound); None: the one the
        #: receiving node wrote into it (``now``), for commands applied without a time.
        self.command_time: int | None = None
        # A lower bound of the last use of every producer of a native topic or a stream
        # (absent: unknown); only ever too low, never too high (see _expired).
        self._oldest: dict[int | str, float] = {}
        # (name or native topic, overlay entry before, or _MISSING)
        self._undo: list[tuple[str | int | tuple[int | str, str], Any]] = []
        self.dirty = False
        self.removed: list[int] = []  # topics whose files the committed group frees
        self.changed: set[int] = set()  # topics whose stream metadata changed
        #: Per-topic settings and deletions (:mod:`messaging.broker.topic_settings`): changed
        #: by commands in the same transactions, saved and restored with the streams.
        self.topic_settings = TopicTable()

    # -- persistence ------------------------------------------------------------------------

    def saved(self) -> dict[str, Any]:
        """The catalog as kept in ``broker.json`` and snapshots: the committed streams with
        the group being applied (it is saved just before it commits)."""
        streams = {**self.streams, **self._pending}
        native = {**self.native, **self._native_pending}
        return {"next_topic": self.next_topic,
                "streams": [s.saved() for s in streams.values() if s is not None],
                "native": {str(topic): {pid: asdict(state) for pid, state in producers.items()}
                           for topic, producers in native.items() if producers},
                "topics": self.topic_settings.saved()}

    def restore(self, data: dict[str, Any] | None) -> None:
        """Replace everything with :meth:`saved` output (None: empty)."""
        data = data or {}
        self.next_topic = self._committed_next = int(data.get("next_topic", self.first_topic))
        streams = {}
        for item in data.get("streams", []):
            stream = Stream.restore(item)
            streams[stream.name] = stream
        self.streams = streams
        self.by_topic = {s.topic: s.name for s in streams.values()}
        self.native = {int(topic): {pid: Producer(**state) for pid, state in producers.items()}
                       for topic, producers in data.get("native", {}).items()}
        self._oldest.clear()
        self._native_pending.clear()
        self._pending.clear()
        self._undo.clear()
        self.removed.clear()
        self.changed.clear()
        self.topic_settings.restore(data.get("topics"))
        self.dirty = False

    def changes(self) -> dict[str, Any]:
        """What the group being applied changed (for the catalog's journal,
        :mod:`messaging.broker.state_log`): whole per stream; per native topic, only the
        producers the group changed or dropped (``producers``: pid -> ``[epoch, seq, used,
        first, last]``, or null when dropped), or the whole table where the group replaced
        it (``native``: a deletion forgot it). A topic that has seen thousands of producers
        costs a publish one entry, not thousands."""
        whole: dict[str, Any] = {}
        delta: dict[str, Any] = {}
        touched: dict[int | str, set[str]] = {}
        for key, _before in self._undo:
            if isinstance(key, tuple):
                touched.setdefault(key[0], set()).add(key[1])
        for topic, producers in self._native_pending.items():
            if isinstance(producers, _Replaced):
                whole[str(topic)] = {pid: asdict(state) for pid, state in producers.items()}
            else:
                delta[str(topic)] = {pid: state_list(producers.get(pid))
                                     for pid in sorted(touched.get(topic, ()))}
        streams: dict[str, Any] = {}
        stream_delta: dict[str, Any] = {}
        for name, stream in self._pending.items():
            committed = self.streams.get(name)
            if stream is None or committed is None or committed.topic != stream.topic:
                streams[name] = stream.saved() if stream is not None else None
                continue
            # The same stream changed: its fields, and only the producers the group changed.
            streams[name] = replace(stream, producers={}).saved()
            del streams[name]["producers"]
            changed = touched.get(name)
            if changed:
                stream_delta[name] = {pid: state_list(stream.producers.get(pid))
                                      for pid in sorted(changed)}
        changes = {"next_topic": self.next_topic,
                   "streams": streams,
                   "native": whole,
                   "topics": self.topic_settings.changes()}
        if delta:
            changes["producers"] = delta
        if stream_delta:
            changes["stream_producers"] = stream_delta
        return changes

    def replay(self, changes: dict[str, Any]) -> None:
        """Apply a journal line written by :meth:`changes` (at start-up)."""
        self.next_topic = self._committed_next = int(changes.get("next_topic",
                                                                 self.next_topic))
        for name, saved in changes.get("streams", {}).items():
            old = self.streams.pop(name, None)
            if old is not None:
                self.by_topic.pop(old.topic, None)
                if saved is None or saved.get("topic") != old.topic:
                    self.topic_settings.forget({old.topic})
            if saved is not None:
                stream = Stream.restore(saved)
                if "producers" not in saved and old is not None and old.topic == stream.topic:
                    stream.producers = old.producers  # unchanged but for stream_producers
                self.streams[name] = stream
                self.by_topic[stream.topic] = name
        for name, delta in changes.get("stream_producers", {}).items():
            apply_changes(self.streams[name].producers, delta)  # in place, as above
        for topic, producers in changes.get("native", {}).items():
            if producers:
                self.native[int(topic)] = {pid: Producer(**state)
                                           for pid, state in producers.items()}
            else:  # forgotten with its topic's deletion
                self.native.pop(int(topic), None)
        self._oldest.clear()
        for topic, delta in changes.get("producers", {}).items():
            # In place: nothing reads the catalog while the journal is replayed.
            table = self.native.setdefault(int(topic), {})
            apply_changes(table, delta)
            if not table:
                del self.native[int(topic)]
        self.topic_settings.replay(changes.get("topics", {}))

    # -- transactions -----------------------------------------------------------------------

    def mark(self) -> tuple[int, int, int, int]:
        """A savepoint for :meth:`rollback`."""
        return len(self._undo), len(self.removed), self.next_topic, self.topic_settings.mark()

    def rollback(self, mark: tuple[int, int, int, int] | None = None) -> None:
        """Undo every change since ``mark`` (None: since the last :meth:`commit`)."""
        undo, removed, next_topic, settings = mark or (0, 0, self._committed_next, 0)
        self.topic_settings.rollback(settings)
        while len(self._undo) > undo:
            key, before = self._undo.pop()
            if isinstance(key, tuple):  # one producer of a table the group copied
                self._oldest.pop(key[0], None)  # an undone removal may bring an older one
                owner = key[0]
                if isinstance(owner, str):  # a stream's: the group's copy of the stream
                    pending_stream = self._pending[owner]
                    assert pending_stream is not None
                    table = pending_stream.producers
                else:
                    table = self._native_pending[owner]
                if before is _MISSING:
                    table.pop(key[1], None)
                else:
                    table[key[1]] = before
                continue
            pending: dict[Any, Any] = (self._native_pending if isinstance(key, int)
                                       else self._pending)
            if before is _MISSING:
                pending.pop(key, None)
            else:
                pending[key] = before
        self.next_topic = next_topic
        del self.removed[removed:]
        if mark is None:
            self.changed.clear()

    @property
    def pending(self) -> bool:
        """Whether the group being applied changed the catalog (it must be saved with it)."""
        return (bool(self._pending) or bool(self._native_pending)
                or self.next_topic != self._committed_next or self.topic_settings.pending)

    def commit(self) -> tuple[list[int], set[int]]:
        """Fold the group's changes in; returns the topics to remove and those whose stream
        changed (closed, deleted)."""
        if self.pending:
            self.dirty = True
        for name, stream in self._pending.items():
            # One store per stream, never pop-then-set: readers on other threads always find
            # a stream that exists.
            old = self.streams.get(name)
            if stream is not None:
                self.by_topic[stream.topic] = name
                self.streams[name] = stream
            else:
                self.streams.pop(name, None)
            if old is not None and (stream is None or old.topic != stream.topic):
                self.by_topic.pop(old.topic, None)
        for topic, producers in self._native_pending.items():
            if producers:
                self.native[topic] = producers
            else:  # forgotten with its topic's deletion
                self.native.pop(topic, None)
        self.topic_settings.commit()
        self.topic_settings.forget(set(self.removed))  # a deleted stream's settings go with it
        self._pending.clear()
        self._native_pending.clear()
        self._undo.clear()
        self._committed_next = self.next_topic
        removed, self.removed = self.removed, []
        changed, self.changed = self.changed, set()
        return removed, changed

    def _get(self, name: str) -> Stream | None:
        """A stream as the group being applied sees it."""
        if name in self._pending:
            return self._pending[name]
        return self.streams.get(name)

    def forget_producers(self, topic: int) -> None:
        """Forget a numeric topic's idempotent producers, in the group being applied (its
        deletion): a producer re-sending a request the deleted topic had taken then starts
        again instead of being answered as a duplicate of data that is gone."""
        if self._native_pending.get(topic, self.native.get(topic)):
            self._set_native(topic, _Replaced())

    def producers(self, topic: int) -> dict[str, Producer]:
        """A numeric topic's committed idempotent producers (a copy)."""
        return dict(self.native.get(topic, {}))

    def _set_native(self, topic: int, producers: dict[str, Producer]) -> None:
        self._undo.append((topic, self._native_pending.get(topic, _MISSING)))
        self._native_pending[topic] = producers

    def _native_table(self, topic: int) -> dict[str, Producer]:
        """The group's own copy of a topic's producers, made at its first change in the
        group (the committed table, which other threads read, never changes in place); the
        group's later changes go into it one producer at a time (:meth:`_put_producer`)."""
        table = self._native_pending.get(topic)
        if table is None:
            table = dict(self.native.get(topic, {}))
            self._set_native(topic, table)
        return table

    def _expired(self, owner: int | str, table: dict[str, Producer], now: float) -> list[str]:
        """:func:`expired_producers` of a native topic's or a stream's table (``owner``: the
        topic or the stream's name), without looking at every
        producer on every publish: a lower bound of their last use (``_oldest``) shows when
        none can have expired. Exactly the same answer as a scan, so every node agrees."""
        oldest = self._oldest.get(owner)
        if oldest is not None and now - oldest <= PRODUCER_TTL and len(table) <= MAX_PRODUCERS:
            self._oldest[owner] = min(oldest, now)
            return []
        gone = expired_producers(table, now)
        dropped = set(gone)
        self._oldest[owner] = min((s.used for p, s in table.items() if p not in dropped),
                                  default=now)
        return gone

    def _put_producer(self, topic: int, table: dict[str, Producer], pid: str,
                      state: Producer | None) -> None:
        """Set (or, with None, drop) one producer in the group's copy, undoably."""
        self._undo.append(((topic, pid), table.get(pid, _MISSING)))
        if state is None:
            del table[pid]
        else:
            table[pid] = state

    def _set(self, name: str, stream: Stream | None) -> None:
        self._undo.append((name, self._pending.get(name, _MISSING)))
        self._pending[name] = stream

    def _replace(self, stream: Stream) -> Stream:
        """A copy of ``stream`` to change within the group. Its producers are shared with
        ``stream`` until the group changes one (:meth:`_stream_producers`): an append to a
        stream that has seen thousands of producers copies none of them."""
        copy = replace(stream)
        self._set(stream.name, copy)
        return copy

    def _stream_producers(self, stream: Stream) -> dict[str, Producer]:
        """The producers of ``stream`` (a copy this group made with :meth:`_replace`) to
        change: the committed stream's table is copied once per group, never changed in
        place (other threads read it)."""
        committed = self.streams.get(stream.name)
        if committed is not None and stream.producers is committed.producers:
            stream.producers = dict(committed.producers)
        return stream.producers

    def _put_stream_producer(self, stream: Stream, pid: str, state: Producer | None) -> None:
        """Set (or, with None, drop) one producer of a stream the group changes, undoably."""
        table = stream.producers
        self._undo.append(((stream.name, pid), table.get(pid, _MISSING)))
        if state is None:
            del table[pid]
        else:
            table[pid] = state

    def _add(self, stream: Stream) -> None:
        self._set(stream.name, stream)

    def _drop(self, stream: Stream) -> None:
        self._set(stream.name, None)
        self.removed.append(stream.topic)

    # -- reading ----------------------------------------------------------------------------

    @property
    def committed_next_topic(self) -> int:
        """The id the next stream gets, as of the last committed group."""
        return self._committed_next

    def get(self, name: str) -> Stream | None:
        """The stream of that name (soft-deleted ones too), or None."""
        return self.streams.get(name)

    def name_of(self, topic_id: int) -> str | None:
        """The name of a named topic."""
        return self.by_topic.get(topic_id)

    def lineage(self, stream: Stream) -> list[tuple[int, Position | None, Position]]:
        """The pieces a reader of ``stream`` goes through, oldest first.

        Each is ``(topic, through, after)``: the topic's messages after position ``after``
        up to position ``through`` (None: no end); a fork ends its source's piece at the
        fork point.
        """
        chain: list[tuple[int, Position | None, Position]] = []
        end: Position | None = None
        current: Stream | None = stream
        while current is not None:
            start = current.fork.at if current.fork is not None else (0, 0)
            chain.append((current.topic, end, start))
            if current.fork is None:
                break
            end = current.fork.at if end is None else min(end, current.fork.at)
            current = self.streams.get(current.fork.source)
        chain.reverse()
        # Each piece starts after the previous one's end: a fork's own topic holds only
        # indexes above its fork point, so ``after`` matters only for the oldest piece.
        return [(topic, through, after if i == 0 else (0, 0))
                for i, (topic, through, after) in enumerate(chain)]

    # -- the state machine ------------------------------------------------------------------

    def apply(self, data: bytes) -> Decision:
        """Apply one stream operation; the frames after it go to ``Decision.topic``.

        Raises a :class:`MessagingError` when the command must not apply at all (the caller
        rolls the catalog back to its savepoint).
        """
        try:
            op = json.loads(data)
            kind = op["op"]
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptFrameError(f"stream command is not valid JSON: {err}") from err
        if kind == "create":
            return self._create(op)
        if kind == "append":
            return self._append(op)
        if kind in ("delete", "expire"):
            return self._delete(op)
        if kind == "produce":
            return self._produce(op)
        raise CorruptFrameError(f"unknown stream command {kind!r}")

    def settled(self, data: bytes) -> StreamOutcome | None:
        """The outcome an already applied idempotent native publish (a ``produce``
        operation) had, when the committed producer state shows it: the producer's last
        accepted request is exactly this one (same epoch and sequence number), so its index
        range is known. None otherwise (another kind of operation, or an older request)."""
        try:
            op = json.loads(data)
            if op.get("op") != "produce":
                return None
            pid, epoch, seq = str(op["producer"][0]), int(op["producer"][1]), \
                int(op["producer"][2])
            seq += int(op.get("span", 1)) - 1  # the state keeps a batch's last sequence
            state = self.native.get(int(op["topic"]), {}).get(pid)
        except (ValueError, KeyError, TypeError, IndexError):
            return None
        if state is None or (state.epoch, state.seq) != (epoch, seq) or not state.last:
            return None
        return StreamOutcome("", (state.last, 0), False, duplicate=True,
                             producer=(state.epoch, state.seq), first=state.first,
                             last=state.last)

    def appended(self, decision: Decision, first: int, last: int) -> StreamOutcome:
        """Record the data a command appended (indexes ``first``..``last``, 0 for none);
        returns its outcome."""
        op = decision.op
        native: Producer | None = op.get("native")
        if native is not None or op["op"] == "produce":
            if native is not None:
                native.first, native.last = first, last
            extra = op.get("outcome", {})
            return StreamOutcome("", (last, 0), False, **{"first": first, "last": last,
                                                           **extra})
        stream = self._get(op["name"])
        if stream is None:
            return StreamOutcome(op["name"], (0, 0), False, **op.get("outcome", {}))
        if op.get("done"):
            return StreamOutcome(stream.name, stream.tail, stream.closed,
                                 content_type=stream.content_type, **op.get("outcome", {}))
        if decision.topic is not None and (last or op.get("close")):
            stream = stream if op.get("fresh") else self._replace(stream)
            if last:
                stream.tail = (last, 0)
                producer = op.get("producer")
                state = stream.producers.get(str(producer[0])) if producer else None
                if state is not None:
                    state.first, state.last = first, last
            if op.get("close") and not stream.closed:
                stream.closed = True
                producer = op.get("producer")
                stream.closed_by = tuple(producer) if producer else None
                self.changed.add(stream.topic)
        extra = op.get("outcome", {})
        return StreamOutcome(stream.name, stream.tail, stream.closed,
                             content_type=stream.content_type, **extra)

    def _create(self, op: dict[str, Any]) -> Decision:
        name = op["name"]
        existing = self._get(name)
        if existing is not None and op.get("replaces") == existing.topic:
            self._delete({"name": name, "topic": existing.topic}, quiet=True)
            existing = self._get(name)
        wanted = self._configure(op)
        if existing is not None:
            if existing.deleted:
                raise StreamConflictError(f"stream {name!r} was deleted and is still read by "
                                          "forks: it cannot be created again yet")
            if not self._same(existing, wanted, op):
                raise StreamConflictError(f"stream {name!r} exists with another configuration")
            op["done"] = True
            op["outcome"] = {"created": False}
            op["name"] = name
            return Decision(None, op)
        topic = self.next_topic  # a function of the commands alone: the same on every node
        self.next_topic = topic + 1
        wanted.topic = topic
        if wanted.fork is not None:
            source = self._get(wanted.fork.source)
            assert source is not None
            source = self._replace(source)
            source.forks += 1
        self._add(wanted)
        op["fresh"] = True
        op["outcome"] = {"created": True}
        op["close"] = bool(op.get("closed"))
        return Decision(topic, op)

    def _configure(self, op: dict[str, Any]) -> Stream:
        """The stream a create asks for (fork inheritance applied; topic not yet chosen)."""
        name = op["name"]
        ttl = op.get("ttl")
        expires_at = op.get("expires_at")
        expires = op.get("expires")
        content_type = op.get("content_type")
        fork = None
        tail: Position = (0, 0)
        if op.get("fork"):
            spec = op["fork"]
            source = self._get(spec["source"])
            if source is None:
                raise StreamNotFoundError(f"fork source {spec['source']!r} not found")
            if source.deleted:
                raise StreamConflictError(f"fork source {spec['source']!r} was deleted")
            at = tuple(spec["at"])
            if at > source.tail:
                raise BadRequestError("Stream-Fork-Offset is beyond the source stream's tail")
            if content_type is None:
                content_type = source.content_type
            elif media_type(content_type) != media_type(source.content_type):
                raise StreamConflictError("Content-Type differs from the fork source's "
                                          f"{source.content_type!r}")
            if ttl is None and expires_at is None:
                ttl, expires_at, expires = source.ttl, source.expires_at, source.expires
            fork = Fork(source.name, at, spec.get("offset"), int(spec.get("sub", 0)))
            tail = at
        return Stream(name=name, topic=0, content_type=content_type or "application/octet-stream",
                      created=self._now(op), ttl=ttl, expires_at=expires_at,
                      expires=expires, fork=fork, tail=tail)

    def _now(self, op: dict[str, Any]) -> float:
        """A stream command's time in seconds: the log's time of the command, as a
        publish's append time (see :attr:`command_time`)."""
        if self.command_time is not None:
            return self.command_time / 1000
        return float(op.get("now", 0.0))

    @staticmethod
    def _same(existing: Stream, wanted: Stream, op: dict[str, Any]) -> bool:
        """Whether a repeated create matches the stream (content type, expiry, closure, fork)."""
        if media_type(existing.content_type) != media_type(wanted.content_type):
            return False
        if (existing.ttl, existing.expires) != (wanted.ttl, wanted.expires):
            return False
        if existing.closed != bool(op.get("closed")):
            return False
        if (existing.fork is None) != (wanted.fork is None):
            return False
        if existing.fork is not None and wanted.fork is not None:
            return (existing.fork.source, existing.fork.offset, existing.fork.sub) == (
                wanted.fork.source, wanted.fork.offset, wanted.fork.sub)
        return True

    def _append(self, op: dict[str, Any]) -> Decision:
        name = op["name"]
        stream = self._get(name)
        if stream is None:
            raise StreamNotFoundError(f"stream {name!r} not found")
        if stream.deleted:
            raise StreamGoneError(f"stream {name!r} was deleted")
        producer = op.get("producer")
        if stream.closed:
            if producer is not None and stream.closed_by == tuple(producer):
                op["done"] = True
                op["outcome"] = {"duplicate": True, "producer": (producer[1], producer[2])}
                return Decision(None, op)
            if op.get("close") and not op.get("count"):
                op["done"] = True  # closing a closed stream: idempotent
                return Decision(None, op)
            raise StreamClosedError(f"stream {name!r} is closed", token(stream.tail))
        if op.get("count") and op.get("content_type") is not None and (
                media_type(op["content_type"]) != media_type(stream.content_type)):
            raise StreamConflictError(f"Content-Type {op['content_type']!r} does not match the "
                                      f"stream's {stream.content_type!r}")
        now = self._now(op)
        outcome: dict[str, Any] = {}
        new_state: Producer | None = None
        if producer is not None:
            new_state, duplicate = check_producer(stream.producers, producer, now)
            if duplicate is not None:
                op["done"] = True
                op["outcome"] = {"duplicate": True, "producer": (duplicate.epoch, duplicate.seq)}
                return Decision(None, op)
            assert new_state is not None
            outcome["producer"] = (new_state.epoch, new_state.seq)
        seq_text = op.get("seq")
        if seq_text is not None and stream.seq is not None and seq_text <= stream.seq:
            raise StreamConflictError(f"Stream-Seq {seq_text!r} is not above the last one, "
                                      f"{stream.seq!r}")
        if new_state is not None or seq_text is not None:
            stream = self._replace(stream)
            op["fresh"] = True
            if new_state is not None and producer is not None:
                table = self._stream_producers(stream)
                self._put_stream_producer(stream, str(producer[0]), new_state)
                for pid in self._expired(stream.name, table, now):
                    self._put_stream_producer(stream, pid, None)
            if seq_text is not None:
                stream.seq = seq_text
        op["outcome"] = outcome
        return Decision(stream.topic, op)

    def _produce(self, op: dict[str, Any]) -> Decision:
        """A native publish with producer headers: deduplicated like a stream append."""
        topic = int(op["topic"])
        if topic >= NAMED_TOPIC_BASE:
            raise BadRequestError(f"topic {topic} belongs to a named stream")
        producers = self._native_pending.get(topic, self.native.get(topic, {}))
        now = self._now(op)
        span = op.get("span", 1)
        if not isinstance(span, int) or span < 1:
            raise BadRequestError(f"invalid producer span {span!r}")
        new_state, duplicate = check_producer(producers, op["producer"], now, span)
        if duplicate is not None:
            op["done"] = True
            op["outcome"] = {"duplicate": True, "producer": (duplicate.epoch, duplicate.seq),
                             "first": duplicate.first, "last": duplicate.last}
            return Decision(None, op)
        assert new_state is not None
        table = self._native_table(topic)
        self._put_producer(topic, table, str(op["producer"][0]), new_state)
        for pid in self._expired(topic, table, now):
            self._put_producer(topic, table, pid, None)
        op["native"] = new_state
        op["outcome"] = {"producer": (new_state.epoch, new_state.seq)}
        return Decision(topic, op)

    def _delete(self, op: dict[str, Any], *, quiet: bool = False) -> Decision:
        name = op["name"]
        stream = self._get(name)
        expiring = op.get("op") == "expire" or quiet
        if stream is None or (op.get("topic") is not None and stream.topic != op["topic"]):
            if expiring:
                op["done"] = True
                return Decision(None, op)
            raise StreamNotFoundError(f"stream {name!r} not found")
        if stream.deleted:
            if expiring:
                op["done"] = True
                return Decision(None, op)
            raise StreamGoneError(f"stream {name!r} was deleted")
        if stream.forks:
            stream = self._replace(stream)
            stream.deleted = True
            self.changed.add(stream.topic)
        else:
            self._collect(stream)
        op["done"] = True
        return Decision(None, op)

    def _collect(self, stream: Stream) -> None:
        """Remove a stream nobody reads through any more, and sources it kept alive."""
        current: Stream | None = stream
        while current is not None:
            self._drop(current)
            self.changed.add(current.topic)
            if current.fork is None:
                return
            source = self._get(current.fork.source)
            if source is None:
                return
            source = self._replace(source)
            source.forks -= 1
            current = source if source.deleted and source.forks <= 0 else None

    # -- expiry -----------------------------------------------------------------------------

    @staticmethod
    def expired(stream: Stream, now: float, last_used: float) -> bool:
        """Whether ``stream`` has expired at ``now`` (``last_used``: its last read or write
        on this node, for a sliding TTL)."""
        if stream.expires is not None and now >= stream.expires:
            return True
        return stream.ttl is not None and now >= last_used + stream.ttl



class _Replaced(dict[str, Producer]):
    """A native topic's producer table that a group replaced whole (a deletion forgot it):
    journaled whole, not as the changes to the committed table."""

