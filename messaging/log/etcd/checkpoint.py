"""A cluster node's checkpoint, ``DATA/cluster.json``, and when it is written.

The file is one JSON object, written atomically (temp file, fsync, rename, directory fsync):

- ``format``: the snapshot format of the broker (:data:`messaging.broker.snapshot.FORMAT`);
- ``cluster``: the cluster (or topic group) whose log this directory follows;
- ``revision``: etcd's revision through which every log entry is durable here;
- ``index``: the broker index after that revision;
- ``time``: the broker's time as of that revision (absent in files from before times);
- ``catalog``: the stream catalog as of that revision;
- ``installing``: present (true) only while a peer's snapshot replaces the topics.

It is written only after the data it covers is fsynced, so a restart replays the log from it
and reassigns identical indexes (topics skip the frames they already hold). Every method of
:class:`Checkpoints` runs on the node's writer thread, which owns its counters; the
revisions it shares with the loop are in :class:`~messaging.log.etcd.progress.Progress`.
"""

from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from messaging.broker.broker import Broker
from messaging.broker.snapshot import FORMAT
from messaging.errors import DataDirectoryError
from messaging.files import read_json, write_json_atomic
from messaging.log.etcd.progress import Progress
from messaging.log.local import DeferredSync

log = logging.getLogger(__name__)

CHECKPOINT = "cluster.json"
CHECKPOINT_REVISIONS = 100
CHECKPOINT_INTERVAL = 1.0
#: A checkpoint that only records log-free revisions (nothing applied) waits this long.
IDLE_CHECKPOINT_INTERVAL = 10.0


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a node resumes the log: after ``revision``, at broker index ``index`` and the
    broker time ``time_ms``."""

    revision: int
    index: int
    time_ms: int


class Checkpoints:
    """``cluster.json`` of one node: read at start, written after enough revisions or time
    are durable, around a snapshot install, and at close. Writer thread only."""

    def __init__(self, broker: Broker, cluster: str, progress: Progress,
                 unsynced: DeferredSync) -> None:
        self.broker = broker
        self.cluster = cluster
        self.path: Path = broker.path / CHECKPOINT
        self._progress = progress
        self._unsynced = unsynced
        self._index = 0  # the broker index after the last applied revision
        self._since = 0  # revisions applied since the last checkpoint
        self._at = 0.0  # when the last checkpoint was written (time.monotonic)

    def load(self) -> Checkpoint:
        """Read the checkpoint and restore the broker's index, time and catalog and the
        node's progress from it; refuses a foreign data directory. A directory without one
        becomes the cluster's (it must hold no topics); one a snapshot install was
        interrupted in is emptied, to catch up again."""
        checkpoint = self._read()
        self._progress.reset(checkpoint.revision)
        self._index = self.broker.index = checkpoint.index
        # The broker's time as of that revision: replaying from it gives every command the
        # same append time as on every other node (0 in a checkpoint from before times).
        self.broker.time = checkpoint.time_ms
        self._at = time.monotonic()
        return checkpoint

    def _read(self) -> Checkpoint:
        path = self.path
        if not path.exists():
            if self.broker.topics():
                raise DataDirectoryError(
                    f"{self.broker.path} holds topics but no {CHECKPOINT}: it was not written "
                    f"by a node of cluster {self.cluster!r}. Start this node with an empty data "
                    "directory; it catches up from etcd or from a peer's snapshot")
            # From now on this directory belongs to the cluster: a crash before the first
            # periodic checkpoint replays from the start.
            self.write(0, 0, time_ms=0)
            return Checkpoint(0, 0, 0)
        try:
            saved: dict[str, Any] = read_json(path)
        except (OSError, ValueError) as err:
            raise DataDirectoryError(f"{path} is unreadable: {err}") from err
        if saved.get("cluster") != self.cluster:
            raise DataDirectoryError(f"{path} belongs to cluster {saved.get('cluster')!r}, "
                                     f"not {self.cluster!r}")
        if saved.get("installing"):
            # A snapshot install was interrupted: the topics may be half old, half new.
            log.warning("an interrupted snapshot install left %s; discarding local topics and "
                        "catching up again", self.broker.path)
            empty = {"format": FORMAT, "index": 0, "subscribers": {}, "topics": []}
            self.broker.install_snapshot(io.BytesIO(json.dumps(empty).encode() + b"\n"))
            saved = {"revision": 0, "index": 0}
            self.write(0, 0, time_ms=0)
        self.broker.catalog.restore(saved.get("catalog"))
        return Checkpoint(int(saved["revision"]), int(saved["index"]),
                          int(saved.get("time", 0)))

    def applied(self, revisions: int, index: int) -> None:
        """``revisions`` more revisions were applied, leaving the broker at ``index``."""
        self._index = index
        self._since += revisions

    def may_be_due(self) -> bool:
        """Whether anything was applied or covered since the last checkpoint, so that
        :meth:`if_due` may find one due (any thread: reads only the progress)."""
        view = self._progress.view()
        return view.covered > view.checkpointed

    def if_due(self) -> None:
        """Checkpoint after enough revisions or time, or after a while idle."""
        age = time.monotonic() - self._at
        view = self._progress.view()
        if view.applied > view.checkpointed:
            due = self._since >= CHECKPOINT_REVISIONS or age >= CHECKPOINT_INTERVAL
        else:
            due = view.idle_covered > view.checkpointed and age >= IDLE_CHECKPOINT_INTERVAL
        if due:
            self.checkpoint()

    def final(self) -> None:
        """fsync what is deferred and checkpoint it, due or not (at close)."""
        self._unsynced.flush()
        self.checkpoint(force=True)

    def checkpoint(self, *, force: bool = False) -> None:
        """Write cluster.json for what is durable here (after fsyncing what is deferred);
        nothing while an fsync has failed: what it covered is not known to be durable."""
        view = self._progress.view()
        revision = view.covered
        if revision <= view.checkpointed and not force:
            return
        self._unsynced.flush()  # what the checkpoint covers must be durable first: frames,
        self.broker.sync_state()  # and the state changes (positions) recorded beside them
        if any(topic.failure is not None for topic in self.broker.topics()):
            return
        self.write(revision, self._index)
        self._progress.checkpointed_through(revision)
        self._since = 0
        self._at = time.monotonic()

    def mark_installing(self) -> None:
        """A snapshot install is about to replace the topics: a crash from here on leaves a
        checkpoint that says so, and the next start discards the topics."""
        self.write(self._progress.checkpointed, self._index, installing=True)

    def unmark_installing(self) -> None:
        """The install failed with local data untouched: keep its checkpoint, unmarked."""
        if self.path.exists():
            self.write(self._progress.checkpointed, self._index)

    def installed(self, revision: int) -> None:
        """A snapshot through ``revision`` was installed: checkpoint it at the broker's index
        and restart the progress from it."""
        self._index = self.broker.index
        self.write(revision, self._index)
        self._progress.reset(revision)
        self._since = 0
        self._at = time.monotonic()

    def write(self, revision: int, index: int, *, installing: bool = False,
              time_ms: int | None = None) -> None:
        """Write cluster.json as given (``time_ms``: the broker's time unless given)."""
        # The catalog as of this revision: replaying the log from here must decide every
        # stream command (a retried append, a fenced producer) exactly as the first time.
        state: dict[str, Any] = {"format": FORMAT, "cluster": self.cluster,
                                 "revision": revision, "index": index,
                                 "time": self.broker.time if time_ms is None else time_ms,
                                 "catalog": self.broker.catalog.saved()}
        if installing:
            state["installing"] = True
        write_json_atomic(self.path, state)
