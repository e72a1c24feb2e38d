"""The Broker: the state machine every log (local, or etcd in a cluster) drives.

``apply(command)`` takes a command (a buffer of frames, index 0), assigns each message the
next broker index (``previous + 1`` across all topics, from 1), and appends runs of frames to
their topics. Assignment is a pure function of the applied command sequence, and topics skip
indexes not above their own, so replaying commands after a restart is idempotent.

Broker-internal frames (type bit 0x8000) take no index and are never stored in a topic: they
record subscriber progress (:data:`SET_TOPIC_MAX_INDEX`) and consumer position resets and
deletes (:data:`messaging.broker.subscribers.CONSUMER_OP`).

A group of commands is one transaction (:meth:`Broker.write_group`): every topic it touches
is written once, then its line in the state journal (its commit mark, with the state it
changes besides frames: catalog, producer sequence numbers, subscriber positions), then the
topics and the journal are fsynced side by side, and only then does any of it become visible;
any failure undoes all of it, so a client that got an error never sees its messages, and
nothing on disk is left that the in-memory state does not account for. A crash anywhere in
between is undone at start-up (frames no whole line covers are cut, across segments; a line
whose frames are missing is dropped with them), so a batch is all or nothing and frames and
the state recorded with them always agree.

Who owns what: the writer side is this class (files, the state journal, fsyncs and carrying
out a group's effects) over :class:`~messaging.broker.machine.StateMachine` (what each
command decides, no I/O); readers read :class:`~messaging.broker.state.CommittedState`
(``broker.committed``) and the topics' committed views; retention is a service of its own
(:class:`~messaging.broker.retention.Retention`, ``broker.retention``). This module is
over 600 lines because the group transaction (stage, journal, write, fsync, commit or abort,
and carrying out a committed group's effects) is one piece whose steps must be read together,
and because the Broker is also the :class:`~messaging.broker.view.BrokerView` readers use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from messaging.aio import Notifier
from messaging.broker import coalesce, describe, recovery, snapshot
from messaging.broker.catalog import STREAM_OP, Catalog
from messaging.broker.commands import ApplyResult, Run, is_topic_command
from messaging.broker.machine import StateMachine
from messaging.broker.metrics import BrokerMetrics, TopicRow
from messaging.broker.retention import Retention, RetentionLimits
from messaging.broker.snapshot import FORMAT
from messaging.broker.state import CommittedState
from messaging.broker.state_log import CatalogLog
from messaging.broker.subscribers import PositionChange, Subscribers
from messaging.broker.topic_settings import MAX_SEGMENT_SIZE, TopicEntry
from messaging.config import (
    DEFAULT_MAX_SEGMENT_SIZE,
    DEFAULT_MAX_TOPIC_SIZE,
    DEFAULT_SUBSCRIBER_TIMEOUT,
)
from messaging.errors import (
    MessagingError,
    StorageFailedError,
)
from messaging.files import (
    storage_error,
    write_json_atomic,
)
from messaging.frames import decode_one, frame_size
from messaging.placement import NAMED_TOPIC_BASE
from messaging.quiet_log import QuietLog
from messaging.tiered.manifest import Manifest
from messaging.tiered.view import Tiered, TieredTopic
from messaging.topic.store import TopicStore
from messaging.topic.topic import Topic
from messaging.topic.view import TopicView

#: Makes a broker's object reads, given the committed manifest of each topic (with an
#: object store: :meth:`messaging.offload.service.ObjectStorage.for_broker`).
ObjectReads = Callable[[Callable[[int], Manifest]], Tiered]

__all__ = ["ApplyResult", "Broker", "ObjectReads"]

log = logging.getLogger(__name__)

#: Seconds between two log lines about failed writes (the rest are counted, not logged).
_FAILURE_LOG_INTERVAL = 1.0


class Broker:
    """Topics in ``DATA/topics``, the broker index, and subscriber progress.

    Writes (apply, sync, commit, snapshot restore) come from one writer thread at a time;
    reads may come from any thread.
    """

    def __init__(self, path: Path, *, max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE,
                 max_topic_size: int = DEFAULT_MAX_TOPIC_SIZE,
                 retention_age: float | None = None,
                 local_retention_size: int | None = None,
                 local_retention_age: float | None = None,
                 subscriber_timeout: float = DEFAULT_SUBSCRIBER_TIMEOUT,
                 max_open_files: int | None = None,
                 metrics: BrokerMetrics | None = None,
                 first_named_topic: int = NAMED_TOPIC_BASE,
                 object_reads: ObjectReads | None = None,
                 lines_first: bool = False) -> None:
        self.path = path
        #: Whether groups write their journal line before their frames and a group of
        #: single-message publishes writes none (every group durable: ``--fsync always`` on
        #: one node), or every group writes its line after its frames (see
        #: :mod:`messaging.broker.state_log`).
        self.lines_first = lines_first
        self.max_segment_size = max_segment_size
        self.subscriber_timeout = subscriber_timeout
        self.metrics = metrics or BrokerMetrics()
        self.metrics.watch_subscribers(self._subscriber_rows)
        self.metrics.watch_topics(self._topic_rows)
        #: The topics' files: directories, the lock, the open-file budget, fsyncs.
        self.store = TopicStore(path, max_segment_size, max_open_files)
        self.positions = Subscribers(subscriber_timeout)
        #: Index, time and the catalog (named streams, producers, per-topic settings and
        #: manifests): changed only by commands, in the group transaction.
        self.machine = StateMachine(Catalog(first_named_topic))
        #: The read model: what readers on any thread see (the last committed group).
        self.committed = CommittedState(self.machine.catalog, self.positions)
        #: With an object store: reads below the local segments go to it; None: every read
        #: is local.
        self.tiered: Tiered | None = (object_reads(self.committed.manifest)
                                      if object_reads is not None else None)
        self.retention = Retention(
            self.store, self.committed,
            RetentionLimits(max_topic_size, retention_age, local_retention_size,
                            local_retention_age),
            self.metrics, tiered=self.tiered is not None)
        #: Woken after every group that changed the catalog (closure, deletion, creation).
        self.streams_changed = Notifier()
        self._catalog_log = CatalogLog(path)
        self._new_topics = Notifier()
        self._save_lock = threading.Lock()  # one broker.json writer at a time
        self._failures = QuietLog(log, _FAILURE_LOG_INTERVAL)

    # -- the state machine's figures, as the log and tests see them ---------------------------

    @property
    def catalog(self) -> Catalog:
        """The writer's catalog (the log's apply path restores and checkpoints it)."""
        return self.machine.catalog

    @property
    def index(self) -> int:
        """The broker index: the last index a committed (or the group's staged) command
        took."""
        return self.machine.index

    @index.setter
    def index(self, value: int) -> None:
        self.machine.index = value

    @property
    def max_topic_size(self) -> int:
        """The broker's max-topic-size (a topic's own setting overrides it)."""
        return self.retention.limits.max_topic_size

    @max_topic_size.setter
    def max_topic_size(self, value: int) -> None:
        self.retention.limits.max_topic_size = value

    @property
    def retention_age(self) -> float | None:
        """The broker's retention-age in seconds (None: off; a topic's own overrides it)."""
        return self.retention.limits.retention_age

    @retention_age.setter
    def retention_age(self, value: float | None) -> None:
        self.retention.limits.retention_age = value

    @property
    def local_retention_size(self) -> int | None:
        """With an object store: the bytes of what is in it that stay on the disk too."""
        return self.retention.limits.local_retention_size

    @local_retention_size.setter
    def local_retention_size(self, value: int | None) -> None:
        self.retention.limits.local_retention_size = value

    @property
    def time(self) -> int:
        """The append time of the messages applied now (ms since the epoch; 0: none yet)."""
        return self.machine.time

    @time.setter
    def time(self, value: int) -> None:
        self.machine.time = value

    # -- opening and closing ----------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str, **options: Any) -> Broker:
        """Open (creating if needed) the data directory and recover every topic."""
        broker = cls(Path(path), **options)
        broker._open()
        return broker

    def _open(self) -> None:
        topics = self.store.open()
        for topic in topics:
            self.metrics.recovered_truncated_bytes.inc(topic.stats.recovered_truncated_bytes)
        state = recovery.read_saved_state(self.path)
        self.catalog.restore(state.get("catalog"))
        self.positions.restore(state.get("subscribers", {}))
        journaled = recovery.replay_journal(self._catalog_log, int(state.get("catalog_seq", 0)),
                                            self.store, self.catalog, self.positions)
        marks = state.get(recovery.MARKS)
        if marks is True:  # frames no whole line covers: their group's commit mark never made it
            recovery.cut_uncommitted(self.store, max(int(state.get("index", 0)), journaled))
        # (marks written first: frames no line covers are whole single-message groups)
        recovery.reconcile_streams(self.store, self.catalog)
        recovery.reconcile_deleted(self.store, self.catalog.topic_settings)
        self._configure(self.store.all())
        # Each source alone may be behind: broker.json is saved now and then, a directory of
        # an earlier release has groups without a journal line, and a deleted stream's topic
        # took its indexes with it. Reusing an index would break the consistent cut.
        self.index = max([int(state.get("index", 0)), journaled]
                         + [t.last_index for t in self.store.all()])
        self.time = max([int(state.get("time", 0))]
                        + [t.last_time or 0 for t in self.store.all()])
        if marks != self._marks:
            self._mark(marks)
        log.info("opened %s: %d topics, index %d", self.path, len(self.store.ids()), self.index)

    @property
    def _marks(self) -> str | bool:
        """How this broker's groups mark their commit (``broker.json``'s ``marks``)."""
        return recovery.LINES_FIRST if self.lines_first else True

    def _mark(self, saved: Any) -> None:
        """Save ``broker.json`` saying how groups mark their commit from now on (a new
        directory, one an earlier release wrote, or one written in the other way). When that
        fails (a full disk) the broker still starts and serves; a crash may then keep part of
        an interrupted batch, as earlier releases did, and the next start tries again."""
        try:
            self.save_state(durable=True)
        except OSError as err:
            log.warning("could not save %s/broker.json (%s): until it is saved, a batch that "
                        "a crash interrupts may be kept in part", self.path, err.strerror or err)
            if saved is True and self.lines_first:
                # The next start would cut frames no line covers: every group writes one.
                self.lines_first = False

    def _configure(self, topics: Iterable[Topic]) -> None:
        """Give topics their effective segment size and the floor of their last deletion."""
        table = self.catalog.topic_settings
        for topic in topics:
            entry = table.committed(topic.id)
            topic.max_segment_size = entry.settings.get(MAX_SEGMENT_SIZE, self.max_segment_size)
            if entry.deleted_at:
                topic.hide_through(entry.deleted_at)

    def state(self) -> dict[str, Any]:
        """The broker's own metadata as saved in ``broker.json`` (writer thread: the catalog and
        the index are its own; positions lock themselves). No broker lock is held meanwhile,
        so the loop never waits for a large catalog to be copied."""
        return {
            "format": FORMAT,
            "index": self.index,
            "time": self.time,
            "subscribers": self.positions.saved(),
            "catalog": self.catalog.saved(),
            "catalog_seq": self._catalog_log.seq,
            recovery.MARKS: self._marks,
        }

    def save_state(self, *, durable: bool = True) -> None:
        """Write ``broker.json`` atomically (one writer at a time; fsynced when ``durable``),
        with the whole catalog: the catalog's journal is emptied after it."""
        with self._save_lock:
            write_json_atomic(self.path / "broker.json", self.state(), durable=durable)
            try:
                self._catalog_log.folded()
            except OSError as err:  # harmless: its lines are at or below catalog_seq now
                log.warning("could not empty %s: %s", self._catalog_log.path,
                            err.strerror or err)

    def close(self) -> None:
        """Wait for a running retention, sync and close every topic, save the state, unlock."""
        self.retention.close()
        self.store.close()
        if not self.store.closed:
            try:
                self.save_state()
            except OSError as err:
                # Heartbeats were saved as they were acknowledged; this only refreshes the index.
                log.warning("could not save %s/broker.json on close: %s", self.path,
                            err.strerror or err)
            self.store.unlock()
        self._catalog_log.close()
        self._new_topics.notify()

    # -- the state machine ------------------------------------------------------------------

    def advance_time(self, time_ms: int | None) -> int | None:
        """The append time of a command formed at ``time_ms`` (see
        :meth:`StateMachine.advance_time`)."""
        return self.machine.advance_time(time_ms)

    def write_group(self, commands: Sequence[bytes | bytearray], *, durable: bool,
                    notify: bool = True, times: Sequence[int | None] | None = None,
                    ) -> list[ApplyResult | MessagingError]:
        """Apply commands in order as one transaction (see :meth:`_write_group`).

        ``times`` holds each command's time (ms since the epoch, taken by the node that
        formed it; None or absent: none), see :meth:`advance_time`.

        A topic command (settings, deletion) is a transaction of its own between the
        commands before and after it: a group's frames go to their topics after all its
        commands are stamped, so a deletion inside a group could not cut between them.
        """
        stamps: Sequence[int | None] = times if times is not None else [None] * len(commands)
        if len(commands) > 1 and any(map(is_topic_command, commands)):
            results: list[ApplyResult | MessagingError] = []
            part: list[bytes | bytearray] = []
            part_times: list[int | None] = []
            for command, time_ms in zip(commands, stamps, strict=True):
                if is_topic_command(command):
                    if part:
                        results.extend(self._write_group(part, part_times, durable=durable,
                                                         notify=notify))
                        part, part_times = [], []
                    results.extend(self._write_group([command], [time_ms], durable=durable,
                                                     notify=notify))
                else:
                    part.append(command)
                    part_times.append(time_ms)
            if part:
                results.extend(self._write_group(part, part_times, durable=durable,
                                                 notify=notify))
            return results
        return self._write_group(commands, stamps, durable=durable, notify=notify)

    def _write_group(self, commands: Sequence[bytes | bytearray],
                     times: Sequence[int | None], *, durable: bool,
                     notify: bool) -> list[ApplyResult | MessagingError]:
        """One transaction of :meth:`write_group`.

        Stages every command in the state machine and its frames in their topics, writes
        the group's state changes to the state journal (fsynced when ``durable``), writes
        each topic once, fsyncs them (when ``durable``), and only then makes the group
        visible. A command that cannot apply (malformed, or for a topic that stopped taking
        writes) gets its own error and the others apply; a failed write, fsync or save
        undoes the whole group and every command gets that error. ``notify=False`` leaves
        waking the topics' followers to the caller (:meth:`notify`), on the loop and just
        before it answers the publishers.
        """
        machine = self.machine
        before, before_time = machine.index, machine.time
        touched: set[int] = set()
        journaled = manifest = False
        try:
            results = self._stage_group(commands, times, touched)
            self.store.sync_new_dirs()
            machine.seal(self)
            manifest = machine.manifest_staged
            debug = log.isEnabledFor(logging.DEBUG)
            written = time.perf_counter() if debug else 0.0
            if self.lines_first:
                # The group's line made durable before its frames are written (none for a
                # group of single-message publishes): see messaging.broker.state_log.
                rounds = 0
                if not _lone_messages(results) or machine.pending:
                    journaled = self._journal(touched, before + 1)
                    if journaled:
                        self._catalog_log.flush()
                        rounds += 1
                rounds += self.store.write(list(touched), durable=False)
                if durable:
                    self.store.sync(touched)
                    rounds += 1
            else:
                # The frames, then the group's journal line (its commit mark), both made
                # durable in one round: see messaging.broker.state_log for why in this order.
                rounds = self.store.write(list(touched), durable=False)
                journaled = self._journal(touched, before + 1)
                if durable or (manifest and journaled):
                    beside = [self._catalog_log.flush] if journaled else []
                    self.store.sync(touched if durable else (), beside=beside)
                    rounds += 1
            if rounds:
                self.metrics.fsyncs.inc(rounds)
            if debug:
                log.debug("group commit: %d commands, %d bytes, %d messages in %d topics, "
                          "written%s in %.3f ms", len(commands), sum(map(len, commands)),
                          machine.index - before, len(touched),
                          f" and fsynced ({rounds} rounds)" if rounds else "",
                          (time.perf_counter() - written) * 1000)
        except (MessagingError, OSError) as err:
            error = err if isinstance(err, MessagingError) else storage_error(
                f"writing to {self.path}", err)
            if journaled:
                self._catalog_log.undo(durable=durable)
            for topic_id in touched:
                self.store[topic_id].abort()
            machine.abort(before, before_time)
            self._log_failure(len(commands), error)
            return [error] * len(commands)
        # The catalog first (in the machine's commit): a stream reader that sees a new tail
        # before its topic's frames finds nothing yet and waits for the topic's commit,
        # which is still to come. The other order would show it the frames under an old
        # tail, caught up, and it would wait for a commit that has already happened.
        effects = machine.commit()
        self._record_positions(effects.positions)
        for topic_id in touched:
            self.store[topic_id].commit(notify=notify)
        self._remove_topics(effects.removed)
        self._remove_topics(effects.deleting)
        for topic_id in effects.deleting:
            log.info("topic %d deleted at index %d", topic_id, machine.index)
        self._configure(t for t in map(self.store.get, effects.configured) if t is not None)
        self.store.release_idle(t for t in touched if t not in effects.removed)
        if effects.changed or effects.removed:
            self.streams_changed.notify()
        if journaled and self._catalog_log.due:
            try:
                # Fold the journal into broker.json, always durably: the journal is emptied
                # after it, and lines that a checkpoint or an answer relied on must not go.
                self.save_state(durable=True)
            except OSError as err:  # the journal still holds everything: fold next time
                log.warning("could not fold %s into broker.json: %s", self._catalog_log.path,
                            err.strerror or err)
        return results

    def notify(self, topic_ids: Iterable[int]) -> None:
        """Wake the followers of topics a :meth:`write_group` with ``notify=False`` changed."""
        for topic_id in topic_ids:
            topic = self.store.get(topic_id)
            if topic is not None:
                topic.notify()

    def settled_result(self, command: bytes) -> ApplyResult | None:
        """What an already applied command (one an installed snapshot covers) did, when the
        committed state shows it: an idempotent native publish whose producer's last
        accepted request it is, answered as a duplicate with its indexes. None otherwise."""
        size = frame_size(command)
        if size is None or size > len(command):
            return None
        try:
            first = decode_one(command[:size])
        except MessagingError:
            return None
        if first.type != STREAM_OP:
            return None
        outcome = self.catalog.settled(first.data)
        return None if outcome is None else ApplyResult(0, 0, frozenset(), outcome)

    def _stage_group(self, commands: Sequence[bytes | bytearray], times: Sequence[int | None],
                     touched: set[int]) -> list[ApplyResult | MessagingError]:
        """Stage every command in the state machine and its frames in their topics (no I/O
        but the empty topics a configure creates)."""
        machine = self.machine
        runs: dict[int, list[tuple[Run, int | None]]] = {}
        results: list[ApplyResult | MessagingError] = []
        total = len(commands)
        if len(times) != total:
            raise ValueError(f"{total} commands with {len(times)} times")
        at = alone_until = 0
        while at < total:
            command, command_time = commands[at], times[at]
            # Lone publishes to one topic in a row: one command (messaging.broker.coalesce).
            lone = coalesce.lone_topic(command) if at >= alone_until else None
            end = at + 1 if lone is None else coalesce.run_end(commands, times, at, lone)
            if end - at > 1:
                assert lone is not None
                joined, counts = coalesce.joined(commands[at:end], lone)
                mark = machine.mark()
                try:
                    staged = machine.stage(joined, command_time, self)
                except MessagingError:
                    machine.rollback(mark)  # each on its own below: each its own answer
                    alone_until = end
                else:
                    for topic_id, run in staged.runs:
                        runs.setdefault(topic_id, []).append((run, staged.append_time))
                    results.extend(coalesce.split(staged.result, counts))
                    at = end
                    continue
            at += 1
            mark = machine.mark()
            try:
                staged = machine.stage(command, command_time, self)
            except MessagingError as err:
                machine.rollback(mark)
                results.append(err)
                continue
            for topic_id in staged.creates:
                self._topic_for_write(topic_id)  # empty; its entry fsynced with the group
            for topic_id, run in staged.runs:
                runs.setdefault(topic_id, []).append((run, staged.append_time))
            results.append(staged.result)
        messages = size = 0
        for topic_id, parts in runs.items():
            topic = self._topic_for_write(topic_id)
            touched.add(topic_id)
            if all(run.offsets is not None for run, _time in parts):
                for run, time_ms in parts:  # offsets known: the topic reads no header again
                    messages += topic.append(run.frames, run.offsets, run.first, time_ms)
                    size += len(run.frames)
                continue
            for time_ms, same in _by_time(parts):  # one append per time
                frames = same[0].frames if len(same) == 1 else b"".join(r.frames for r in same)
                messages += topic.append(frames, time_ms=time_ms)
                size += len(frames)
        if messages:
            self.metrics.messages_published.inc(messages)
            self.metrics.bytes_published.inc(size)
        return results

    # -- what the state machine reads of the files (messaging.broker.machine.TopicFacts) -----

    def last_index(self, topic_id: int) -> int | None:
        """The last index a topic's files hold (None: it has no files)."""
        topic = self.store.get(topic_id)
        return topic.last_index if topic is not None else None

    def positions_in(self, topic_id: int) -> list[str]:
        """The subscribers with a committed position in a topic."""
        return list(self.positions.positions(topic_id))

    def check_writable(self, topic_id: int) -> None:
        """Raise when a topic's files stopped taking writes."""
        topic = self.store.get(topic_id)
        if topic is not None:
            topic.check_writable()

    # -- carrying out a committed group ------------------------------------------------------

    def _remove_topics(self, topic_ids: Sequence[int]) -> None:
        """Delete topics' files (deleted topics, freed stream topics), never while retention
        works on one of them: its tombstone would land in a directory being deleted (an
        error, or a directory left behind that a later re-creation would reopen). A
        retention run holds the lock for one topic at a time, so this waits for one
        truncation at most."""
        if not topic_ids:
            return
        with self.retention.exclusive():
            for topic_id in topic_ids:
                self.store.remove(topic_id)

    def _log_failure(self, commands: int, error: MessagingError) -> None:
        """One line per failed group at most once a second (a full disk fails every group)."""
        reason = "disk_full" if error.status == 507 else (
            "stopped" if isinstance(error, StorageFailedError) else "error")
        self.metrics.write_failures.labels(reason).inc()
        self._failures.log("group", logging.ERROR,
                           "a group of %d commands failed, nothing of it kept: %s", commands,
                           error)

    def _journal(self, touched: set[int], first: int) -> bool:
        """Append the group's line to the state journal (its commit mark, state changes and
        the frames it wrote), without fsync: :meth:`_write_group` makes it durable beside
        the frames. Returns whether there was anything to write."""
        entry = self.machine.journal_entry(first, touched, lambda t: self.store[t].last_index)
        if entry is None:
            return False
        self._catalog_log.append(entry, durable=False)
        return True

    def _record_positions(self, changes: list[PositionChange]) -> None:
        """Apply the heartbeats and position changes of a group that is durable."""
        if not changes:
            return
        before = self.positions.record_all(changes)
        for (topic_id, subscriber_id), previous in before.items():
            if previous is None:
                log.info("topic %d: new subscriber %r", topic_id, subscriber_id)

    def _topic_for_write(self, topic_id: int) -> Topic:
        topic = self.store.get(topic_id)
        if topic is None:
            topic = self.store.create(topic_id)  # its entry fsynced before the group's answer
            entry = self.catalog.topic_settings.get(topic_id)
            topic.max_segment_size = entry.settings.get(MAX_SEGMENT_SIZE, self.max_segment_size)
            if entry.deleted_at:  # created again: what was deleted stays deleted for readers
                topic.hide_through(entry.deleted_at)
            self._new_topics.notify()
            name = self.catalog.name_of(topic_id)
            log.info("topic %d created%s", topic_id, f" (stream {name!r})" if name else "")
        return topic

    def sync_state(self) -> None:
        """fsync the state journal (writer thread): the state changes of every group applied
        so far are durable after it, as its frames are after :meth:`sync`."""
        self._catalog_log.sync()

    def sync(self, topic_ids: Iterable[int]) -> None:
        """fsync the given topics and, beside them, the state journal (a deferred sync: the
        lines are the commit marks of the frames); raises the first failure after trying
        every one (see :meth:`TopicStore.sync`)."""
        try:
            self.store.sync(topic_ids, beside=[self._catalog_log.flush])
        finally:
            self.metrics.fsyncs.inc()

    # -- reading ----------------------------------------------------------------------------

    def topic(self, topic_id: int) -> Topic | TieredTopic | None:
        """The topic as readers see it (with an object store, over the store and the disk),
        or None if nothing was ever published to it."""
        topic = self.store.get(topic_id)
        if topic is None or self.tiered is None:
            return topic
        return self.tiered.view(topic)

    def manifest(self, topic_id: int) -> Manifest:
        """Which of a topic's segments are in the object store (committed state)."""
        return self.committed.manifest(topic_id)

    @property
    def object_store_url(self) -> str | None:
        """The object store's URL (None: this broker has none)."""
        return self.tiered.store.url if self.tiered is not None else None

    def topics(self) -> list[Topic]:
        """Every topic, by id."""
        return self.store.all()

    async def wait_for_topic(self, topic_id: int) -> Topic | TieredTopic | None:
        """The topic, waiting for its first message if needed; None if the broker closed."""
        await self._new_topics.wait_until(
            lambda: topic_id in self.store or self.store.closed)
        return self.topic(topic_id)

    def settings(self, topic_id: int) -> TopicEntry:
        """What the log decided about a topic: its own settings and its last deletion."""
        return self.committed.settings(topic_id)

    def deleted_at(self, topic_id: int) -> int | None:
        """The broker index a topic was last deleted at (None: never)."""
        return self.committed.deleted_at(topic_id)

    def subscribers(self, topic_id: int) -> dict[str, int]:
        """Subscriber URL → heartbeated index for one topic."""
        return self.committed.subscribers(topic_id)

    def stream_name(self, topic_id: int) -> str | None:
        """The name of a named topic (a Durable Streams stream), None for a numeric one."""
        return self.committed.stream_name(topic_id)

    def topic_info(self, topic: TopicView) -> dict[str, Any]:
        """The JSON description of a topic used by the HTTP API (with its stream's name)."""
        return describe.topic_info(topic, self.committed, self.store, self.tiered)

    def diagnostics(self) -> dict[str, Any]:
        """Broker index, topics and counters (the log adds role, leader and peers)."""
        return {"index": self.index, "time": self.time or None, "path": str(self.path),
                **describe.topics(self.topics(), self.committed, self.store, self.tiered)}

    def _topic_rows(self) -> list[TopicRow]:
        return describe.topic_rows(self.topics())

    def _subscriber_rows(self) -> list[tuple[int, str, int, int]]:
        return describe.subscriber_rows(self.committed, self.store)

    # -- retention (messaging.broker.retention) ---------------------------------------------

    def retention_floor(self, topic_id: int, now: float | None = None) -> int:
        """The highest index retention may delete through for ``topic_id`` (see
        :meth:`Retention.floor`)."""
        return self.retention.floor(topic_id, now)

    def enforce_retention(self, now: float | None = None, wall_ms: int | None = None) -> int:
        """Run retention on every topic now (see :meth:`Retention.run`); bytes deleted.
        Blocking."""
        return self.retention.run(now, wall_ms)

    def trim_local(self, topic_ids: Iterable[int]) -> int:
        """Run retention now on the given topics (see :meth:`Retention.trim`). Blocking."""
        return self.retention.trim(topic_ids)

    def expiry(self, topic_id: int, now: float | None = None, wall_ms: int | None = None,
               ) -> int:
        """With an object store: the index through which total retention drops a topic
        (see :meth:`Retention.expiry`). Blocking."""
        return self.retention.expiry(topic_id, now, wall_ms)

    # -- snapshots (see messaging.broker.snapshot) ------------------------------------------

    def install_snapshot(self, stream: IO[bytes],
                         accept: Callable[[dict[str, Any]], None] | None = None,
                         ) -> dict[str, Any]:
        """Replace everything (topics, index, subscribers, catalog) with a snapshot; returns
        its header.

        Writer thread only. ``accept`` may refuse the header (raise) before anything is
        touched. Nothing local is merged in, and a damaged or short snapshot leaves the
        broker as it was: only a whole verified snapshot is renamed over ``topics/``.
        """
        header = snapshot.read_header(stream)
        if accept is not None:
            accept(header)
        staging = snapshot.stage(self.path, header, stream)
        with self.retention.exclusive():  # no truncation in the directories being swapped
            self.store.close_all()
            snapshot.swap(self.path, staging)
            opened = {}
            for described in header["topics"]:
                topic_id = int(described["id"])
                opened[topic_id] = Topic.open(self.store.topics_dir / str(topic_id), topic_id,
                                              self.max_segment_size)
            self.store.replace_all(opened)
        self.index = int(header["index"])
        self.time = int(header.get("time", 0))
        self.positions.restore(header.get("subscribers", {}))
        self.catalog.restore(header.get("catalog"))
        self._configure(opened.values())
        self.save_state()
        self._new_topics.notify()
        log.info("restored snapshot: %d topics, index %d", len(opened), self.index)
        return header


def _lone_messages(results: Sequence[ApplyResult | MessagingError]) -> bool:
    """Whether every command of a group that applied holds one message and no stream
    operation: such a group needs no commit mark (a frame is whole or cut by its checksum)."""
    return all(isinstance(r, MessagingError) or (r.last == r.first and r.stream is None
                                                 and not r.created)
               for r in results)


def _by_time(parts: list[tuple[Run, int | None]]) -> list[tuple[int | None, list[Run]]]:
    """Consecutive runs of one topic grouped by their append time."""
    groups: list[tuple[int | None, list[Run]]] = []
    for run, time_ms in parts:
        if groups and groups[-1][0] == time_ms:
            groups[-1][1].append(run)
        else:
            groups.append((time_ms, [run]))
    return groups
