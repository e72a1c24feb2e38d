"""What a topic reports about itself: counters for diagnostics, and the damage found in its
segments, each place counted and logged once however many readers meet it.

Threads: any thread may report. Recovery counts truncated bytes, reader threads count damage
and the retention thread counts deletions while the broker reads the counters. Each object
here guards its own state with its own lock, held only while memory changes (never across
I/O), so reporting never waits for a thread that is on the disk.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from messaging.errors import CorruptDataError
from messaging.topic.segment import Segment

log = logging.getLogger(__name__)


@dataclass
class TopicStats:
    """Counters a topic keeps for diagnostics and metrics.

    :meth:`add` and :meth:`copy` take the counters' own lock (never held across I/O).
    """

    recovered_truncated_bytes: int = 0
    corrupt_frames: int = 0
    deleted_segments: int = 0
    deleted_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add to counters by name."""
        with self._lock:
            for name, count in counts.items():
                setattr(self, name, getattr(self, name) + count)

    def copy(self) -> dict[str, int]:
        """Every counter at one moment."""
        with self._lock:
            return {"recovered_truncated_bytes": self.recovered_truncated_bytes,
                    "corrupt_frames": self.corrupt_frames,
                    "deleted_segments": self.deleted_segments,
                    "deleted_bytes": self.deleted_bytes}


class OnceSet:
    """A set whose :meth:`first` says, to exactly one caller per key, that the key is new.

    Checking and adding are one step under the set's own lock, so two threads that meet the
    same key at once never both act on it.
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def first(self, key: str) -> bool:
        """Add ``key``; True if it was not there before."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True


class DamageLog:
    """Describes damage found in one topic's segments, counting and logging each place once
    (not once per reader that meets it). Any thread."""

    def __init__(self, topic_id: int, stats: TopicStats) -> None:
        self.topic_id = topic_id
        self.stats = stats
        self._reported = OnceSet()

    def report(self, segment: Segment, error: Exception) -> CorruptDataError:
        """The error for damage in ``segment`` (``error`` names the byte)."""
        damage = CorruptDataError(f"topic {self.topic_id} segment {segment.path.name}: {error}")
        if self._reported.first(str(damage)):
            self.stats.add(corrupt_frames=1)
            log.error("%s", damage)
        return damage
