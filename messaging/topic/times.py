"""A segment's time index: when its messages were appended.

``<first index, 20 digits>.time`` sits beside the segment's ``.seg`` file and holds fixed-size
*time records*: (first index, append time in ms since the Unix epoch, CRC-32C of those 16
bytes). A record says that every message of the segment from its index up to the next
record's was appended at its time. The first record is at the segment's first index, so every
message of a segment that has the file has a time.

The index is sparse with a stated bound (:data:`TIME_RESOLUTION_MS`): the broker's clock for
appends only moves when a command's time is at least that far past it (see
:meth:`messaging.broker.broker.Broker.advance_time`), so a topic gets at most one record per
resolution step, and a message's append time is at most that much earlier than the time its
command was formed with. Records are rare, so writing one (and fsyncing it before the frames
it covers are written, :meth:`SegmentTimes.write`) costs an extra fsync once per step, not
once per publish: a frame on disk always has its record on disk, and a crash never leaves a
message with a time other than its own.

Segments written before times existed have no file: their messages' times are unknown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from crc32c import crc32c

from messaging.files import truncate_durably, write_all

log = logging.getLogger(__name__)

TIMES_SUFFIX = ".time"
#: A topic's append times move in steps of at least this many milliseconds.
TIME_RESOLUTION_MS = 100
#: One record: first index (u64), time in ms (i64), CRC-32C of the 16 bytes before it.
RECORD = struct.Struct(">QqI")
_BODY = struct.Struct(">Qq")
_ZERO_RECORD = bytes(RECORD.size)


def encode_record(index: int, time_ms: int) -> bytes:
    """One time record."""
    body = _BODY.pack(index, time_ms)
    return body + crc32c(body).to_bytes(4, "big")


def decode_records(data: bytes | memoryview) -> tuple[list[tuple[int, int]], int]:
    """The valid records at the start of ``data`` (index, time) and the bytes they take.

    Stops at the first record that is incomplete, fails its checksum, or does not follow the
    one before it (index not above it, time below it): a torn or damaged tail.
    """
    records: list[tuple[int, int]] = []
    offset = 0
    size = RECORD.size
    while offset + size <= len(data):
        index, time_ms, crc = RECORD.unpack_from(data, offset)
        if crc32c(memoryview(data)[offset:offset + _BODY.size]) != crc:
            break
        if records and (index <= records[-1][0] or time_ms < records[-1][1]):
            break
        records.append((index, time_ms))
        offset += size
    return records, offset


def times_path(segment_path: Path) -> Path:
    """The time index file of a segment file."""
    return segment_path.with_suffix(TIMES_SUFFIX)


class TimeSyncError(OSError):
    """fdatasync of a time file failed: what it covered is not known to be on disk."""


class SegmentTimes:
    """The time records of one segment, in memory, and their file.

    One writer thread adds, writes, commits and rolls back; readers look only at the first
    :attr:`committed` records (arrays only grow past them while readers look).
    """

    def __init__(self, path: Path, *, on_disk: bool = False) -> None:
        self.path = path
        self.indexes: array[int] = array("q")
        self.times: array[int] = array("q")
        self.committed = 0  # records readers may use
        self.durable = 0  # records written and fsynced
        self._touched = False  # a write since the last commit (it may have left bytes)
        self.exists = on_disk  # the file has been created
        self.loaded = not on_disk  # a file on disk is read on first use
        #: The file is damaged where frames it should time exist: the segment's times are
        #: unknown (never guessed from the records before the damage).
        self.damaged = False
        self._load_lock = threading.Lock()

    # -- loading ----------------------------------------------------------------------------

    def ensure_loaded(self) -> None:
        """Read the file of a segment recovery did not read (any thread)."""
        if self.loaded:
            return
        try:
            with self.path.open("rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        records, end = decode_records(data)
        with self._load_lock:
            if self.loaded:
                return
            if end != len(data):  # a closed segment's records are whole: damage
                self._damage(end)
                records = []
            self._install(records)
            self.loaded = True

    def recover(self, last_index: int) -> int:
        """Read the file of the last segment at start-up and cut it back to the frames that
        survived: a torn or damaged record, and records of frames a crash took (index above
        ``last_index``), are removed from the file. Returns the bytes removed."""
        with self.path.open("rb") as f:
            data = f.read()
        records, end = decode_records(data)
        rest = data[end:]
        if any(_BODY.unpack_from(rest, at)[0] <= last_index
               and rest[at:at + RECORD.size] != _ZERO_RECORD
               for at in range(0, len(rest) - RECORD.size + 1, RECORD.size)):
            # A whole record that does not check out, or one after it, for frames that exist:
            # not a torn write (records are fsynced before their frames are written) but
            # damage. All zeros is never a valid record (their CRC is not 0): what some file
            # systems show of a write a crash interrupted, so torn, and cut.
            self._damage(end)
            self._install([])
            self.loaded = True
            return 0
        keep = bisect_right([index for index, _ in records], last_index)
        del records[keep:]
        self._install(records)
        self.loaded = True
        cut = len(data) - keep * RECORD.size
        if cut:
            truncate_durably(self.path, keep * RECORD.size)
        return cut

    def _damage(self, at: int) -> None:
        self.damaged = True
        log.error("%s is damaged at byte %d: the append times of its segment's messages are "
                  "unknown", self.path, at)

    def _install(self, records: list[tuple[int, int]]) -> None:
        self.indexes = array("q", [index for index, _ in records])
        self.times = array("q", [time_ms for _, time_ms in records])
        self.committed = self.durable = len(records)

    # -- writing (the writer thread) --------------------------------------------------------

    @property
    def last_time(self) -> int | None:
        """The time of the newest record, staged ones included (None: no record)."""
        return self.times[-1] if self.times else None

    def add(self, index: int, time_ms: int) -> None:
        """Stage a record: messages from ``index`` on were appended at ``time_ms``."""
        self.indexes.append(index)
        self.times.append(time_ms)

    @property
    def staged(self) -> bool:
        """Whether records wait to be written."""
        return len(self.indexes) > self.durable

    def write(self) -> bool:
        """Append the staged records to the file and fdatasync it; returns whether the file
        was created (its directory entry then needs the directory's fsync).

        Called before the frames the records cover are written, so no frame reaches the disk
        before its time does. Raises OSError; :meth:`rollback` then cuts the file back.
        """
        data = b"".join(encode_record(self.indexes[k], self.times[k])
                        for k in range(self.durable, len(self.indexes)))
        created = not self.exists
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self.exists = self._touched = True
            write_all(fd, data)
            try:
                os.fdatasync(fd)
            except OSError as err:
                raise TimeSyncError(err.errno, f"{err.strerror or err} on "
                                    f"{self.path.name}") from err
        finally:
            os.close(fd)
        self.durable = len(self.indexes)
        return created

    def commit(self) -> None:
        """Readers may use every record written so far."""
        self.committed = self.durable = len(self.indexes)
        self._touched = False

    def rollback(self) -> None:
        """Forget the records since the last commit, in memory and in the file (OSError if
        the file cannot be cut back)."""
        touched, self._touched = self._touched, False
        del self.indexes[self.committed:]
        del self.times[self.committed:]
        self.durable = self.committed
        if touched and self.exists:  # a failed write may have left part of a record
            # Durably: a record that was fsynced must not come back after a power loss.
            truncate_durably(self.path, self.committed * RECORD.size)

    def remove_file(self) -> None:
        """Delete the file (its segment went away); a missing file is fine."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def cut_after(self, index: int) -> None:
        """Remove the records of messages above ``index`` (start-up, before any write)."""
        self.ensure_loaded()
        keep = bisect_right(self.indexes, index, 0, self.committed)
        if keep < self.committed:
            truncate_durably(self.path, keep * RECORD.size)
            del self.indexes[keep:]
            del self.times[keep:]
            self.committed = self.durable = keep

    # -- reading (any thread) ---------------------------------------------------------------

    def last_committed_time(self) -> int | None:
        """The time of the newest committed record (the newest message's time)."""
        self.ensure_loaded()
        n = self.committed
        return self.times[n - 1] if n else None

    def time_of(self, index: int) -> int | None:
        """The append time of the message with ``index`` (None: before the first record)."""
        self.ensure_loaded()
        j = bisect_right(self.indexes, index, 0, self.committed) - 1
        return self.times[j] if j >= 0 else None

    def first_index_at(self, time_ms: int) -> int | None:
        """The first index whose time is at or after ``time_ms`` (None: none is)."""
        self.ensure_loaded()
        j = bisect_left(self.times, time_ms, 0, self.committed)
        return self.indexes[j] if j < self.committed else None

    def runs(self, start: int, stop: int) -> list[tuple[int, int]]:
        """(first index, time) of the records that cover indexes ``start`` .. ``stop``; the
        first is moved up to ``start``."""
        self.ensure_loaded()
        n = self.committed
        j = max(bisect_right(self.indexes, start, 0, n) - 1, 0)
        k = bisect_right(self.indexes, stop, 0, n)
        return [(max(self.indexes[i], start), self.times[i]) for i in range(j, k)]

