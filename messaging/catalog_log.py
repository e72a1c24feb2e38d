"""The catalog's journal: each group's catalog changes, appended and fsynced with the group.

Rewriting every stream's metadata on every append would cost a write proportional to the
number of streams; instead each group that changes the catalog appends one line (its
sequence number and the streams and producer tables it changed, whole) to ``catalog.log``.
``broker.json`` holds a full copy of the catalog and the sequence number of the last line it
includes; opening applies the lines after it. When the journal grows past
:data:`COMPACT_BYTES` the broker saves the whole catalog into ``broker.json`` and empties
the journal.

A line is part of the state only once its group succeeded: a failed write or fsync cuts the
file back to where it was (a failed fsync also stops further catalog writes until a restart,
as a failed fsync of a topic does). A torn last line — a crash mid-append — belongs to a group
that was never acknowledged, and is ignored.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from messaging.errors import StorageFailedError

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
        self._failed: StorageFailedError | None = None

    def read(self, after: int) -> list[dict[str, Any]]:
        """The changes of the lines after sequence number ``after``, in order."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        changes = []
        good = 0
        self.seq = after
        for line in data.split(b"\n"):
            if not line:
                continue
            try:
                entry = json.loads(line)
                seq = int(entry["seq"])
            except (ValueError, KeyError, TypeError):
                log.warning("%s: ignoring a torn line at byte %d (a group a crash interrupted; "
                            "it was never acknowledged)", self.path, good)
                break
            good += len(line) + 1
            if seq > after:
                changes.append(entry["changes"])
                self.seq = seq
        if good < len(data):
            os.truncate(self.path, good)
        self.size = good
        return changes

    def append(self, changes: dict[str, Any], *, durable: bool) -> None:
        """Append one group's changes (fsynced when ``durable``); undone on any failure."""
        if self._failed is not None:
            raise self._failed
        line = json.dumps({"seq": self.seq + 1, "changes": changes},
                          separators=(",", ":")).encode() + b"\n"
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            try:
                written = os.write(fd, line)
                if written != len(line):
                    raise OSError(28, "short write")
            except OSError:
                self._cut(fd)
                raise
            if durable:
                try:
                    os.fsync(fd)
                    if created:
                        _fsync_dir(self.path.parent)
                except OSError as err:
                    self._cut(fd)
                    self._failed = StorageFailedError(
                        f"catalog changes could not be made durable ({err.strerror or err}); "
                        "streams stop taking writes until a restart")
                    log.error("%s", self._failed)
                    raise self._failed from err
        finally:
            os.close(fd)
        self.seq += 1
        self.size += len(line)

    def _cut(self, fd: int) -> None:
        """Take back a line that did not make it whole."""
        try:
            os.ftruncate(fd, self.size)
        except OSError as err:
            self._failed = StorageFailedError(
                f"could not undo a failed catalog write ({err.strerror or err}); streams stop "
                "taking writes until a restart")
            log.error("%s", self._failed)

    @property
    def due(self) -> bool:
        """Whether the journal should be folded into broker.json."""
        return self.size >= COMPACT_BYTES

    def folded(self) -> None:
        """broker.json now holds everything through :attr:`seq`: empty the journal."""
        if self.size:
            os.truncate(self.path, 0)
            self.size = 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
