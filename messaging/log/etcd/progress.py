"""How far one node of a cluster is through its command log: applied, covered, durable.

Three revisions of etcd, shared by the event loop and the node's writer thread, behind one
lock that is held for a few assignments, never across I/O:

- ``applied``: the last revision whose log entry this node has applied (set on the writer
  thread, by the apply and by a snapshot install);
- ``idle_covered``: through this revision etcd's log held no entry after ``applied``, as a
  quorum read saw it (set on the loop);
- ``checkpointed``: the revision through which this node's data is durable, as its
  checkpoint records it (set on the writer thread).

Any thread may read them; :meth:`Progress.view` reads all three at once.
"""

from __future__ import annotations

import threading
from typing import NamedTuple


class ProgressView(NamedTuple):
    """The three revisions of a :class:`Progress`, read together."""

    applied: int
    idle_covered: int
    checkpointed: int

    @property
    def covered(self) -> int:
        """The revision through which the log is applied, idle stretches included."""
        return max(self.applied, self.idle_covered)


class Progress:
    """The applied, idle-covered and checkpointed revisions of one node (thread-safe).

    The writer thread calls :meth:`applied_through`, :meth:`checkpointed_through` and
    :meth:`reset`; the loop calls :meth:`cover_idle`; any thread reads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._applied = 0
        self._idle_covered = 0
        self._checkpointed = 0

    def view(self) -> ProgressView:
        """All three revisions as of one moment."""
        with self._lock:
            return ProgressView(self._applied, self._idle_covered, self._checkpointed)

    @property
    def applied(self) -> int:
        """The last revision whose log entry this node applied."""
        with self._lock:
            return self._applied

    @property
    def covered(self) -> int:
        """The revision through which the log is applied here, idle stretches included."""
        with self._lock:
            return max(self._applied, self._idle_covered)

    @property
    def idle_covered(self) -> int:
        """Through here a quorum read saw no log entry after what was applied (0: none)."""
        with self._lock:
            return self._idle_covered

    @property
    def checkpointed(self) -> int:
        """The revision through which this node's data is durable."""
        with self._lock:
            return self._checkpointed

    def applied_through(self, revision: int) -> None:
        """Every log entry through ``revision`` is applied (writer thread)."""
        with self._lock:
            self._applied = revision

    def checkpointed_through(self, revision: int) -> None:
        """The checkpoint now covers ``revision`` (writer thread)."""
        with self._lock:
            self._checkpointed = revision

    def reset(self, revision: int) -> None:
        """Applied and durable through ``revision``, nothing idle covered beyond it: the
        state as a checkpoint at start or an installed snapshot leaves it (writer thread, or
        the loop before the writer thread has anything to do)."""
        with self._lock:
            self._applied = self._checkpointed = revision
            self._idle_covered = 0

    def cover_idle(self, log_revision: int, etcd_revision: int) -> None:
        """A quorum read saw etcd at ``etcd_revision`` and the log key last written at
        ``log_revision`` (the loop): when nothing in the log is newer than what is applied,
        everything through ``etcd_revision`` is covered."""
        with self._lock:
            if log_revision <= self._applied:
                self._idle_covered = max(self._idle_covered, etcd_revision)
