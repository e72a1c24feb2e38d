"""Snapshots of a broker: write one, read one, install one.

A snapshot is one JSON header line (the broker's state: format, index, subscribers, and per
topic its tombstone, segments and last index) followed by every segment's committed bytes in
the order the header lists them. Installing one replaces every topic at once: the segments are
written to a staging directory, fsynced, and renamed over ``topics/``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from messaging.errors import CorruptDataError, DataDirectoryError, MessagingError
from messaging.files import fsync_dir, read_json, write_json_atomic
from messaging.frames import scan
from messaging.topic.topic import TOMBSTONE, Topic

if TYPE_CHECKING:
    from messaging.broker.broker import Broker

log = logging.getLogger(__name__)

#: Where a cluster node serves its snapshot, what it is sent as, and the header naming the
#: etcd revision it reflects.
SNAPSHOT_PATH = "/messaging/snapshot"
SNAPSHOT_CONTENT_TYPE = "application/x-messaging-snapshot"
REVISION_HEADER = "X-Messaging-Revision"
_SEGMENT_NAME = re.compile(r"\d{20}\.seg")


def describe(broker: Broker) -> tuple[dict[str, Any], list[tuple[Path, int]]]:
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
                segments.append({"name": segment.path.name, "size": segment.committed_size})
                files.append((segment.path, segment.committed_size))
        tomb = topic.path / TOMBSTONE
        tombstone = read_json(tomb)["first_index"] if tomb.exists() else 0
        topics.append({"id": topic.id, "tombstone": tombstone, "segments": segments,
                       "last_index": topic.committed_index})
    return {**broker.state(), "topics": topics}, files


def write(broker: Broker, stream: IO[bytes]) -> None:
    """Write a snapshot: one JSON header line, then every segment's committed bytes.

    Call from the writer thread (no apply may run meanwhile).
    """
    header, files = describe(broker)
    stream.write(json.dumps(header).encode() + b"\n")
    for path, size in files:
        with path.open("rb") as f:
            _copy(f, stream, size)


def install_verified(broker: Broker, stream: IO[bytes],
                     accept: Callable[[dict[str, Any]], None] | None = None,
                     ) -> dict[str, Any]:
    """Replace everything (topics, index, subscribers) with a snapshot; returns its header.

    Writer thread only. ``accept`` may refuse the header (raise) before anything is touched.
    Nothing local is merged in, and a failure (a damaged or short snapshot) leaves the broker
    as it was.
    """
    header = json.loads(stream.readline())
    if not isinstance(header, dict) or header.get("format") != broker.state()["format"]:
        raise DataDirectoryError(f"snapshot is not of format {broker.state()['format']}")
    if accept is not None:
        accept(header)
    install(broker, header, stream)
    return header


def install(broker: Broker, header: dict[str, Any], stream: IO[bytes]) -> None:
    """Replace every topic of ``broker`` with the snapshot's, atomically on disk.

    Every segment is verified (frame checksums, index order, its name) while it is staged in
    ``topics.restore``; only a whole verified snapshot is renamed over ``topics/``.
    """
    root = broker.path
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
                with (directory / name).open("wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            fsync_dir(directory)
        fsync_dir(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    broker.close_topics()
    old = root / "topics.old"
    shutil.rmtree(old, ignore_errors=True)
    (root / "topics").rename(old)
    staging.rename(root / "topics")
    fsync_dir(root)
    shutil.rmtree(old)
    opened = {}
    for described in header["topics"]:
        topic_id = int(described["id"])
        opened[topic_id] = Topic.open(root / "topics" / str(topic_id), topic_id,
                                      broker.max_segment_size)
    broker.install(opened, int(header["index"]), header.get("subscribers", {}),
                   header.get("catalog"))
    log.info("restored snapshot: %d topics, index %d", len(opened), broker.index)


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
    def capture(cls, broker: Broker, extra: dict[str, Any]) -> SnapshotStream:
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
