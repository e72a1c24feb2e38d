"""The broker's state machine (:mod:`messaging.broker.machine`) against a model, in memory with
no disk: publishes, idempotent native publishes, topic settings and deletions, named streams
(create, append with producers, close, delete), consumer positions and manifest changes.

Every command is built with the vocabulary of :mod:`messaging.broker.commands` and staged as
the broker stages it; a group either commits or is aborted (a write that failed). After every
step the machine agrees with the model (indexes, answers, producers, positions, deletions,
manifests), the catalog saved and restored is the same, and a replica that only replays the
state journal's lines (:meth:`Catalog.replay`) holds the same catalog as the one that applied
the commands.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from messaging.broker.catalog import Catalog
from messaging.broker.commands import (
    ApplyResult,
    append_stream,
    configure_command,
    create_stream,
    delete_command,
    delete_consumer,
    delete_stream,
    expire_command,
    heartbeat_command,
    offload_command,
    produce,
    reset_consumer,
)
from messaging.broker.machine import StateMachine
from messaging.broker.topic_settings import MAX_MESSAGE_SIZE
from messaging.errors import (
    BadRequestError,
    MessageTooLargeError,
    MessagingError,
    ProducerFencedError,
    ProducerSequenceGapError,
    StreamConflictError,
    StreamNotFoundError,
)
from messaging.frames import encode, encode_batch
from messaging.placement import NAMED_TOPIC_BASE
from messaging.tiered.manifest import SegmentObject
from tests.examples import examples

NOW = 1_700_000_000.0
TOPICS = st.sampled_from([1, 2, 3])
NAMES = st.sampled_from(["a", "b"])
PIDS = st.sampled_from(["p", "q"])
CONSUMERS = st.sampled_from(["r", "s"])


class Files:
    """What the machine reads of the files (:class:`messaging.broker.machine.TopicFacts`),
    kept as a broker keeps them: the last index each topic holds, committed positions."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}
        self.positions: dict[int, dict[str, int]] = {}

    def last_index(self, topic_id: int) -> int | None:
        return self.last.get(topic_id)

    def positions_in(self, topic_id: int) -> Iterable[str]:
        return list(self.positions.get(topic_id, {}))

    def check_writable(self, topic_id: int) -> None:
        return None


@dataclass
class ModelProducer:
    epoch: int
    seq: int
    first: int = 0
    last: int = 0


@dataclass
class ModelStream:
    topic: int
    tail: int = 0
    closed: bool = False
    producers: dict[str, ModelProducer] = field(default_factory=dict)


class MachineModel(RuleBasedStateMachine):
    """Commands against the model, one group each (committed, or aborted)."""

    def __init__(self) -> None:
        super().__init__()
        self.machine = StateMachine(Catalog())
        self.files = Files()
        self.replica = Catalog()  # replays the journal's lines only
        self.index = 0
        self.native: dict[int, dict[str, ModelProducer]] = {}
        self.limits: dict[int, int] = {}
        self.deleted: dict[int, int] = {}
        self.streams: dict[str, ModelStream] = {}
        self.next_stream_topic = NAMED_TOPIC_BASE
        self.positions: dict[int, dict[str, int]] = {}
        self.expired: dict[int, int] = {}
        self.offloaded: dict[int, int] = {}

    # -- running one command as a group ------------------------------------------------------

    def run(self, command: bytes, *, abort: bool = False) -> ApplyResult | MessagingError:
        """Stage ``command`` as the broker does; commit the group (or abort it)."""
        machine = self.machine
        before = machine.index, machine.time
        mark = machine.mark()
        try:
            staged = machine.stage(command, None, self.files)
        except MessagingError as err:
            machine.rollback(mark)
            assert not machine.pending  # nothing of it left in the group
            machine.commit()
            return err
        machine.seal(self.files)
        entry = machine.journal_entry(before[0] + 1, [t for t, _r in staged.runs],
                                      lambda _topic: staged.result.last)
        if abort:
            machine.abort(*before)
            return staged.result
        effects = machine.commit()
        if entry is not None and "changes" in entry:
            self.replica.replay(entry["changes"])
        for topic_id, _run in staged.runs:
            self.files.last[topic_id] = staged.result.last
        for topic_id in staged.creates:
            self.files.last.setdefault(topic_id, 0)
        for topic_id in [*effects.deleting, *effects.removed]:
            self.files.last.pop(topic_id, None)
        for change in effects.positions:
            held = self.files.positions.setdefault(change.topic or 0, {})
            if change.kind == "delete":
                held.pop(change.name, None)
            elif change.kind == "reset":
                held[change.name] = change.index
            else:
                held[change.name] = max(held.get(change.name, 0), change.index)
        return staged.result

    # -- native topics -----------------------------------------------------------------------

    @rule(topic=TOPICS, count=st.integers(1, 3), size=st.integers(1, 12),
          abort=st.booleans())
    def publish(self, topic: int, count: int, size: int, abort: bool) -> None:
        result = self.run(encode_batch(topic, [b"x" * size] * count), abort=abort)
        limit = self.limits.get(topic)
        if limit is not None and size > limit:
            assert isinstance(result, MessageTooLargeError)
            return
        assert isinstance(result, ApplyResult)
        assert (result.first, result.last) == (self.index + 1, self.index + count)
        if not abort:
            self.index += count

    @rule(topic=TOPICS, pid=PIDS, epoch=st.integers(0, 2), seq=st.integers(0, 3))
    def produce(self, topic: int, pid: str, epoch: int, seq: int) -> None:
        result = self.run(produce(topic, (pid, epoch, seq), NOW, encode(1, topic, b"p")))
        producers = self.native.setdefault(topic, {})
        state = producers.get(pid)
        expected: type[MessagingError] | None = None
        duplicate = False
        if state is None:
            expected = ProducerSequenceGapError if seq else None
        elif epoch < state.epoch:
            expected = ProducerFencedError
        elif epoch > state.epoch:
            expected = BadRequestError if seq else None
        elif seq <= state.seq:
            duplicate = True
        elif seq != state.seq + 1:
            expected = ProducerSequenceGapError
        if expected is not None:
            assert isinstance(result, expected), result
            return
        assert isinstance(result, ApplyResult) and result.stream is not None
        if duplicate:
            assert state is not None
            assert result.stream.duplicate and result.count == 0
            assert (result.stream.first, result.stream.last) == (state.first, state.last)
            return
        self.index += 1
        assert (result.first, result.last) == (self.index, self.index)
        producers[pid] = ModelProducer(epoch, seq, self.index, self.index)

    @rule(topic=TOPICS, limit=st.sampled_from([None, 4, 8]))
    def configure(self, topic: int, limit: int | None) -> None:
        result = self.run(configure_command(topic, {MAX_MESSAGE_SIZE: limit}))
        assert isinstance(result, ApplyResult) and result.count == 0
        if limit is None:
            self.limits.pop(topic, None)
        else:
            self.limits[topic] = limit

    @rule(topic=TOPICS)
    def delete_topic(self, topic: int) -> None:
        result = self.run(delete_command(topic))
        assert isinstance(result, ApplyResult)
        self.index += 1  # the deletion's own index
        self.deleted[topic] = self.index
        self.native.pop(topic, None)
        self.limits.pop(topic, None)
        self.positions.pop(topic, None)
        self.expired.pop(topic, None)
        self.offloaded.pop(topic, None)

    @rule(topic=TOPICS, name=CONSUMERS, index=st.integers(0, 50), reset=st.booleans())
    def position(self, topic: int, name: str, index: int, reset: bool) -> None:
        command = (reset_consumer(topic, name, index) if reset
                   else heartbeat_command(topic, index, name))
        assert isinstance(self.run(command), ApplyResult)
        held = self.positions.setdefault(topic, {})
        held[name] = index if reset else max(held.get(name, 0), index)

    @rule(topic=TOPICS, name=CONSUMERS)
    def forget_consumer(self, topic: int, name: str) -> None:
        assert isinstance(self.run(delete_consumer(topic, name)), ApplyResult)
        self.positions.get(topic, {}).pop(name, None)

    @rule(topic=TOPICS, span=st.integers(1, 5), stale=st.booleans())
    def offload(self, topic: int, span: int, stale: bool) -> None:
        after = self.offloaded.get(topic, 0)
        first = after + 1
        obj = SegmentObject(first, first + span - 1, 100, span, "0" * 64)
        result = self.run(offload_command(topic, obj, after + 1 if stale else after))
        assert isinstance(result, ApplyResult)
        floor = self.deleted.get(topic)
        if not stale and (floor is None or first > floor) and first > self.expired.get(topic, 0):
            self.offloaded[topic] = obj.last

    @rule(topic=TOPICS, through=st.integers(1, 20))
    def expire(self, topic: int, through: int) -> None:
        assert isinstance(self.run(expire_command(topic, through)), ApplyResult)
        if through > self.expired.get(topic, 0):
            self.expired[topic] = through

    # -- named streams -----------------------------------------------------------------------

    @rule(name=NAMES, count=st.integers(0, 2))
    def create(self, name: str, count: int) -> None:
        result = self.run(create_stream(name, content_type="text/plain", now=NOW,
                                        messages=[b"m"] * count))
        existing = self.streams.get(name)
        if existing is not None and existing.closed:  # created open: another configuration
            assert isinstance(result, StreamConflictError)
            return
        assert isinstance(result, ApplyResult) and result.stream is not None
        if name in self.streams:
            assert not result.stream.created and result.count == 0
            return
        assert result.stream.created
        stream = self.streams[name] = ModelStream(self.next_stream_topic)
        self.next_stream_topic += 1
        if count:
            self.index += count
            stream.tail = self.index

    @rule(name=NAMES, count=st.integers(1, 2), pid=st.none() | PIDS, seq=st.integers(0, 2),
          close=st.booleans())
    def append(self, name: str, count: int, pid: str | None, seq: int, close: bool) -> None:
        producer = (pid, 0, seq) if pid is not None else None
        result = self.run(append_stream(name, now=NOW, messages=[b"a"] * count,
                                        content_type="text/plain", close=close,
                                        producer=producer))
        stream = self.streams.get(name)
        if stream is None:
            assert isinstance(result, StreamNotFoundError)
            return
        if stream.closed:
            assert isinstance(result, MessagingError) or (
                result.stream is not None and result.stream.duplicate)
            return
        state = stream.producers.get(pid) if pid is not None else None
        if pid is not None:
            if (state is None and seq) or (state is not None and seq > state.seq + 1):
                assert isinstance(result, ProducerSequenceGapError)
                return
            if state is not None and seq <= state.seq:
                assert isinstance(result, ApplyResult) and result.stream is not None
                assert result.stream.duplicate and result.count == 0
                return
            stream.producers[pid] = ModelProducer(0, seq)
        assert isinstance(result, ApplyResult) and result.count == count
        self.index += count
        stream.tail = self.index
        stream.closed = close

    @rule(name=NAMES)
    def drop(self, name: str) -> None:
        result = self.run(delete_stream(name))
        stream = self.streams.pop(name, None)
        if stream is None:
            assert isinstance(result, StreamNotFoundError)
            return
        assert isinstance(result, ApplyResult)
        self.positions.pop(stream.topic, None)

    @rule(name=NAMES, reader=CONSUMERS, index=st.integers(0, 9))
    def read_stream(self, name: str, reader: str, index: int) -> None:
        stream = self.streams.get(name)
        if stream is None:
            return
        assert isinstance(self.run(heartbeat_command(stream.topic, index, reader)),
                          ApplyResult)
        held = self.positions.setdefault(stream.topic, {})
        held[reader] = max(held.get(reader, 0), index)

    # -- what must hold after every step -------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        machine = self.machine
        catalog = machine.catalog
        assert machine.index == self.index
        assert not machine.pending and not catalog.pending
        for topic in (1, 2, 3):
            known = catalog.producers(topic)
            modelled = self.native.get(topic, {})
            assert {p: (s.epoch, s.seq, s.first, s.last) for p, s in known.items()} == {
                p: (s.epoch, s.seq, s.first, s.last) for p, s in modelled.items()}
            entry = catalog.topic_settings.committed(topic)
            assert entry.deleted_at == self.deleted.get(topic)
            assert entry.settings.get(MAX_MESSAGE_SIZE) == self.limits.get(topic)
            assert entry.manifest.expired == self.expired.get(topic, 0)
            assert entry.manifest.offloaded == self.offloaded.get(topic, 0)
        assert {n: (s.topic, s.tail[0], s.closed) for n, s in catalog.streams.items()} == {
            n: (s.topic, s.tail, s.closed) for n, s in self.streams.items()}
        held = {t: p for t, p in self.files.positions.items() if p}
        assert held == {t: p for t, p in self.positions.items() if p}

    @invariant()
    def saves_restores_and_replays_alike(self) -> None:
        saved = _in_order(self.machine.catalog.saved())
        restored = Catalog()
        restored.restore(saved)
        assert _in_order(restored.saved()) == saved
        assert _in_order(self.replica.saved()) == saved


def _in_order(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved catalog with its streams by name (a dict's order is not state)."""
    return {**saved, "streams": sorted(saved["streams"], key=lambda s: s["name"])}


MachineModel.TestCase.settings = settings(max_examples=examples(150), stateful_step_count=40,
                                          deadline=None)
TestMachineModel = MachineModel.TestCase
