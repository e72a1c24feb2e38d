"""Recovery: making a topic's files agree with what was acknowledged.

Opening a topic (:func:`recover`) reads its directory once: it finishes what retention left
(segments and time indexes below the tombstone, the tombstone's temporaries), removes time
indexes whose segment is gone, reads the last segment whole, verifying every frame, and
truncates it at the first incomplete or corrupt frame (a torn tail), cuts that segment's time
index back to the frames that survived, and removes a last segment left empty (a crash right
after a roll). Older segments are indexed lazily, when first read.

At the broker's start-up, :func:`remove_frames_after` removes the frames above an index that
the broker's state never accepted: a crash between writing the frames and the state left
them, and they were never acknowledged.

Threads: recovery runs before the topic is shared with any other thread, and removing frames
after the topic is closed: nothing else touches its files meanwhile.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

from messaging.files import fsync_dir, read_json, remove_stale_temporaries, truncate_durably
from messaging.topic.retention import TOMBSTONE
from messaging.topic.segment import SEGMENT_SUFFIX, Segment
from messaging.topic.stats import TopicStats
from messaging.topic.times import TIMES_SUFFIX, SegmentTimes, times_path

log = logging.getLogger(__name__)


class Recovered(NamedTuple):
    """What a topic's directory holds once recovered."""

    segments: list[Segment]  # oldest first; the last one indexed and verified
    tombstone: int  # the first index retention kept (0: it never deleted anything)


def recover(path: Path, topic_id: int, stats: TopicStats) -> Recovered:
    """Recover the topic in ``path`` (see the module); counts cut bytes in ``stats``."""
    # One directory listing per topic: start-up with many topics is dominated by it.
    with os.scandir(path) as listing:
        entries = {entry.name: entry for entry in listing}
    dir_dirty = False
    tombstone = 0
    if TOMBSTONE in entries:
        tombstone = int(read_json(path / TOMBSTONE)["first_index"])
    if any(name.startswith(TOMBSTONE + ".") for name in entries):
        remove_stale_temporaries(path / TOMBSTONE)
    for name in sorted(n for n in entries if n.endswith(TIMES_SUFFIX)):
        segment_file = name[: -len(TIMES_SUFFIX)] + SEGMENT_SUFFIX
        if segment_file not in entries or int(name[: -len(TIMES_SUFFIX)]) < tombstone:
            # Its segment was deleted (retention, a crash in a roll): it times nothing.
            (path / name).unlink()
            dir_dirty = True
    segments: list[Segment] = []
    for name in sorted(n for n in entries if n.endswith(SEGMENT_SUFFIX)):
        file = path / name
        first = int(name[: -len(SEGMENT_SUFFIX)])
        if first < tombstone:
            # Retention wrote the tombstone and then stopped before deleting this file.
            file.unlink()
            dir_dirty = True
            continue
        segment = Segment(file, first, size=entries[name].stat().st_size)
        segment.committed_size = segment.size
        if name[: -len(SEGMENT_SUFFIX)] + TIMES_SUFFIX in entries:
            segment.times = SegmentTimes(times_path(file), on_disk=True)
        segments.append(segment)
    while segments:
        last = segments[-1]
        _recover_segment(last, topic_id, stats)
        if last.size:
            break
        last.path.unlink()  # an empty segment: a crash right after a roll
        if last.times is not None:
            last.times.remove_file()
        dir_dirty = True
        segments.pop()
    if dir_dirty:
        fsync_dir(path)
    return Recovered(segments, tombstone)


def _recover_segment(segment: Segment, topic_id: int, stats: TopicStats) -> None:
    """Index the last segment, verifying every frame; cut it at the first bad one."""
    with segment.path.open("rb") as f:
        data = f.read()
    error = segment.build_index(data, verify=True)
    if error is not None:
        cut = len(data) - segment.size
        stats.add(recovered_truncated_bytes=cut)
        log.warning("topic %d: truncated %d bytes at byte %d of %s (%s)", topic_id, cut,
                    segment.size, segment.path.name, error)
        truncate_durably(segment.path, segment.size)
    _recover_times(segment, topic_id)


def _recover_times(segment: Segment, topic_id: int) -> None:
    """Cut the last segment's time index back to the frames that survived.

    Its records are fsynced before the frames they cover are written, so every frame
    kept has its record; records of frames a crash took are removed.
    """
    times = segment.times
    if times is None:
        return
    cut = times.recover(segment.last_index)
    if cut:
        log.warning("topic %d: removed %d bytes of time records past index %d from %s",
                    topic_id, cut, segment.last_index, times.path.name)
    if segment.count and not times.committed and not times.damaged:
        log.warning("topic %d: %s holds no time record; the times of %s are unknown",
                    topic_id, times.path.name, segment.path.name)
        segment.times = None  # as before times existed: the next append starts a segment


def remove_frames_after(path: Path, topic_id: int, segments: list[Segment],
                        located: tuple[Segment, int, int], index: int) -> int:
    """Remove every frame above ``index`` from the closed topic's files: ``located`` is where
    the first of them is (see :meth:`~messaging.topic.read.TopicReads.locate`), ``segments``
    the topic's. Returns the bytes removed."""
    segment, position, _ordinal = located
    removed = 0
    for later in segments[segments.index(segment) + 1:]:
        removed += later.size
        later.path.unlink()
        if later.times is not None:
            later.times.remove_file()
    removed += segment.size - position
    if position:
        truncate_durably(segment.path, position)
        if segment.times is not None:
            segment.times.cut_after(index)
    else:
        segment.path.unlink()
        if segment.times is not None:
            segment.times.remove_file()
    fsync_dir(path)
    log.warning("topic %d: removed %d bytes after index %d that were never acknowledged",
                topic_id, removed, index)
    return removed
