"""The Broker: the state machine every log (local, or etcd in a cluster) drives.

``apply(command)`` takes a command (a buffer of frames, index 0), assigns each message the
next broker index (``previous + 1`` across all topics, from 1), and appends runs of frames to
their topics. Assignment is a pure function of the applied command sequence, and topics skip
indexes not above their own, so replaying commands after a restart is idempotent.

Broker-internal frames (type bit 0x8000) take no index and are never stored in a topic: they
record subscriber progress (:data:`SET_TOPIC_MAX_INDEX`) and consumer position resets and
deletes (:data:`messaging.broker.subscribers.CONSUMER_OP`).

A group of commands is one transaction (:meth:`Broker.write_group`): the state it changes
besides frames (catalog, producer sequence numbers, subscriber positions) is written to the
state journal first, then every topic it touches is written once and fsynced once, and only
then does any of it become visible; any failure undoes all of it, so a client that got an
error never sees its messages, and nothing on disk is left that the in-memory state does not
account for. A crash between the journal and the frames is undone at start-up (the line is
dropped, the frames that made it are cut back), so frames and the state recorded with them
always agree.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from messaging.aio import Notifier
from messaging.broker import snapshot
from messaging.broker.catalog import (
    STREAM_OP,
    Catalog,
)
from messaging.broker.commands import (
    ApplyResult,
    Run,
    is_topic_command,
    largest_message,
    stamp,
)
from messaging.broker.metrics import BrokerMetrics, TopicRow
from messaging.broker.snapshot import FORMAT
from messaging.broker.state_log import CatalogLog, incomplete
from messaging.broker.subscribers import (
    DELETE,
    PositionChange,
    Subscribers,
)
from messaging.broker.topic_settings import (
    CONFIGURE,
    EXPIRE,
    MAX_MESSAGE_SIZE,
    MAX_SEGMENT_SIZE,
    MAX_TOPIC_SIZE,
    OFFLOAD,
    RETENTION_AGE,
    TopicEntry,
    TopicOp,
    manifest_change,
)
from messaging.clock import now_ms
from messaging.config import (
    DEFAULT_MAX_SEGMENT_SIZE,
    DEFAULT_MAX_TOPIC_SIZE,
    DEFAULT_SUBSCRIBER_TIMEOUT,
)
from messaging.errors import (
    BadRequestError,
    DataDirectoryError,
    MessageTooLargeError,
    MessagingError,
    NotFoundError,
    StorageFailedError,
)
from messaging.files import (
    read_json,
    remove_stale_temporaries,
    storage_error,
    write_json_atomic,
)
from messaging.frames import decode_one, frame_size
from messaging.placement import NAMED_TOPIC_BASE
from messaging.quiet_log import QuietLog
from messaging.tiered.manifest import Manifest
from messaging.tiered.view import Tiered, TieredTopic
from messaging.topic.store import TopicStore
from messaging.topic.times import TIME_RESOLUTION_MS
from messaging.topic.topic import Topic
from messaging.topic.view import TopicView

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
                 first_named_topic: int = NAMED_TOPIC_BASE) -> None:
        self.path = path
        self.max_segment_size = max_segment_size
        self.max_topic_size = max_topic_size
        self.retention_age = retention_age  # seconds; None: off
        #: With an object store: how much of what is in it stays on the disk too (None: as
        #: much as the total retention keeps; seconds for the age).
        self.local_retention_size = local_retention_size
        self.local_retention_age = local_retention_age
        self.subscriber_timeout = subscriber_timeout
        self.metrics = metrics or BrokerMetrics()
        self.metrics.watch_subscribers(self._subscriber_rows)
        self.metrics.watch_topics(self._topic_rows)
        self.index = 0
        #: The append time of the messages applied now (ms since the epoch; 0: none yet): see
        #: :meth:`advance_time`. Part of the state, like the index.
        self.time = 0
        #: The topics' files: directories, the lock, the open-file budget, fsyncs.
        self.store = TopicStore(path, max_segment_size, max_open_files)
        self.positions = Subscribers(subscriber_timeout)
        #: Named topics (streams): changed only by commands, in the group transaction.
        self.catalog = Catalog(first_named_topic)
        #: Woken after every group that changed the catalog (closure, deletion, creation).
        self.streams_changed = Notifier()
        self._catalog_log = CatalogLog(path)
        self._new_topics = Notifier()
        self._save_lock = threading.Lock()  # one broker.json writer at a time
        self._retention_lock = threading.Lock()  # held by a retention run, and by close()
        self._closing = False
        self._heartbeats: list[PositionChange] = []  # recorded by the group being applied
        self._deleting: list[int] = []  # topics whose files the group being applied deletes
        self._configured: list[int] = []  # topics whose settings it changes
        #: The group being applied changes a manifest; the state journal holds such a
        #: change that broker.json does not hold durably yet. A manifest change is always
        #: made durable, whatever --fsync says: local copies are deleted once it is
        #: committed, and a power loss that took the record but kept a deletion would leave
        #: data in the store that nobody knows of.
        self._manifest_staged = False
        self._manifest_in_journal = False
        self._failures = QuietLog(log, _FAILURE_LOG_INTERVAL)
        #: With an object store: reads below the local segments go to it (set by the
        #: server, :mod:`messaging.offload`); None: every read is local.
        self.tiered: Tiered | None = None
        #: What diagnostics show of the object store (set with ``tiered``).
        self.offload_status: Callable[[], dict[str, Any]] | None = None

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
        state: dict[str, Any] = {"format": FORMAT}
        meta = self.path / "broker.json"
        if meta.exists():
            try:
                state = read_json(meta)
            except (OSError, ValueError) as err:
                raise DataDirectoryError(f"{meta} is unreadable: {err}") from err
            if state.get("format") != FORMAT:
                raise DataDirectoryError(f"{meta} has format {state.get('format')!r}; this "
                                         f"broker reads format {FORMAT}")
        remove_stale_temporaries(meta)
        self.catalog.restore(state.get("catalog"))
        self.positions.restore(state.get("subscribers", {}))
        try:
            journaled = self._replay_journal(int(state.get("catalog_seq", 0)))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataDirectoryError(f"{self._catalog_log.path} is unreadable: {err}") from err
        self._reconcile_streams()
        self._reconcile_deleted()
        self._configure(self.store.all())
        # Each source alone may be behind: broker.json is saved now and then, a journal line
        # is written only by groups that change state, and a deleted stream's topic took its
        # indexes with it. Reusing an index would break the consistent cut.
        self.index = max([int(state.get("index", 0)), journaled]
                         + [t.last_index for t in self.store.all()])
        self.time = max([int(state.get("time", 0))]
                        + [t.last_time or 0 for t in self.store.all()])
        # Nothing is written here: a broker whose disk is full still starts and serves reads.
        log.info("opened %s: %d topics, index %d", self.path, len(self.store.ids()), self.index)

    def _replay_journal(self, after: int) -> int:
        """Apply the state journal's lines after ``after`` (start-up); returns the broker
        index the last of them recorded.

        Its last line may belong to a group a crash interrupted after the line was written and
        before all of its frames were: that group was never acknowledged, so the line is
        dropped and the frames of it that reached the disk are cut back (see
        :mod:`messaging.broker.state_log`). Frames and the state recorded with them then agree.
        """
        entries = self._catalog_log.read(after)
        if entries and incomplete(entries[-1], self._last_on_disk):
            self._cut_group(entries.pop())
            self._catalog_log.drop_last()
        for entry in entries:
            self.catalog.replay(entry.get("changes", {}))
            for topic, index, name, kind in entry.get("positions", []):
                self.positions.apply(PositionChange(topic, index, name, kind))
        return int(entries[-1].get("index", 0)) if entries else 0

    def _last_on_disk(self, topic_id: int) -> int:
        topic = self.store.get(topic_id)
        return topic.last_index if topic is not None else 0

    def _cut_group(self, entry: dict[str, Any]) -> None:
        """Remove the frames of a group the journal records as interrupted (start-up)."""
        first = int(entry["group"]["first"])
        for key in entry["group"]["last"]:
            topic = self.store.get(int(key))
            if topic is None or topic.last_index < first:
                continue
            removed = topic.cut_after(first - 1)
            log.warning("topic %d: removed %d bytes of a group a crash interrupted (from index "
                        "%d; it was never acknowledged)", topic.id, removed, first)
            if not any(topic.path.iterdir()):  # it held nothing but that group
                self.store.remove(topic.id)
            else:
                self.store.reopen(topic)

    def _reconcile_streams(self) -> None:
        """Make the named topics on disk match the catalog saved with them (start-up).

        A group is acknowledged only after ``broker.json`` (the catalog) is saved, so frames
        a named topic holds beyond its stream's tail were never acknowledged: they go, as do
        the directories of named topics the catalog does not know (a create or a delete that
        a crash interrupted).
        """
        for topic_id in [t for t in self.store.ids() if t >= NAMED_TOPIC_BASE]:
            name = self.catalog.name_of(topic_id)
            topic = self.store.get(topic_id)
            if name is None or topic is None:
                self.store.remove(topic_id)
                continue
            stream = self.catalog.streams[name]
            if topic.last_index > stream.tail[0]:
                topic.cut_after(stream.tail[0])
                self.store.reopen(topic)

    def _reconcile_deleted(self) -> None:
        """Delete the files of topics deleted by a command whose group a crash interrupted
        after its journal line (start-up): every frame they hold predates the deletion."""
        for topic in self.store.all():
            deleted_at = self.catalog.topic_settings.committed(topic.id).deleted_at
            if deleted_at is not None and 0 < topic.last_index <= deleted_at:
                log.warning("topic %d: removing its files, deleted at index %d", topic.id,
                            deleted_at)
                self.store.remove(topic.id)

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
        with self._retention_lock:
            self._closing = True
        self.store.close()
        if not self.store.closed:
            try:
                self.save_state()
            except OSError as err:
                # Heartbeats were saved as they were acknowledged; this only refreshes the index.
                log.warning("could not save %s/broker.json on close: %s", self.path,
                            err.strerror or err)
            self.store.unlock()
        self._new_topics.notify()

    # -- the state machine ------------------------------------------------------------------

    def advance_time(self, time_ms: int | None) -> int | None:
        """The append time of a command formed at ``time_ms`` (None: a command that carries
        no time, such as one written before times existed): the broker's time moves to it
        when it is at least :data:`TIME_RESOLUTION_MS` ahead, and never back, so time order
        is index order even when a clock steps back, and a topic's time index gets a record
        at most once per step. Deterministic: every node applying the same commands from
        the same state derives the same times. None while no command has carried a time."""
        if time_ms is not None and time_ms >= self.time + TIME_RESOLUTION_MS:
            self.time = time_ms
        return self.time or None

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

        Stamps indexes, stages the frames in their topics, writes the group's state changes
        to the state journal (fsynced when ``durable``), writes each topic once, fsyncs them
        (when ``durable``), and only then makes the group visible. A command that cannot
        apply (malformed, or for a topic that stopped taking writes) gets its own error and
        the others apply; a failed write, fsync or save undoes the whole group and every
        command gets that error. ``notify=False`` leaves waking the topics' followers to the
        caller (:meth:`notify`), so that it can answer the publishers first.
        """
        before, before_time = self.index, self.time
        touched: set[int] = set()
        journaled = False
        try:
            results = self._stage_group(commands, times, touched)
            self.store.sync_new_dirs()
            for topic_id in self.catalog.removed:  # a freed stream's positions go with it
                self._forget_positions(topic_id)
            # The state first, then the frames: see messaging.broker.state_log for why.
            journaled = self._journal(touched, before + 1,
                                      durable=durable or self._manifest_staged)
            debug = log.isEnabledFor(logging.DEBUG)
            written = time.perf_counter() if debug else 0.0
            rounds = self.store.write(list(touched), durable=durable)
            if rounds:
                self.metrics.fsyncs.inc(rounds)
            if debug:
                log.debug("group commit: %d commands, %d bytes, %d messages in %d topics, "
                          "written%s in %.3f ms", len(commands), sum(map(len, commands)),
                          self.index - before, len(touched),
                          f" and fsynced ({rounds} rounds)" if rounds else "",
                          (time.perf_counter() - written) * 1000)
        except (MessagingError, OSError) as err:
            error = err if isinstance(err, MessagingError) else storage_error(
                f"writing to {self.path}", err)
            if journaled:
                self._catalog_log.undo(durable=durable)
            self._abort(touched, before)
            self.time = before_time
            self._log_failure(len(commands), error)
            return [error] * len(commands)
        self._commit_positions()
        if self._manifest_staged and journaled:
            self._manifest_in_journal = True
        self._manifest_staged = False
        # The catalog first: a stream reader that sees a new tail before its topic's frames
        # finds nothing yet and waits for the topic's commit, which is still to come. The
        # other order would show it the frames under an old tail, caught up, and it would
        # wait for a commit that has already happened.
        removed, changed = self.catalog.commit()
        for topic_id in touched:
            self.store[topic_id].commit(notify=notify)
        self._remove_topics(removed)
        self._commit_topic_ops()
        self.store.release_idle(t for t in touched if t not in removed)
        if changed or removed:
            self.streams_changed.notify()
        if journaled and self._catalog_log.due:
            try:
                # fold the journal into broker.json (durably when it holds a manifest change)
                self.save_state(durable=durable or self._manifest_in_journal)
                self._manifest_in_journal = False
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
        """Stamp every command and stage its frames in their topics (no I/O but new topics)."""
        runs: dict[int, list[tuple[Run, int | None]]] = {}
        results: list[ApplyResult | MessagingError] = []
        for command, command_time in zip(commands, times, strict=True):
            before, before_time = self.index, self.time
            mark = self.catalog.mark()
            created = False
            try:
                append_time = self.advance_time(command_time)
                stamped = stamp(command, self.index, self.catalog)
                self.index = stamped.index
                first, command_runs = stamped.first, stamped.runs
                heartbeats, outcome = stamped.heartbeats, stamped.stream
                for topic_id, run in command_runs:
                    topic = self.store.get(topic_id)
                    if topic is not None:
                        topic.check_writable()
                    self._check_message_size(topic_id, run)
                if stamped.topic_op is not None:
                    created = self._stage_topic_op(stamped.topic_op)
            except MessagingError as err:
                self.index, self.time = before, before_time
                self.catalog.rollback(mark)
                results.append(err)
                continue
            topics = []
            for topic_id, run in command_runs:
                runs.setdefault(topic_id, []).append((run, append_time))
                topics.append(topic_id)
            self._heartbeats.extend(heartbeats)
            results.append(ApplyResult(first, self.index if first else 0, frozenset(topics),
                                       outcome, created))
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

    def _stage_topic_op(self, op: TopicOp) -> bool:
        """Stage a topic's new settings, or its deletion; returns whether a configure
        created the topic.

        A deletion takes a broker index of its own and records it (``deleted_at``), forgets
        the topic's settings and its subscribers' positions, and deletes its files when the
        group commits, unless they hold frames from after that index (a command replayed
        after a restart, when the topic was created again since): deleting them is then
        already done. Its own index puts every message of a later incarnation strictly
        after ``deleted_at``, while every read that could have begun before the deletion
        starts at or below it (the old topic's last index + 1 included): a reader resuming
        right after the last message it saw is fenced (410), not fed the new topic's first
        message as a continuation. Being a command's effect on the index, it is the same on
        every node and after every replay.
        """
        table = self.catalog.topic_settings
        topic = self.store.get(op.topic)
        if op.kind in (OFFLOAD, EXPIRE):
            self._stage_manifest(op)
            return False
        if op.kind == CONFIGURE:
            if op.topic >= NAMED_TOPIC_BASE and self.catalog.name_of(op.topic) is None:
                raise NotFoundError(f"topic {op.topic} is not a stream's topic id")
            table.stage(op.topic, table.get(op.topic).configured(op.settings))
            self._configured.append(op.topic)
            if op.create and topic is None and op.topic < NAMED_TOPIC_BASE:
                self._topic_for_write(op.topic)  # empty; its entry fsynced with the group
                return True
            return False
        if op.topic >= NAMED_TOPIC_BASE:
            name = self.catalog.name_of(op.topic)
            held = f"holds the stream {name!r}" if name is not None else "is a stream's"
            raise BadRequestError(f"topic {op.topic} {held}: delete it with DELETE "
                                  f"/v1/stream/{name or '{name}'}")
        self.index += 1  # the deletion's own index (see above); undone with the command
        table.stage(op.topic, TopicEntry(deleted_at=self.index))
        self.catalog.forget_producers(op.topic)
        self._forget_positions(op.topic)
        if topic is not None and topic.last_index <= self.index:
            self._deleting.append(op.topic)
        return False

    def _forget_positions(self, topic_id: int) -> None:
        """Stage forgetting every subscriber and consumer position in a deleted topic: the
        committed ones and those the group itself records before the deletion."""
        names = set(self.positions.positions(topic_id))
        names.update(c.name for c in self._heartbeats if c.topic == topic_id)
        for name in sorted(names):
            self._heartbeats.append(PositionChange(topic_id, 0, name, DELETE))

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
            self._manifest_staged = True

    def _commit_topic_ops(self) -> None:
        """Carry out the topic commands of a group that committed."""
        deleting, self._deleting = self._deleting, []
        self._remove_topics(deleting)
        for topic_id in deleting:
            log.info("topic %d deleted at index %d", topic_id, self.index)
        configured, self._configured = self._configured, []
        self._configure(t for t in map(self.store.get, configured) if t is not None)

    def _remove_topics(self, topic_ids: Sequence[int]) -> None:
        """Delete topics' files (deleted topics, freed stream topics), never while retention
        works on one of them: its tombstone would land in a directory being deleted (an
        error, or a directory left behind that a later re-creation would reopen). A
        retention run holds the lock for one topic at a time, so this waits for one
        truncation at most."""
        if not topic_ids:
            return
        with self._retention_lock:
            for topic_id in topic_ids:
                self.store.remove(topic_id)

    def _abort(self, touched: Iterable[int], index: int) -> None:
        """Undo a failed group: topics cut back to what was committed, index restored."""
        for topic_id in touched:
            self.store[topic_id].abort()
        self._heartbeats.clear()
        self._deleting.clear()
        self._configured.clear()
        self._manifest_staged = False
        self.catalog.rollback()
        self.index = index

    def _log_failure(self, commands: int, error: MessagingError) -> None:
        """One line per failed group at most once a second (a full disk fails every group)."""
        reason = "disk_full" if error.status == 507 else (
            "stopped" if isinstance(error, StorageFailedError) else "error")
        self.metrics.write_failures.labels(reason).inc()
        self._failures.log("group", logging.ERROR,
                           "a group of %d commands failed, nothing of it kept: %s", commands,
                           error)

    def _journal(self, touched: set[int], first: int, *, durable: bool) -> bool:
        """Write the group's state changes (catalog, positions) and the frames it stages to
        the state journal, before the frames; returns whether there was anything to write."""
        if not self._heartbeats and not self.catalog.pending:
            return False
        entry: dict[str, Any] = {"index": self.index}
        if self.catalog.pending:
            entry["changes"] = self.catalog.changes()
        if self._heartbeats:
            entry["positions"] = [[c.topic, c.index, c.name, c.kind] for c in self._heartbeats]
        # A topic the group also frees (a stream written and deleted in one group) is gone
        # after it commits: its frames prove nothing, and a restart must not miss them.
        covered = touched.difference(self.catalog.removed)
        if covered:
            entry["group"] = {"first": first,
                              "last": {str(t): self.store[t].last_index for t in covered}}
        self._catalog_log.append(entry, durable=durable)
        return True

    def _commit_positions(self) -> None:
        """Apply the heartbeats and position changes of a group that is durable."""
        heartbeats, self._heartbeats = self._heartbeats, []
        if not heartbeats:
            return
        before = self.positions.record_all(heartbeats)
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

    def sync(self, topic_ids: Iterable[int]) -> None:
        """fsync the given topics (a deferred sync); raises the first failure after trying
        every topic (see :meth:`TopicStore.sync`)."""
        try:
            self.store.sync(topic_ids)
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
        return self.catalog.topic_settings.committed(topic_id).manifest

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
        return self.catalog.topic_settings.committed(topic_id)

    def deleted_at(self, topic_id: int) -> int | None:
        """The broker index a topic was last deleted at (None: never)."""
        return self.catalog.topic_settings.committed(topic_id).deleted_at

    def subscribers(self, topic_id: int) -> dict[str, int]:
        """Subscriber URL → heartbeated index for one topic."""
        return self.positions.positions(topic_id)

    def stream_name(self, topic_id: int) -> str | None:
        """The name of a named topic (a Durable Streams stream), None for a numeric one."""
        return self.catalog.name_of(topic_id)

    def topic_info(self, topic: TopicView) -> dict[str, Any]:
        """The JSON description of a topic used by the HTTP API (with its stream's name)."""
        info: dict[str, Any] = {}
        name = self.catalog.name_of(topic.id)
        if name is not None:
            info["name"] = name
        info |= {
            "id": topic.id,
            "first_index": topic.first_index,
            "last_index": topic.committed_index,
            "size": topic.size,
            "segments": topic.segment_count,
            "subscribers": self.subscribers(topic.id),
        }
        if self.tiered is not None:
            manifest = self.manifest(topic.id)
            local = topic.local if isinstance(topic, TieredTopic) else self.store.get(topic.id)
            if local is not None:
                info["first_index"] = self.tiered.view(local).first_index
                info["local_first_index"] = local.first_index
            info["offloaded_size"] = manifest.size
            info["offloaded_segments"] = len(manifest.objects)
            info["offloaded_through"] = manifest.offloaded
        return info

    def diagnostics(self) -> dict[str, Any]:
        """Broker index, topics and counters (the log adds role, leader and peers)."""
        topics = []
        for topic in self.topics():
            info = self.topic_info(topic)
            info["stats"] = topic.stats.copy()
            failure = topic.failure
            info["writable"] = failure is None
            info["followers"] = topic.waiting  # streams parked until its next commit
            if failure is not None:
                info["failure"] = str(failure)
            topics.append(info)
        described: dict[str, Any] = {
            "index": self.index, "time": self.time or None, "path": str(self.path),
            "topics": topics, "open_files": self.store.open_files,
            "max_open_files": self.store.max_open_files}
        if self.offload_status is not None:
            described["object_store"] = self.offload_status()
        return described

    def _topic_rows(self) -> list[TopicRow]:
        """Every topic's figures and health, for the metrics."""
        return [TopicRow(t.id, t.stats.corrupt_frames, t.failure is None, t.size,
                         t.first_index, t.committed_index, t.segment_count)
                for t in self.topics()]

    def _subscriber_rows(self) -> list[tuple[int, str, int, int]]:
        rows = []
        for topic_id, subscriber_id, index in self.positions.rows():
            topic = self.store.get(topic_id)
            last = topic.committed_index if topic is not None else 0
            rows.append((topic_id, subscriber_id, index, max(last - index, 0)))
        return rows

    # -- retention --------------------------------------------------------------------------

    def retention_floor(self, topic_id: int, now: float | None = None) -> int:
        """The highest index retention may delete through for ``topic_id``.

        The smallest index a live subscriber heartbeated; unlimited with no live subscriber.
        """
        return self.positions.floor(topic_id, now)

    def enforce_retention(self, now: float | None = None, wall_ms: int | None = None) -> int:
        """Delete old segments of every topic over its max-topic-size (its own setting, else
        ``max_topic_size``), and those whose newest message is older than its retention-age
        (its own, else ``retention_age``); returns bytes deleted. ``now`` (monotonic) is
        when subscribers are judged live, ``wall_ms`` the wall clock ages are measured from
        (defaults: the clocks now).

        Blocking (run it on a thread). Each topic is truncated under the retention lock,
        which the writer takes to delete topics' files and :meth:`close` to stop: a topic
        is never truncated while its directory is being deleted, or after it was (its
        :class:`Topic` is then no longer the store's), and neither waits for more than one
        topic's truncation.
        """
        deleted = 0
        for topic in self.topics():
            freed = self._retain(topic, now, wall_ms)
            if freed is None:
                break
            deleted += freed
        return deleted

    def trim_local(self, topic_ids: Iterable[int]) -> int:
        """Run retention now on the given topics (with an object store: those whose
        manifest just grew, so local copies go as soon as they are in the store rather than
        at the next timed run); bytes deleted. Blocking (a thread)."""
        deleted = 0
        for topic_id in topic_ids:
            topic = self.store.get(topic_id)
            freed = self._retain(topic, None, None) if topic is not None else 0
            if freed is None:
                break
            deleted += freed
        return deleted

    def _retain(self, topic: Topic, now: float | None, wall_ms: int | None) -> int | None:
        """Retention of one topic under the retention lock; bytes deleted (None: closing)."""
        table = self.catalog.topic_settings
        with self._retention_lock:
            if self._closing:
                return None
            if self.store.get(topic.id) is not topic:
                return 0  # deleted (or replaced by a snapshot) since the list was made
            settings = table.committed(topic.id).settings
            limit = settings.get(MAX_TOPIC_SIZE, self.max_topic_size)
            older_than = self._age_limit(settings, wall_ms)
            before = topic.stats.deleted_segments
            if self.tiered is not None:
                freed = self._truncate_local(topic, limit, older_than, wall_ms)
            elif topic.size <= limit and older_than is None:
                return 0
            else:
                freed = topic.truncate(limit, self.retention_floor(topic.id, now), older_than)
        self.metrics.retention_deleted_bytes.inc(freed)
        self.metrics.retention_deleted_segments.inc(topic.stats.deleted_segments - before)
        return freed

    def _truncate_local(self, topic: Topic, limit: int, older_than: int | None,
                        wall_ms: int | None) -> int:
        """Retention of a topic's local copies with an object store: whatever total
        retention expired goes, and of the segments in the store (recorded in the manifest,
        so verified there) the oldest go while the disk holds more than the local limits.
        A segment not in the store never goes here, whatever the limits say: when the store
        fails, the disk fills instead (see :meth:`expiry` for total retention)."""
        manifest = self.manifest(topic.id)
        freed = topic.truncate(0, manifest.expired) if manifest.expired else 0
        if not manifest.offloaded:
            return freed
        size = limit if self.local_retention_size is None else self.local_retention_size
        local_older = older_than
        if self.local_retention_age is not None:
            local_older = ((now_ms() if wall_ms is None else wall_ms)
                           - round(self.local_retention_age * 1000))
        return freed + topic.truncate(size, manifest.covered, local_older)

    def expiry(self, topic_id: int, now: float | None = None, wall_ms: int | None = None,
               ) -> int:
        """With an object store: the index through which total retention drops a topic
        (its objects first, then local segments not in the store), or 0 for nothing new.

        Total size is the store's objects plus the local segments above them; the oldest
        go while it is above max-topic-size, and everything up to the last piece whose
        newest message is older than retention-age; never past what a live subscriber or a
        stored consumer position still needs. The offloading node turns it into a command
        through the log, so every node and the manifest agree. Blocking (a thread)."""
        topic = self.store.get(topic_id)
        if topic is None:
            return 0
        manifest = self.manifest(topic_id)
        settings = self.catalog.topic_settings.committed(topic_id).settings
        limit = settings.get(MAX_TOPIC_SIZE, self.max_topic_size)
        older_than = self._age_limit(settings, wall_ms)
        floor = self.retention_floor(topic_id, now)
        pieces = [(o.last, o.size, o.last_time) for o in manifest.objects]
        segments = topic.segments()
        for segment in segments[:-1]:
            topic.ensure_indexed(segment)
            if segment.committed_last_index > manifest.covered and segment.committed_count:
                pieces.append((segment.committed_last_index, segment.size,
                               segment.last_time()))
        total = sum(size for _last, size, _time in pieces) + (
            segments[-1].size if segments else 0)
        aged = 0
        if older_than is not None:
            for k, (_last, _size, newest) in enumerate(pieces):
                if newest is not None:
                    if newest >= older_than:
                        break
                    aged = k + 1
        through = 0
        for k, (last, size, _newest) in enumerate(pieces):
            if (total <= limit and k >= aged) or last > floor:
                break
            through = last
            total -= size
        return through if through > manifest.expired else 0

    def _age_limit(self, settings: Mapping[str, int | None], wall_ms: int | None,
                   ) -> int | None:
        """The append time (ms) before which a topic's segments are old enough to delete
        (None: no age limit). A topic's ``retention-age`` is in ms, 0 meaning off."""
        age_ms = settings.get(RETENTION_AGE)
        if age_ms is None and self.retention_age is not None:
            age_ms = round(self.retention_age * 1000)
        if not age_ms:
            return None
        return (now_ms() if wall_ms is None else wall_ms) - age_ms

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
        with self._retention_lock:  # no truncation in the directories being swapped
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


def _by_time(parts: list[tuple[Run, int | None]]) -> list[tuple[int | None, list[Run]]]:
    """Consecutive runs of one topic grouped by their append time."""
    groups: list[tuple[int | None, list[Run]]] = []
    for run, time_ms in parts:
        if groups and groups[-1][0] == time_ms:
            groups[-1][1].append(run)
        else:
            groups.append((time_ms, [run]))
    return groups
