"""The snapshot format, in one place: describe and write one, read and stage one.

A snapshot is one JSON header line (the broker's state: format, index, time, subscribers,
catalog, and per topic its tombstone, segments and last index) followed by every segment's
committed bytes in the order the header lists them, each followed by its time index's
committed records when it has one (``times``: their size). Installing one replaces every
topic at once: the segments are verified and written to a staging directory
(:func:`stage`), fsynced, and renamed over ``topics/`` (:func:`swap`); the broker then opens
them (:meth:`messaging.broker.broker.Broker.install_snapshot`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol

from messaging.errors import CorruptDataError, DataDirectoryError, MessagingError
from messaging.files import fsync_dir, write_json_atomic
from messaging.frames import scan
from messaging.topic.times import RECORD, decode_records, times_path
from messaging.topic.topic import TOMBSTONE, Topic

log = logging.getLogger(__name__)

#: The format of ``broker.json``, of a cluster checkpoint and of a snapshot's header.
FORMAT = 1

#: Where a cluster node serves its snapshot, and what it is sent as.
SNAPSHOT_PATH = "/messaging/snapshot"
SNAPSHOT_CONTENT_TYPE = "application/x-messaging-snapshot"
_SEGMENT_NAME = re.compile(r"\d{20}\.seg")


class Snapshotted(Protocol):
    """What a snapshot is taken of: the broker's saved state and its topics."""

    def state(self) -> dict[str, Any]: ...
    def topics(self) -> list[Topic]: ...


def describe(broker: Snapshotted) -> tuple[dict[str, Any], list[tuple[Path, int]]]:
    """The header of a snapshot of ``broker``'s committed data, and the segment files (with
    the committed size of each) whose bytes follow it, in header order.

    Call from the writer thread (no apply may run meanwhile), so the cut is consistent.
    """
    topics: list[dict[str, Any]] = []
    files: list[tuple[Path, int]] = []
    for topic in broker.topics():
        segments = []
        for segment in topic.segments():
            if segment.committed_size:
                described: dict[str, Any] = {"name": segment.path.name,
                                             "size": segment.committed_size}
                files.append((segment.path, segment.committed_size))
                times = segment.times
                if times is not None:
                    times.ensure_loaded()
                if times is not None and times.committed and not times.damaged:
                    # (Unknown times go as none: the copy's times are unknown too.)
                    described["times"] = times.committed * RECORD.size
                    files.append((times.path, described["times"]))
                segments.append(described)
        topics.append({"id": topic.id, "tombstone": topic.tombstone, "segments": segments,
                       "last_index": topic.committed_index})
    return {**broker.state(), "topics": topics}, files


def write(broker: Snapshotted, stream: IO[bytes]) -> None:
    """Write a snapshot: one JSON header line, then every segment's committed bytes.

    Call from the writer thread (no apply may run meanwhile).
    """
    header, files = describe(broker)
    stream.write(json.dumps(header).encode() + b"\n")
    for path, size in files:
        with path.open("rb") as f:
            _copy(f, stream, size)


def read_header(stream: IO[bytes]) -> dict[str, Any]:
    """A snapshot's header line, checked to be of this broker's :data:`FORMAT`."""
    try:
        header = json.loads(stream.readline())
    except ValueError as err:
        raise DataDirectoryError(f"snapshot header is not JSON: {err}") from err
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise DataDirectoryError(f"snapshot is not of format {FORMAT}")
    return header


def stage(root: Path, header: dict[str, Any], stream: IO[bytes]) -> Path:
    """Write the snapshot's topics to ``root/topics.restore``, verified and fsynced.

    Every segment is verified (frame checksums, index order, its name) before it is written;
    on any failure the staging directory is removed and nothing else was touched.
    """
    staging = root / "topics.restore"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        for described in header["topics"]:
            directory = staging / str(int(described["id"]))
            directory.mkdir()
            if described["tombstone"]:
                write_json_atomic(directory / TOMBSTONE,
                                  {"first_index": int(described["tombstone"])})
            for segment in described["segments"]:
                name = str(segment["name"])
                data = _read_exactly(stream, int(segment["size"]))
                _verify_segment(int(described["id"]), name, data)
                _write_synced(directory / name, data)
                if "times" in segment:
                    records = _read_exactly(stream, int(segment["times"]))
                    _verify_times(int(described["id"]), name, records)
                    _write_synced(times_path(directory / name), records)
            fsync_dir(directory)
        fsync_dir(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def swap(root: Path, staging: Path) -> None:
    """Rename the staged topics over ``root/topics`` (every topic must be closed)."""
    old = root / "topics.old"
    shutil.rmtree(old, ignore_errors=True)
    (root / "topics").rename(old)
    staging.rename(root / "topics")
    fsync_dir(root)
    shutil.rmtree(old)


def _chunks(source: IO[bytes], size: int) -> Iterator[bytes]:
    """Exactly ``size`` bytes of ``source``, 1 MiB at a time; a short source is an error."""
    remaining = size
    while remaining:
        chunk = source.read(min(remaining, 1 << 20))
        if not chunk:
            raise DataDirectoryError(f"snapshot ended {remaining} bytes early")
        yield chunk
        remaining -= len(chunk)


def _read_exactly(source: IO[bytes], size: int) -> bytes:
    return b"".join(_chunks(source, size))


def _verify_segment(topic_id: int, name: str, data: bytes) -> None:
    """A snapshot's segment must be named for its first index and hold only valid frames."""
    if not _SEGMENT_NAME.fullmatch(name):
        raise CorruptDataError(f"snapshot: topic {topic_id} has a segment named {name!r}")
    first = int(name[:20])
    result = scan(data, after=first - 1, verify=True)
    if result.error is not None or result.incomplete or result.end != len(data):
        reason = result.error or f"incomplete frame at byte {result.end}"
        raise CorruptDataError(f"snapshot: topic {topic_id} segment {name}: {reason}")
    if result.count and result.first_index != first:
        raise CorruptDataError(f"snapshot: topic {topic_id} segment {name} starts at index "
                               f"{result.first_index}")


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _verify_times(topic_id: int, name: str, data: bytes) -> None:
    """A segment's time records must all be valid and start at its first index."""
    records, end = decode_records(data)
    if end != len(data) or not records or records[0][0] != int(name[:20]):
        raise CorruptDataError(f"snapshot: topic {topic_id} segment {name} has a damaged "
                               "time index")


def _copy(source: IO[bytes], target: IO[bytes], size: int) -> None:
    for chunk in _chunks(source, size):
        target.write(chunk)


class SnapshotStream:
    """A consistent snapshot being read: the header line, then each segment's bytes."""

    def __init__(self, header: dict[str, Any], files: list[tuple[BinaryIO, int]]) -> None:
        self.header = header
        self._pending: list[tuple[BinaryIO, int]] = files
        self._head = json.dumps(header).encode() + b"\n"

    @classmethod
    def capture(cls, broker: Snapshotted, extra: dict[str, Any]) -> SnapshotStream:
        """Describe and open the broker's committed data (writer thread only)."""
        header, paths = describe(broker)
        files: list[tuple[BinaryIO, int]] = []
        try:
            for path, size in paths:
                files.append((path.open("rb"), size))
        except BaseException:
            for f, _size in files:
                f.close()
            raise
        return cls({**header, **extra}, files)

    def read(self, max_bytes: int = 1 << 20) -> bytes:
        """The next bytes of the snapshot; b"" at the end (blocking: call it on a thread)."""
        if self._head:
            head, self._head = self._head, b""
            return head
        while self._pending:
            f, remaining = self._pending[0]
            chunk = f.read(min(max_bytes, remaining)) if remaining else b""
            if remaining and not chunk:
                raise MessagingError(f"{f.name} is shorter than its committed size")
            remaining -= len(chunk)
            if remaining:
                self._pending[0] = (f, remaining)
            else:
                f.close()
                self._pending.pop(0)
            if chunk:
                return chunk
        return b""

    def close(self) -> None:
        """Close the segment files not read to the end."""
        for f, _size in self._pending:
            f.close()
        self._pending = []
