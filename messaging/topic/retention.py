"""Retention: deleting a topic's oldest whole segments, and the tombstone that records it.

``tombstone`` (JSON ``{"first_index": N}``) says that everything below N was deleted. It is
written atomically (temporary file, fsync, rename, fsync of the directory) before any segment
file goes: a crash in between leaves files below the tombstone, which opening the topic
deletes (:mod:`messaging.topic.recovery`), never a topic that seems to start earlier than it
does.

Threads: the broker's retention thread, one run per topic at a time, while the writer appends
and readers read. It looks at the segment table under the table's lock, reads the segments
that may go outside it, removes them from the table and only then deletes their files: a
reader still positioned in one finds the file gone and answers 410.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from messaging.files import fsync_dir, write_json_atomic
from messaging.topic.segment import Segment
from messaging.topic.stats import TopicStats
from messaging.topic.table import SegmentTable

log = logging.getLogger(__name__)

TOMBSTONE = "tombstone"


def truncate(table: SegmentTable, path: Path, stats: TopicStats, max_size: int,
             floor_index: int, older_than: int | None = None) -> int:
    """Delete the oldest whole segments of the topic in ``path`` while it exceeds
    ``max_size``, and every segment up to the last one whose newest message was appended
    before ``older_than`` (ms since the epoch; None: no age limit). Times never decrease
    along a topic, so the segments before that one are older still, also those whose times
    are unknown; a segment of unknown times with no old-enough one after it is left to the
    size limit.

    Keeps the active segment and every segment holding an index above ``floor_index``.
    Writes the tombstone before deleting. Returns the number of bytes deleted. Only the
    segments that may go are indexed (read), not every closed one.
    """
    topic_id = table.topic_id
    segments = table.snapshot()
    closed = segments[:-1]
    aged = 0  # how many of the oldest segments are old enough
    if older_than is not None:
        for k, segment in enumerate(closed):
            newest = segment.last_time()
            if newest is not None:
                if newest >= older_than:
                    break
                aged = k + 1
    total = sum(s.size for s in segments)
    candidates = 0
    for k, segment in enumerate(closed):
        if total <= max_size and k >= aged:
            break
        candidates = k + 1
        total -= segment.size
    for older in closed[:candidates]:
        table.ensure_indexed(older)  # outside the lock: may read whole files
    too_old = {id(s) for s in closed[:aged]}
    with table.lock:
        doomed: list[Segment] = []
        total = sum(s.size for s in table.segments)
        for oldest, following in zip(table.segments, table.segments[1:], strict=False):
            if following.committed_size == 0:
                break  # the writer is rolling into the next one now
            if total <= max_size and id(oldest) not in too_old:
                break
            if not oldest.indexed or oldest.committed_last_index > floor_index \
                    or oldest.damage is not None:
                break
            doomed.append(oldest)
            total -= oldest.size
        if not doomed:
            return 0
        # Indexes are shared by all topics, so this topic's are not contiguous: everything
        # up to the last deleted index is gone, and a read from just after it (a
        # subscriber resuming past its heartbeat) loses nothing.
        first_kept = doomed[-1].committed_last_index + 1
    try:
        write_json_atomic(path / TOMBSTONE, {"first_index": first_kept})
    except OSError as err:
        log.error("topic %d: retention could not write its tombstone (%s); nothing "
                  "deleted", topic_id, err.strerror or err)
        return 0
    table.remove_oldest(len(doomed), first_kept)
    deleted = 0
    for segment in doomed:
        with contextlib.suppress(FileNotFoundError):
            segment.path.unlink()
        if segment.times is not None:
            segment.times.remove_file()
        deleted += segment.size
        stats.add(deleted_segments=1, deleted_bytes=segment.size)
        log.info("topic %d: retention deleted %s (%d bytes); first index now %d",
                 topic_id, segment.path.name, segment.size, first_kept)
    fsync_dir(path)
    return deleted
