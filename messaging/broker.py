"""The Broker: the state machine every log (local or Raft) drives.

``apply(command)`` takes a command (a buffer of frames, index 0), assigns each message the
next broker index (``previous + 1`` across all topics, from 1), and appends runs of frames to
their topics. Assignment is a pure function of the applied command sequence, and topics skip
indexes not above their own, so replaying commands after a restart is idempotent.

Broker-internal frames (type bit 0x8000) take no index and are never stored in a topic: they
record subscriber progress (:data:`SET_TOPIC_MAX_INDEX`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from messaging.errors import CorruptFrameError, DataDirectoryError, MessagingError
from messaging.files import fsync_dir, read_json, write_json_atomic
from messaging.message import HEADER, HEADER_SIZE, INTERNAL_TYPE, encode, stamp_index
from messaging.metrics import BrokerMetrics
from messaging.notify import Waiters, wake
from messaging.topic import DEFAULT_MAX_SEGMENT_SIZE, TOMBSTONE, Topic

log = logging.getLogger(__name__)

FORMAT = 1
#: Internal command: data = u64 index + subscriber URL (UTF-8); the frame's topic field names
#: the topic.
SET_TOPIC_MAX_INDEX = INTERNAL_TYPE | 1
_U64 = struct.Struct(">Q")

DEFAULT_MAX_TOPIC_SIZE = 1 << 30
DEFAULT_SUBSCRIBER_TIMEOUT = 600.0


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What one applied command did: its index range and the topics it touched."""

    first: int
    last: int
    topics: frozenset[int]

    @property
    def count(self) -> int:
        """How many messages the command held."""
        return self.last - self.first + 1 if self.last else 0


@dataclass(slots=True)
class Subscriber:
    """A subscriber's heartbeated progress in one topic."""

    index: int
    seen: float = field(default_factory=time.monotonic)


def heartbeat_command(topic: int, index: int, url: str) -> bytes:
    """The internal frame that records a subscriber's progress."""
    return encode(SET_TOPIC_MAX_INDEX, topic, _U64.pack(index) + url.encode())


class Broker:
    """Topics in ``DATA/topics``, the broker index, and subscriber progress.

    Writes (apply, sync, commit, snapshot restore) come from one writer thread at a time;
    reads may come from any thread.
    """

    def __init__(self, path: Path, *, max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE,
                 max_topic_size: int = DEFAULT_MAX_TOPIC_SIZE,
                 subscriber_timeout: float = DEFAULT_SUBSCRIBER_TIMEOUT,
                 metrics: BrokerMetrics | None = None) -> None:
        self.path = path
        self.max_segment_size = max_segment_size
        self.max_topic_size = max_topic_size
        self.subscriber_timeout = subscriber_timeout
        self.metrics = metrics or BrokerMetrics()
        self.metrics.watch_subscribers(self._subscriber_rows)
        self.index = 0
        self._topics: dict[int, Topic] = {}
        self._subscribers: dict[int, dict[str, Subscriber]] = {}
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self._topic_waiters = Waiters()

    # -- opening and closing ----------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str, **options: Any) -> Broker:
        """Open (creating if needed) the data directory and recover every topic."""
        broker = cls(Path(path), **options)
        broker._open()
        return broker

    def _open(self) -> None:
        try:
            (self.path / "topics").mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise DataDirectoryError(f"cannot use data directory {self.path}: "
                                     f"{err.strerror}") from err
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise DataDirectoryError(f"data directory {self.path} is in use by another "
                                     "broker") from err
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
        for entry in sorted((self.path / "topics").iterdir()):
            if entry.is_dir() and entry.name.isdigit():
                topic = Topic.open(entry, int(entry.name), self.max_segment_size)
                self._topics[topic.id] = topic
                self.metrics.recovered_truncated_bytes.inc(topic.stats.recovered_truncated_bytes)
        self.index = max([int(state.get("index", 0))]
                         + [t.last_index for t in self._topics.values()])
        self._restore_subscribers(state.get("subscribers", {}))
        self.save_state()
        log.info("opened %s: %d topics, index %d", self.path, len(self._topics), self.index)

    def _restore_subscribers(self, saved: dict[str, dict[str, int]]) -> None:
        # A restart gives every subscriber a fresh timeout: it may be reconnecting right now.
        self._subscribers = {
            int(topic): {url: Subscriber(int(index)) for url, index in urls.items()}
            for topic, urls in saved.items()
        }

    def state(self) -> dict[str, Any]:
        """The broker's own metadata as saved in ``broker.json``."""
        with self._lock:
            return {
                "format": FORMAT,
                "index": self.index,
                "subscribers": {str(t): {u: s.index for u, s in subs.items()}
                                for t, subs in self._subscribers.items()},
            }

    def save_state(self) -> None:
        """Write ``broker.json`` atomically."""
        write_json_atomic(self.path / "broker.json", self.state())

    def close(self) -> None:
        """Sync and close every topic, save the state and release the directory lock."""
        for topic in self.topics():
            topic.close()
        if self._lock_fd is not None:
            self.save_state()
            os.close(self._lock_fd)
            self._lock_fd = None
        self._wake_topic_waiters()

    # -- the state machine ------------------------------------------------------------------

    def apply(self, command: bytes | bytearray) -> ApplyResult:
        """Apply one command: stamp indexes, append to topics, record internal state.

        The command must hold complete, verified frames (the publish path checked them).
        """
        result = self.apply_group([command])[0]
        if isinstance(result, MessagingError):
            raise result
        return result

    def apply_group(self, commands: Sequence[bytes | bytearray],
                    ) -> list[ApplyResult | MessagingError]:
        """Apply commands in order, appending to each topic once for the whole group.

        A malformed command is skipped whole (its result is the error); the others apply.
        """
        runs: dict[int, list[memoryview]] = {}
        results: list[ApplyResult | MessagingError] = []
        for command in commands:
            before = self.index
            try:
                first, command_runs = self._stamp(command)
            except MessagingError as err:
                self.index = before
                results.append(err)
                continue
            topics = []
            for topic_id, run in command_runs:
                runs.setdefault(topic_id, []).append(run)
                topics.append(topic_id)
            results.append(ApplyResult(first, self.index if first else 0, frozenset(topics)))
        messages = size = 0
        for topic_id, parts in runs.items():
            frames: bytes | memoryview = parts[0] if len(parts) == 1 else b"".join(parts)
            messages += self._topic_for_write(topic_id).append(frames)
            size += len(frames)
        if messages:
            self.metrics.messages_published.inc(messages)
            self.metrics.bytes_published.inc(size)
        return results

    def _stamp(self, command: bytes | bytearray) -> tuple[int, list[tuple[int, memoryview]]]:
        """Assign indexes to a command's messages; returns its first index and topic runs."""
        view = memoryview(bytearray(command))
        size = len(view)
        runs: list[tuple[int, memoryview]] = []
        first = 0
        offset = run_start = 0
        run_topic = -1
        while offset < size:
            if size - offset < HEADER_SIZE:
                raise CorruptFrameError(f"command has an incomplete frame at byte {offset}")
            _index, _crc, type_, topic_id, length = HEADER.unpack_from(view, offset)
            end = offset + HEADER_SIZE + length
            if end > size:
                raise CorruptFrameError(f"command has an incomplete frame at byte {offset}")
            if type_ & INTERNAL_TYPE or topic_id != run_topic:
                if run_topic >= 0 and offset > run_start:
                    runs.append((run_topic, view[run_start:offset]))
                run_start, run_topic = offset, topic_id
            if type_ & INTERNAL_TYPE:
                self._apply_internal(type_, topic_id, bytes(view[offset + HEADER_SIZE:end]))
                run_start, run_topic = end, -1
            else:
                self.index += 1
                first = first or self.index
                stamp_index(view, offset, self.index)
            offset = end
        if run_topic >= 0 and offset > run_start:
            runs.append((run_topic, view[run_start:offset]))
        return first, runs

    def _apply_internal(self, type_: int, topic_id: int, data: bytes) -> None:
        if type_ != SET_TOPIC_MAX_INDEX:
            log.warning("ignoring unknown internal command type %#x", type_)
            return
        index = _U64.unpack_from(data)[0]
        self.set_topic_max_index(topic_id, index, data[_U64.size:].decode())

    def set_topic_max_index(self, topic_id: int, index: int, url: str) -> None:
        """Record that subscriber ``url`` has processed ``topic_id`` through ``index``."""
        with self._lock:
            subs = self._subscribers.setdefault(topic_id, {})
            current = subs.get(url)
            if current is None or index >= current.index:
                subs[url] = Subscriber(index)
            else:
                current.seen = time.monotonic()

    def _topic_for_write(self, topic_id: int) -> Topic:
        topic = self._topics.get(topic_id)
        if topic is None:
            topic = Topic.open(self.path / "topics" / str(topic_id), topic_id,
                               self.max_segment_size)
            fsync_dir(self.path / "topics")
            with self._lock:
                self._topics[topic_id] = topic
            self._wake_topic_waiters()
        return topic

    def sync(self, topic_ids: Iterable[int]) -> None:
        """fsync the given topics."""
        for topic_id in topic_ids:
            self._topics[topic_id].sync()
        self.metrics.fsyncs.inc()

    def commit(self, topic_ids: Iterable[int]) -> None:
        """Make what was applied to the given topics visible to readers."""
        for topic_id in topic_ids:
            self._topics[topic_id].commit()

    # -- reading ----------------------------------------------------------------------------

    def topic(self, topic_id: int) -> Topic | None:
        """The topic, or None if nothing was ever published to it."""
        with self._lock:
            return self._topics.get(topic_id)

    def topics(self) -> list[Topic]:
        """Every topic, by id."""
        with self._lock:
            return [self._topics[i] for i in sorted(self._topics)]

    async def wait_for_topic(self, topic_id: int) -> Topic | None:
        """The topic, waiting for its first message if needed; None if the broker closed."""
        def ready() -> bool:
            return topic_id in self._topics or self._lock_fd is None

        while not ready():
            await self._topic_waiters.wait_unless(self._lock, ready)
        return self.topic(topic_id)

    def _wake_topic_waiters(self) -> None:
        with self._lock:
            waiting = self._topic_waiters.take()
        wake(waiting)

    def subscribers(self, topic_id: int) -> dict[str, int]:
        """Subscriber URL → heartbeated index for one topic."""
        with self._lock:
            return {url: s.index for url, s in self._subscribers.get(topic_id, {}).items()}

    def topic_info(self, topic: Topic) -> dict[str, Any]:
        """The JSON description of a topic used by the HTTP API."""
        return {
            "id": topic.id,
            "first_index": topic.first_index,
            "last_index": topic.committed_index,
            "size": topic.size,
            "segments": topic.segment_count,
            "subscribers": self.subscribers(topic.id),
        }

    def diagnostics(self) -> dict[str, Any]:
        """Broker index, topics and counters (the log adds role, leader and peers)."""
        topics = []
        for topic in self.topics():
            info = self.topic_info(topic)
            info["stats"] = vars(topic.stats).copy()
            topics.append(info)
        return {"index": self.index, "path": str(self.path), "topics": topics}

    def _subscriber_rows(self) -> list[tuple[int, str, int, int]]:
        rows = []
        for topic in self.topics():
            last = topic.committed_index
            for url, index in self.subscribers(topic.id).items():
                rows.append((topic.id, url, index, max(last - index, 0)))
        return rows

    # -- retention --------------------------------------------------------------------------

    def retention_floor(self, topic_id: int, now: float | None = None) -> int:
        """The highest index retention may delete through for ``topic_id``.

        The smallest index a live subscriber heartbeated; unlimited with no live subscriber.
        """
        now = time.monotonic() if now is None else now
        with self._lock:
            live = [s.index for s in self._subscribers.get(topic_id, {}).values()
                    if now - s.seen <= self.subscriber_timeout]
        return min(live) if live else 2**64 - 1

    def enforce_retention(self, now: float | None = None) -> int:
        """Delete old segments of every topic over ``max_topic_size``; returns bytes deleted."""
        deleted = 0
        for topic in self.topics():
            if topic.size <= self.max_topic_size:
                continue
            before = topic.stats.deleted_segments
            freed = topic.truncate(self.max_topic_size, self.retention_floor(topic.id, now))
            deleted += freed
            self.metrics.retention_deleted_bytes.inc(freed)
            self.metrics.retention_deleted_segments.inc(topic.stats.deleted_segments - before)
        if deleted:
            self.save_state()
        return deleted

    # -- snapshots --------------------------------------------------------------------------

    def write_snapshot(self, stream: IO[bytes]) -> None:
        """Write a snapshot: one JSON header line, then every segment's committed bytes.

        Call from the writer thread (no apply may run meanwhile).
        """
        topics: list[dict[str, Any]] = []
        for topic in self.topics():
            segments = [{"name": s.path.name, "size": s.committed_size}
                        for s in topic.segments() if s.committed_size]
            tomb = topic.path / TOMBSTONE
            tombstone = read_json(tomb)["first_index"] if tomb.exists() else 0
            topics.append({"id": topic.id, "tombstone": tombstone, "segments": segments,
                           "last_index": topic.committed_index})
        header = {**self.state(), "topics": topics}
        stream.write(json.dumps(header).encode() + b"\n")
        for topic, described in zip(self.topics(), topics, strict=True):
            for segment in described["segments"]:
                with (topic.path / segment["name"]).open("rb") as f:
                    _copy(f, stream, segment["size"])

    def read_snapshot(self, stream: IO[bytes]) -> bool:
        """Take the state of a snapshot (writer thread only); returns whether data was copied.

        When every topic here already holds at least what the snapshot holds (a restart
        replaying its own log), only the broker index and subscribers are reset and the
        segment bytes are skipped: replay then reassigns the same indexes and skips stale
        frames. Otherwise every topic is replaced by the snapshot's.
        """
        header = json.loads(stream.readline())
        if header.get("format") != FORMAT:
            raise DataDirectoryError(f"snapshot has format {header.get('format')!r}")
        if all((t := self.topic(int(d["id"]))) is not None and t.last_index >= d["last_index"]
               for d in header["topics"]):
            with self._lock:
                self.index = int(header["index"])
            self._restore_subscribers(header.get("subscribers", {}))
            log.info("snapshot at index %d is already held locally; replaying from there",
                     self.index)
            return False
        self._replace_topics(header, stream)
        return True

    def _replace_topics(self, header: dict[str, Any], stream: IO[bytes]) -> None:
        for topic in self.topics():
            topic.close()
        with self._lock:
            self._topics = {}
        staging = self.path / "topics.restore"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for described in header["topics"]:
            directory = staging / str(described["id"])
            directory.mkdir()
            if described["tombstone"]:
                write_json_atomic(directory / TOMBSTONE, {"first_index": described["tombstone"]})
            for segment in described["segments"]:
                with (directory / segment["name"]).open("wb") as f:
                    _copy(stream, f, segment["size"])
                    f.flush()
                    os.fsync(f.fileno())
        fsync_dir(staging)
        old = self.path / "topics.old"
        shutil.rmtree(old, ignore_errors=True)
        (self.path / "topics").rename(old)
        staging.rename(self.path / "topics")
        fsync_dir(self.path)
        shutil.rmtree(old)
        opened = {}
        for described in header["topics"]:
            topic_id = int(described["id"])
            opened[topic_id] = Topic.open(self.path / "topics" / str(topic_id), topic_id,
                                          self.max_segment_size)
        with self._lock:
            self._topics = opened
            self.index = int(header["index"])
        self._restore_subscribers(header.get("subscribers", {}))
        self.save_state()
        self._wake_topic_waiters()
        log.info("restored snapshot: %d topics, index %d", len(opened), self.index)


def _copy(source: IO[bytes], target: IO[bytes], size: int) -> None:
    remaining = size
    while remaining:
        chunk = source.read(min(remaining, 1 << 20))
        if not chunk:
            raise DataDirectoryError(f"snapshot ended {remaining} bytes early")
        target.write(chunk)
        remaining -= len(chunk)
