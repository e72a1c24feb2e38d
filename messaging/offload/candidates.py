"""Which local segments are ready to be uploaded: rolled, committed, not yet in the store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from messaging.tiered.manifest import MARK_STRIDE, Manifest, Mark
from messaging.topic.segment import Segment
from messaging.topic.topic import Topic


@dataclass(frozen=True, slots=True)
class Candidate:
    """A closed segment to upload, as it was when chosen."""

    topic: int
    first: int
    last: int
    count: int
    size: int
    path: Path
    times_path: Path | None
    last_time: int | None
    marks: tuple[Mark, ...]
    #: The last index of the segment before it in the manifest's eyes: the manifest's
    #: ``offloaded`` for the first waiting one, the one before's last for the others.
    after: int


def closed_segments(topic: Topic) -> list[Segment]:
    """The topic's segments that no write will change again: every one before the newest,
    once the newest holds a committed frame (the group that rolled into it committed, so
    everything before it is committed and, under ``--fsync always``, fsynced)."""
    segments = topic.segments()
    if len(segments) < 2 or not segments[-1].committed_size:
        return segments[:-2] if len(segments) > 2 else []
    return segments[:-1]


def candidates(topic: Topic, manifest: Manifest) -> list[Candidate]:
    """The closed segments above what the manifest covers, oldest first (blocking: a segment
    recovery did not read is indexed here)."""
    found: list[Candidate] = []
    for segment in closed_segments(topic):
        topic.ensure_indexed(segment)
        if segment.damage is not None:
            break  # never upload damage; the segments after it wait
        if segment.committed_last_index <= manifest.covered or not segment.committed_count:
            continue
        times = segment.times
        found.append(Candidate(
            topic.id, segment.first_index, segment.committed_last_index,
            segment.committed_count, segment.committed_size, segment.path,
            times.path if times is not None and not times.damaged and times.path.exists()
            else None,
            segment.last_time(), object_marks(segment),
            found[-1].last if found else manifest.offloaded))
    return found


def object_marks(segment: Segment) -> tuple[Mark, ...]:
    """The segment's sparse index thinned to one mark per :data:`MARK_STRIDE` bytes (those
    of its committed frames, none at byte 0), for its object's manifest entry."""
    marks: list[Mark] = []
    next_at = MARK_STRIDE
    for index, position, ordinal in zip(segment.mark_indexes, segment.mark_positions,
                                        segment.mark_ordinals, strict=True):
        if position >= segment.committed_size:
            break
        if position >= next_at:
            marks.append((index, position, ordinal))
            next_at = position + MARK_STRIDE
    return tuple(marks)
