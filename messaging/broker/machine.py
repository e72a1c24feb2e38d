"""The broker's state machine without its files: what applying a command decides.

:class:`StateMachine` holds the broker index, the append time and the catalog (streams,
producers, per-topic settings and manifests), and stages each command of a group: it stamps
indexes (:func:`messaging.broker.commands.stamp`), decides stream and topic commands, checks a
topic's own message size, and collects what the group changes besides frames (position
changes, deletions, settings, manifest records). It does no I/O: the facts it needs about
the files (a topic's last index and health, the subscribers it has) come through
:class:`TopicFacts`, and the :class:`~messaging.broker.broker.Broker` that drives it writes
the frames, the journal entry it builds, and carries out the group's effects once the group
is durable.

Ownership: one writer thread at a time (the broker's) calls everything here; the committed
state readers see is :class:`messaging.broker.state.CommittedState`, over the same catalog.
A model in memory drives it with no disk at all (``tests/broker/test_machine_model.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from messaging.broker.catalog import Catalog
from messaging.broker.commands import ApplyResult, Run, largest_message, stamp
from messaging.broker.subscribers import DELETE, PositionChange
from messaging.broker.topic_settings import (
    CONFIGURE,
    EXPIRE,
    MAX_MESSAGE_SIZE,
    OFFLOAD,
    TopicEntry,
    TopicOp,
    manifest_change,
)
from messaging.errors import (
    BadRequestError,
    MessageTooLargeError,
    NotFoundError,
    StreamConflictError,
)
from messaging.placement import NAMED_TOPIC_BASE
from messaging.topic.times import TIME_RESOLUTION_MS


class TopicFacts(Protocol):
    """What the state machine reads of the topics' files and positions to decide a command."""

    def last_index(self, topic_id: int) -> int | None:
        """The last index a topic's files hold (None: it has no files)."""
        ...

    def positions_in(self, topic_id: int) -> Iterable[str]:
        """The subscribers (consumers) with a committed position in a topic."""
        ...

    def check_writable(self, topic_id: int) -> None:
        """Raise when a topic's files stopped taking writes (a failed write or fsync)."""
        ...


@dataclass(slots=True)
class Staged:
    """One command staged: its answer, its frames per topic and their append time, and the
    empty topics a configure creates."""

    result: ApplyResult
    runs: list[tuple[int, Run]]
    append_time: int | None
    creates: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Effects:
    """What a committed group changes besides frames, for the broker to carry out."""

    positions: list[PositionChange]
    removed: list[int]  # stream topics the catalog freed
    changed: set[int]  # stream topics whose metadata changed (closed, deleted)
    deleting: list[int]  # numeric topics deleted by a command
    configured: list[int]  # topics whose settings changed


Mark = tuple[int, int, tuple[int, int, int, int], int, int, int, bool]


class StateMachine:
    """Index, time and catalog, and the changes of the group being staged (writer thread)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.index = 0
        #: The append time of the messages applied now (ms since the epoch; 0: none yet): see
        #: :meth:`advance_time`.
        self.time = 0
        self._positions: list[PositionChange] = []
        self._deleting: list[int] = []
        self._configured: list[int] = []
        #: The group changes a manifest: its journal line must be durable, whatever --fsync
        #: says (see :class:`messaging.broker.broker.Broker`).
        self.manifest_staged = False

    # -- staging ----------------------------------------------------------------------------

    def advance_time(self, time_ms: int | None) -> int | None:
        """The append time of a command formed at ``time_ms`` (None: a command that carries
        no time, such as one written before times existed): the time moves to it when it is
        at least :data:`TIME_RESOLUTION_MS` ahead, and never back, so time order is index
        order even when a clock steps back, and a topic's time index gets a record at most
        once per step. Deterministic: every node applying the same commands from the same
        state derives the same times. None while no command has carried a time."""
        if time_ms is not None and time_ms >= self.time + TIME_RESOLUTION_MS:
            self.time = time_ms
        return self.time or None

    def mark(self) -> Mark:
        """A savepoint inside the group, for :meth:`rollback` (one command's changes)."""
        return (self.index, self.time, self.catalog.mark(), len(self._positions),
                len(self._deleting), len(self._configured), self.manifest_staged)

    def rollback(self, mark: Mark) -> None:
        """Undo what was staged since ``mark`` (a command that must not apply)."""
        index, time_ms, catalog, positions, deleting, configured, manifest = mark
        self.index, self.time = index, time_ms
        self.catalog.rollback(catalog)
        del self._positions[positions:]
        del self._deleting[deleting:]
        del self._configured[configured:]
        self.manifest_staged = manifest

    def stage(self, command: bytes | bytearray, time_ms: int | None,
              facts: TopicFacts) -> Staged:
        """Stage one command: stamp it, decide its stream or topic operation, check a
        topic's own message size. Raises a :class:`MessagingError` when it must not apply
        (the caller rolls back to its :meth:`mark`)."""
        append_time = self.advance_time(time_ms)
        self.catalog.command_time = append_time  # stream commands take the same time
        stamped = stamp(command, self.index, self.catalog)
        self.index = stamped.index
        for topic_id, run in stamped.runs:
            facts.check_writable(topic_id)
            self._check_message_size(topic_id, run)
        creates: list[int] = []
        if stamped.topic_op is not None and self._stage_topic_op(stamped.topic_op, facts):
            creates.append(stamped.topic_op.topic)
        self._positions.extend(stamped.heartbeats)
        first = stamped.first
        runs = stamped.runs
        topics = (frozenset((runs[0][0],)) if len(runs) == 1
                  else frozenset([topic_id for topic_id, _run in runs]))
        result = ApplyResult(first, self.index if first else 0, topics, stamped.stream,
                             bool(creates))
        return Staged(result, stamped.runs, append_time, creates)

    def _check_message_size(self, topic_id: int, run: Run) -> None:
        """A topic's own max-message-size (413 for a command with a larger message)."""
        limit = self.catalog.topic_settings.get(topic_id).settings.get(MAX_MESSAGE_SIZE)
        if limit is not None:
            largest = largest_message(run)
            if largest > limit:
                name = self.catalog.name_of(topic_id)
                whose = f"stream {name!r}" if name is not None else f"topic {topic_id}"
                raise MessageTooLargeError(f"message of {largest} bytes exceeds the "
                                           f"max-message-size of {limit} set on {whose}")

    def _stage_topic_op(self, op: TopicOp, facts: TopicFacts) -> bool:
        """Stage a topic's new settings, its deletion, or a manifest change; returns whether
        a configure creates the (empty) topic.

        A deletion takes a broker index of its own and records it (``deleted_at``), forgets
        the topic's settings, its idempotent producers and its subscribers' positions, and
        deletes its files when the group commits, unless they hold frames from after that
        index (a command replayed after a restart, when the topic was created again since):
        deleting them is then already done. Its own index puts every message of a later
        incarnation strictly after ``deleted_at``, while every read that could have begun
        before the deletion starts at or below it (the old topic's last index + 1 included):
        a reader resuming right after the last message it saw is fenced (410), not fed the
        new topic's first message as a continuation. Being a command's effect on the index,
        it is the same on every node and after every replay.
        """
        table = self.catalog.topic_settings
        if op.kind in (OFFLOAD, EXPIRE):
            self._stage_manifest(op)
            return False
        last = facts.last_index(op.topic)
        if op.kind == CONFIGURE:
            if op.topic >= NAMED_TOPIC_BASE and self.catalog.name_of(op.topic) is None:
                raise NotFoundError(f"topic {op.topic} is not a stream's topic id")
            entry = table.get(op.topic)
            if op.kafka is not None and entry.kafka != op.kafka:
                self._check_unlabelled(op, entry, last)
            table.stage(op.topic, entry.configured(op.settings, op.kafka))
            self._configured.append(op.topic)
            return op.create and last is None and op.topic < NAMED_TOPIC_BASE
        if op.topic >= NAMED_TOPIC_BASE:
            name = self.catalog.name_of(op.topic)
            held = f"holds the stream {name!r}" if name is not None else "is a stream's"
            raise BadRequestError(f"topic {op.topic} {held}: delete it with DELETE "
                                  f"/v1/stream/{name or '{name}'}")
        self.index += 1  # the deletion's own index (see above); undone with the command
        table.stage(op.topic, TopicEntry(deleted_at=self.index))
        self.catalog.forget_producers(op.topic)
        self._forget_positions(op.topic, facts)
        if last is not None and last <= self.index:
            self._deleting.append(op.topic)
        return False

    def _check_unlabelled(self, op: TopicOp, entry: TopicEntry, last: int | None) -> None:
        """A topic becomes a Kafka partition only while it holds nothing, is no other
        partition and no other topic is that partition (409 otherwise: the creator looks
        again)."""
        assert op.kafka is not None
        holder = self.catalog.topic_settings.kafka.get(op.kafka[0], {}).get(op.kafka[1])
        if holder is not None and holder != op.topic:
            raise StreamConflictError(f"partition {op.kafka[1]} of the Kafka topic "
                                      f"{op.kafka[0]!r} is topic {holder} already")
        if entry.kafka is not None:
            raise StreamConflictError(f"topic {op.topic} is already partition {entry.kafka[1]} "
                                      f"of the Kafka topic {entry.kafka[0]!r}")
        if last is not None or op.topic >= NAMED_TOPIC_BASE:
            raise StreamConflictError(f"topic {op.topic} holds messages: it cannot become "
                                      f"partition {op.kafka[1]} of {op.kafka[0]!r}")

    def _stage_manifest(self, op: TopicOp) -> None:
        """Record an uploaded segment in a topic's manifest, or drop its data up to an index
        (total retention). A record that no longer fits (recorded already, raced by another,
        below a deletion) changes nothing: the sweep deletes its object."""
        table = self.catalog.topic_settings
        entry = table.get(op.topic)
        if op.kind == OFFLOAD:
            assert op.object is not None
            if entry.deleted_at is not None and op.object.first <= entry.deleted_at:
                return
            manifest = entry.manifest.offload(op.object, op.after)
        else:
            manifest = entry.manifest.expire(op.through)
        if manifest is not None:
            table.stage(op.topic, entry.with_manifest(manifest), manifest_change(op))
            self.manifest_staged = True

    def _forget_positions(self, topic_id: int, facts: TopicFacts) -> None:
        """Stage forgetting every subscriber and consumer position in a deleted topic: the
        committed ones and those the group itself records before the deletion."""
        names = set(facts.positions_in(topic_id))
        names.update(c.name for c in self._positions if c.topic == topic_id)
        for name in sorted(names):
            self._positions.append(PositionChange(topic_id, 0, name, DELETE))

    def seal(self, facts: TopicFacts) -> None:
        """End the group's staging: the positions in stream topics it frees go with them."""
        for topic_id in self.catalog.removed:
            self._forget_positions(topic_id, facts)

    # -- the journal, commit and abort ------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether the group changes state besides frames (it needs a journal line)."""
        return bool(self._positions) or self.catalog.pending

    def journal_entry(self, first: int, touched: Iterable[int],
                      last_index: Callable[[int], int]) -> dict[str, Any] | None:
        """The state journal's line for the group, its commit mark (None: it changes nothing
        and appends nothing): the broker index it ends at, its catalog changes, position
        changes, and the last index of each topic it writes, from ``first`` (see
        :mod:`messaging.broker.state_log`)."""
        # A topic the group also frees (a stream written and deleted in one group) is gone
        # after it commits: its frames prove nothing, and a restart must not miss them.
        covered = set(touched).difference(self.catalog.removed)
        if not self.pending and not covered:
            return None
        entry: dict[str, Any] = {"index": self.index}
        if self.catalog.pending:
            entry["changes"] = self.catalog.changes()
        if self._positions:
            entry["positions"] = [[c.topic, c.index, c.name, c.kind] for c in self._positions]
        if covered:
            entry["group"] = {"first": first,
                              "last": {str(t): last_index(t) for t in covered}}
        return entry

    def commit(self) -> Effects:
        """The group is durable: fold the catalog's changes in and hand over the rest."""
        positions, self._positions = self._positions, []
        deleting, self._deleting = self._deleting, []
        configured, self._configured = self._configured, []
        self.manifest_staged = False
        removed, changed = self.catalog.commit()
        return Effects(positions, removed, changed, deleting, configured)

    def abort(self, index: int, time_ms: int) -> None:
        """The group failed: drop everything it staged, index and time back."""
        self._positions.clear()
        self._deleting.clear()
        self._configured.clear()
        self.manifest_staged = False
        self.catalog.rollback()
        self.index, self.time = index, time_ms
