"""The state journal: one line per group, its commit mark and what it changed besides frames.

Every group that needs one appends a line to ``catalog.log``: its sequence number, the broker
index it ends at, the frames it appends (``group``: its first broker index and, per topic, the
last index it stages there), and what it changed that is kept beside the topics — the catalog
(streams, forks, producer sequence numbers of streams and of native topics, whole) and
subscriber positions (heartbeats, consumer resets and deletes). ``broker.json`` holds a full
copy of the state, the broker index and the sequence number of the last line it includes;
opening applies the lines after it. When the journal grows past :data:`COMPACT_BYTES` the
broker folds it into ``broker.json`` (after a group committed, so ``broker.json`` never holds a
group whose frames may be missing) and empties it.

The line is the group's commit mark, written in one of two ways (the broker's
``lines_first``; ``broker.json`` records which, see :mod:`messaging.broker.recovery`):

- *after the frames* (a cluster node, ``--fsync interval|never``): a group's frames are
  written first, then its line, and both are made durable (side by side when the group wrote
  several topics) before the group is answered. So frames above the broker index of the last
  whole line belong to a group a crash interrupted — it was never acknowledged — and opening
  cuts them, in every topic and across segment boundaries;
- *lines first* (``--fsync always`` on one node): a group's line is made durable before its
  frames are written, and a group whose commands each hold a single message and change no
  state writes none — a message is whole or cut by its checksum, so it needs no mark, and it
  pays one fsync instead of two. Frames no line covers are such messages and stay.

Either way a publish batch is all or nothing, also after a crash. A line whose frames did not
all reach the disk (a power loss between the two fsyncs, a crash after a line written first,
or a failed write) is seen by :func:`incomplete` and undone with its frames (with
``--fsync always`` only the last line can be: each group is durable before the next starts;
without fsync a power loss may keep several such lines, and each goes, newest first).
Idempotent producers need the same: a line never records a sequence number whose frames are
not all there, and frames no line records are cut (or, lines first, were never recorded by
a producer), so a retried publish is stored once.

A line is part of the state only once its group succeeded: a failed write or fsync, or a
failure of the group's frames, cuts the file back to where it was (a failed fsync also stops
further journal writes until a restart, as a failed fsync of a topic does). A torn last line
— a crash mid-append — belongs to a group that was never acknowledged, and is ignored.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from messaging.errors import StorageFailedError
from messaging.files import truncate_durably

log = logging.getLogger(__name__)

NAME = "catalog.log"
#: The journal is folded into broker.json past this size.
COMPACT_BYTES = 4 << 20


class CatalogLog:
    """``catalog.log`` of one data directory (used by the broker's writer thread only)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / NAME
        self.seq = 0  # the sequence number of the last line written (or folded in)
        self.size = 0
        self._before_last = 0  # the size before the last line appended (what undo cuts to)
        self._new_file = False  # created by an append not yet flushed: the directory needs it
        self._starts: list[int] = []  # where each line read() returned starts
        self._failed: StorageFailedError | None = None
        self._fd: int | None = None  # lines are appended through it (writer thread)

    def read(self, after: int) -> list[dict[str, Any]]:
        """The lines after sequence number ``after``, in order (each a dict with ``changes``,
        and ``positions`` and ``group`` when the group had them)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        entries = []
        self._starts = []
        good = 0
        self.seq = after
        lines = data.split(b"\n")
        for number, line in enumerate(lines):
            if not line:
                continue
            try:
                if number == len(lines) - 1:  # no newline: its write never finished
                    raise ValueError("unterminated line")
                entry = json.loads(line)
                seq = int(entry["seq"])
            except (ValueError, KeyError, TypeError):
                log.warning("%s: ignoring a torn line at byte %d (a group a crash interrupted; "
                            "it was never acknowledged)", self.path, good)
                break
            self._before_last = good
            good += len(line) + 1
            if seq > after:
                entries.append(entry)
                self._starts.append(self._before_last)
                self.seq = seq
        if good < len(data):
            os.truncate(self.path, good)
        self.size = good
        return entries

    def drop_last(self) -> None:
        """Take back the last line :meth:`read` returned and not yet dropped (its group's
        frames are missing)."""
        self._before_last = self._starts.pop()
        self._truncate(self._before_last)
        self.seq -= 1

    def append(self, entry: dict[str, Any], *, durable: bool) -> None:
        """Append one group's line (fsynced when ``durable``); undone on any failure."""
        if self._failed is not None:
            raise self._failed
        line = json.dumps({"seq": self.seq + 1, **entry},
                          separators=(",", ":")).encode() + b"\n"
        created = self._fd is None and not self.path.exists()
        fd = self._open()
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(28, "short write")
        except OSError:
            self._cut(fd, self.size)
            raise
        if durable:
            try:
                # The line and the file's size are what a restart needs: fdatasync
                # (an fsync would also wait for the inode's times to be journaled).
                os.fdatasync(fd)
                if created:
                    _fsync_dir(self.path.parent)
            except OSError as err:
                self._cut(fd, self.size)
                raise self._stop(f"state changes could not be made durable "
                                 f"({err.strerror or err})") from err
        self._new_file |= created and not durable
        self.seq += 1
        self._before_last = self.size
        self.size += len(line)

    def flush(self) -> None:
        """Make the lines appended without fsync durable (fdatasync, and the directory when
        the file is new): the group's frames are fsynced beside it. A failure stops the
        journal (:class:`StorageFailedError`); the caller then undoes the group."""
        if self._failed is not None:
            raise self._failed
        if self._fd is None:
            return  # no line written since it was opened
        try:
            os.fdatasync(self._fd)
            if self._new_file:
                _fsync_dir(self.path.parent)
                self._new_file = False
        except OSError as err:
            raise self._stop(f"state changes could not be made durable "
                             f"({err.strerror or err})") from err

    def close(self) -> None:
        """Close the journal's descriptor (the broker is closing; a later append reopens)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _open(self) -> int:
        """The descriptor lines are appended through, opened on the first append."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                               0o644)
        return self._fd

    def undo(self, *, durable: bool) -> None:
        """Take back the line just appended: the rest of its group failed.

        If that fails, no line is written until a restart, which drops the line anyway: its
        group's frames were rolled back, so the line reads as interrupted.
        """
        self.seq -= 1
        self.size = self._before_last
        try:
            fd = self._open()
        except OSError as err:
            self._stop(f"could not undo a failed state write ({err.strerror or err})")
            return
        try:
            self._cut(fd, self.size)
            if durable and self._failed is None:
                os.fsync(fd)
        except OSError as err:
            self._stop(f"could not make the undo of a failed group durable "
                       f"({err.strerror or err})")

    def _cut(self, fd: int, size: int) -> None:
        """Cut the file back to ``size`` bytes (a line that must not count)."""
        try:
            os.ftruncate(fd, size)
        except OSError as err:
            self._stop(f"could not undo a failed state write ({err.strerror or err})")

    def _truncate(self, size: int) -> None:
        truncate_durably(self.path, size)
        self.size = size

    def _stop(self, reason: str) -> StorageFailedError:
        """Refuse every further line until a restart re-reads the journal."""
        self._failed = StorageFailedError(
            f"{reason}; the broker takes no writes until a restart")
        log.error("%s", self._failed)
        return self._failed

    def sync(self) -> None:
        """fsync the journal (its lines written without, under ``--fsync interval|never``
        and in a cluster, become durable: a checkpoint that covers them needs them)."""
        if self._failed is not None:
            raise self._failed
        if self._fd is None and not self.path.exists():
            return
        try:
            os.fsync(self._open())
        except OSError as err:
            raise self._stop(f"state changes could not be made durable "
                             f"({err.strerror or err})") from err
        _fsync_dir(self.path.parent)

    @property
    def due(self) -> bool:
        """Whether the journal should be folded into broker.json."""
        return self.size >= COMPACT_BYTES

    def folded(self) -> None:
        """broker.json now holds everything through :attr:`seq`: empty the journal."""
        if self.size:
            os.truncate(self.path, 0)
            self.size = 0
            self._before_last = 0
        self._new_file = False


def incomplete(entry: dict[str, Any], last_index: Callable[[int], int]) -> bool:
    """Whether a line's group is missing frames: some topic it wrote to ends below the last
    index the group staged there (``last_index``: a topic's last index on disk, 0 if none)."""
    group = entry.get("group")
    if not group:
        return False
    return any(last_index(int(topic)) < last for topic, last in group["last"].items())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
