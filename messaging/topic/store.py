"""The topic store: one data directory's ``topics/``, its lock, its open-file budget, its
fsyncs.

The broker (the state machine) decides what goes where; the store owns the files: it locks
the data directory against a second broker, opens every topic at start-up, creates and
removes topic directories (their entries made durable before a group that needs them is
answered), keeps at most ``max_open_files`` topics holding a segment file open for writing
(least recently used closed first; an idle topic holds no descriptor), writes a group's
topics within that budget, and fsyncs several topics side by side.

Threads: one writer thread changes the store; any thread may look topics up.
"""

from __future__ import annotations

import logging
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from messaging.errors import DataDirectoryError
from messaging.files import (
    fsync_dir,
    lock_exclusive,
    remove_deleting,
    remove_directory,
    storage_error,
)
from messaging.topic.topic import Topic

log = logging.getLogger(__name__)

#: Threads that fdatasync the topics of one group side by side (made on first use).
SYNC_THREADS = 8


def default_max_open_files() -> int:
    """How many topics may keep a segment file open for writing: a quarter of RLIMIT_NOFILE.

    Readers and sockets need the rest; an idle topic holds no descriptor at all.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 16
    return max(8, min(soft // 4, 4096))


class TopicStore:
    """Every topic of ``path/topics``, locked for one broker."""

    def __init__(self, path: Path, max_segment_size: int,
                 max_open_files: int | None = None) -> None:
        self.path = path
        self.max_segment_size = max_segment_size
        self.max_open_files = max_open_files or default_max_open_files()
        self._topics: dict[int, Topic] = {}
        self._lock = threading.Lock()  # guards _topics for readers on other threads
        self._lock_fd: int | None = None
        self.closed = True
        self._new_dirs = False  # topic directories created and not yet fsynced
        self._open_files: OrderedDict[int, None] = OrderedDict()  # topics holding a file
        self._syncers: ThreadPoolExecutor | None = None

    @property
    def topics_dir(self) -> Path:
        """Where the topics' directories live."""
        return self.path / "topics"

    # -- opening and closing ----------------------------------------------------------------

    def open(self) -> list[Topic]:
        """Lock the data directory and recover every topic; returns them."""
        try:
            self.topics_dir.mkdir(parents=True, exist_ok=True)
            fd = lock_exclusive(self.path / ".lock")
        except OSError as err:
            raise DataDirectoryError(f"cannot use data directory {self.path}: "
                                     f"{err.strerror}") from err
        if fd is None:
            raise DataDirectoryError(f"data directory {self.path} is in use by another "
                                     "broker")
        self._lock_fd = fd
        self.closed = False
        remove_deleting(self.topics_dir)  # deletions a crash interrupted
        for entry in sorted(self.topics_dir.iterdir()):
            if entry.is_dir() and entry.name.isdigit():
                topic = Topic.open(entry, int(entry.name), self.max_segment_size)
                self._topics[topic.id] = topic
        return self.all()

    def close(self) -> None:
        """Sync and close every topic, stop the fsync threads; :meth:`unlock` follows."""
        for topic in self.all():
            topic.close()
        if self._syncers is not None:
            self._syncers.shutdown()
            self._syncers = None

    def unlock(self) -> None:
        """Let another broker open the data directory."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.closed = True

    # -- looking topics up (any thread) -----------------------------------------------------

    def get(self, topic_id: int) -> Topic | None:
        """The topic, or None if it has no directory."""
        with self._lock:
            return self._topics.get(topic_id)

    def __getitem__(self, topic_id: int) -> Topic:
        """A topic that must exist (the writer thread's, within a group)."""
        with self._lock:
            return self._topics[topic_id]

    def __contains__(self, topic_id: int) -> bool:
        with self._lock:
            return topic_id in self._topics

    def all(self) -> list[Topic]:
        """Every topic, by id."""
        with self._lock:
            return [self._topics[i] for i in sorted(self._topics)]

    def ids(self) -> list[int]:
        """Every topic's id."""
        with self._lock:
            return list(self._topics)

    @property
    def open_files(self) -> int:
        """How many topics hold a segment file open for writing now."""
        return len(self._open_files)

    # -- creating, reopening, removing (writer thread) --------------------------------------

    def create(self, topic_id: int) -> Topic:
        """A new topic's directory; its entry is fsynced by :meth:`sync_new_dirs`."""
        try:
            topic = Topic.open(self.topics_dir / str(topic_id), topic_id, self.max_segment_size)
        except OSError as err:
            raise storage_error(f"creating topic {topic_id}", err) from err
        with self._lock:
            self._topics[topic_id] = topic
        self._new_dirs = True
        return topic

    def sync_new_dirs(self) -> None:
        """Make the directories :meth:`create` made durable (once per group)."""
        if self._new_dirs:
            fsync_dir(self.topics_dir)
            self._new_dirs = False

    def reopen(self, topic: Topic) -> Topic:
        """Open a topic again from its files (after :meth:`Topic.cut_after` closed it)."""
        reopened = Topic.open(topic.path, topic.id, self.max_segment_size)
        with self._lock:
            self._topics[topic.id] = reopened
        return reopened

    def remove(self, topic_id: int) -> None:
        """Close a topic and delete its files.

        The directory is renamed away before its files are deleted, so its name is free at
        once and never holds part of the old topic: a topic created again under the same
        id starts empty even when a crash or a failure cut the deletion short (the next
        start-up removes what is left under the other name). A failed rename leaves the
        directory for the broker's start-up checks.
        """
        with self._lock:
            topic = self._topics.pop(topic_id, None)
        self._open_files.pop(topic_id, None)
        path = self.topics_dir / str(topic_id)
        if topic is not None:
            topic.close()
        try:
            remove_directory(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            log.warning("could not remove %s: %s", path, err.strerror or err)

    def replace_all(self, topics: dict[int, Topic]) -> None:
        """Take over topics opened from new files (a snapshot installed under ``topics/``)."""
        with self._lock:
            self._topics = topics
        self._open_files.clear()

    def close_all(self) -> None:
        """Close and forget every topic (their files are about to be replaced)."""
        for topic in self.all():
            topic.close()
        self.replace_all({})

    # -- writing within the open-file budget (writer thread) --------------------------------

    def write(self, topic_ids: list[int], *, durable: bool) -> int:
        """Write (and fsync when ``durable``) every topic; returns how many fsync rounds ran.

        Files other topics keep open are closed first as far as this group needs the room.
        A group touching more topics than ``max_open_files`` goes in slices, those already
        holding a file first: each slice is written, fsynced and its files closed before the
        next one opens any.
        """
        budget = self.max_open_files
        self._make_room(topic_ids)
        self.write_times(topic_ids)  # time records first, all topics' fsyncs at once
        if len(topic_ids) <= budget:
            for topic_id in topic_ids:
                self._topics[topic_id].write()
            if durable:
                self.sync(topic_ids)
                return 1
            return 0
        topic_ids = sorted(topic_ids, key=lambda topic_id: topic_id not in self._open_files)
        rounds = 0
        for start in range(0, len(topic_ids), budget):
            part = topic_ids[start:start + budget]
            for topic_id in part:
                self._topics[topic_id].write()
            self.sync(part)
            rounds += 1
            for topic_id in part:
                if self._topics[topic_id].release():
                    self._open_files.pop(topic_id, None)
        return rounds

    def sync(self, topic_ids: Iterable[int],
             beside: Sequence[Callable[[], None]] = ()) -> None:
        """fsync the given topics, and run the fsyncs ``beside`` with them (the state
        journal's line of the group); raises the first failure after trying every one.

        Several files are fsynced side by side on a few threads: the file system commits
        their journal entries together (ten topics' fdatasyncs take about half as long as one
        after another on ext4). A topic that is gone by now (a deleted stream's, between a
        write and a deferred fsync) has nothing left to make durable.
        """
        topics = [topic for topic in map(self.get, topic_ids) if topic is not None]
        if len(topics) <= 1:
            # One topic: its fsync and the journal's one after the other on this thread.
            # Handing one to another thread costs more than it saves: that thread must get
            # the GIL back (up to the switch interval while the event loop holds it), and
            # the file system commits two small fdatasyncs about as fast either way.
            _one_after_another([*(topic.sync for topic in topics), *beside])
        else:
            self._side_by_side([*beside, *(topic.sync for topic in topics)])

    def write_times(self, topic_ids: Iterable[int]) -> None:
        """Write and fsync the time records the given topics staged, side by side (each
        topic's before its frames, as :meth:`Topic.write` would one after another); raises
        the first failure after trying every topic."""
        topics = [topic for topic in map(self.get, topic_ids)
                  if topic is not None and topic.times_staged]
        if len(topics) > 1:
            self._side_by_side([topic.write_times for topic in topics])

    def _side_by_side(self, calls: list[Callable[[], None]]) -> None:
        """Run blocking calls at once: the first on this thread, the others on the fsync
        threads; raises the first failure once every call has ended."""
        if not calls:
            return
        if len(calls) == 1:
            calls[0]()
            return
        if self._syncers is None:
            self._syncers = ThreadPoolExecutor(max_workers=SYNC_THREADS,
                                               thread_name_prefix="messaging-fsync")
        outcomes = [self._syncers.submit(call) for call in calls[1:]]
        try:
            calls[0]()
        finally:
            wait(outcomes)
        for outcome in outcomes:
            outcome.result()  # the first failure, once every fsync has ended

    def _make_room(self, group: list[int]) -> None:
        """Close other topics' write files, least recently used first, so that those open
        while ``group`` is written stay within ``max_open_files`` (a file not yet fsynced,
        under ``--fsync interval`` or ``never``, stays open)."""
        files = self._open_files
        if len(files) + len(group) <= self.max_open_files:
            return  # room enough even if every topic of the group opens a file
        members = set(group)
        others = [topic_id for topic_id in files if topic_id not in members]
        excess = len(others) - (self.max_open_files - min(len(members), self.max_open_files))
        for topic_id in others[:max(excess, 0)]:
            topic = self._topics.get(topic_id)
            if topic is None or topic.release():
                del files[topic_id]

    def release_idle(self, used: Iterable[int]) -> None:
        """Keep at most ``max_open_files`` topics holding a segment file open for writing."""
        files = self._open_files
        for topic_id in used:
            files[topic_id] = None
            files.move_to_end(topic_id)
        if len(files) <= self.max_open_files:
            return
        for topic_id in list(files):
            topic = self._topics.get(topic_id)
            if topic is None or topic.release():
                del files[topic_id]
                if len(files) <= self.max_open_files:
                    return


def _one_after_another(calls: Sequence[Callable[[], None]]) -> None:
    """Run blocking calls in order on this thread; raises the first failure once every call
    has run (a failed fsync of one file does not spare the others theirs)."""
    failure: BaseException | None = None
    for call in calls:
        try:
            call()
        except BaseException as err:  # re-raised below, once the others ran
            failure = failure or err
    if failure is not None:
        raise failure
