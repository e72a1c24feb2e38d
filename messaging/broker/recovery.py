"""Opening a data directory: the state saved in ``broker.json``, the state journal's lines after
it, and the topics' files made to agree with both (start-up only, before anything is served).

A group's journal line is its commit mark (see :mod:`messaging.broker.state_log`), written in
one of two ways, which ``broker.json`` records (:data:`MARKS`):

- *after the frames* (``--fsync interval|never``, a cluster node): frames first, then the
  line, both fsynced side by side. A crash can leave frames of a group whose line never made
  it, in one segment or across a roll: that group was never acknowledged, and
  :func:`cut_uncommitted` removes every frame above the last line's broker index, so a batch
  is all or nothing;
- *lines first* (``--fsync always`` on one node): a group's line is durable before its frames
  are written, and a group of single-message publishes has none (a message is whole or cut by
  its checksum). Frames no line covers are such messages, acknowledged or not: they stay.

Either way a last line whose frames did not all reach the disk (a power loss between the
fsyncs, a crash after a line written first) is dropped and its frames cut back. Besides,
recovery mends frames of a named topic beyond its stream's saved tail, directories of named
topics the catalog does not know, and files of a topic whose deletion was journaled but not
carried out. Each function here mends one of these; none writes anything else, so a broker
whose disk is full still starts and serves reads.

A directory written by a release before commit marks has acknowledged groups without a line,
so nothing is cut there until the broker has marked it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from messaging.broker.catalog import Catalog
from messaging.broker.snapshot import FORMAT
from messaging.broker.state_log import CatalogLog, incomplete
from messaging.broker.subscribers import PositionChange, Subscribers
from messaging.broker.topic_settings import TopicTable
from messaging.errors import DataDirectoryError
from messaging.files import read_json, remove_stale_temporaries
from messaging.placement import NAMED_TOPIC_BASE
from messaging.topic.store import TopicStore
from messaging.topic.topic import Topic

log = logging.getLogger(__name__)

#: The key of ``broker.json`` that says how the groups after it mark their commit: ``true``,
#: every group has a journal line, written after its frames; :data:`LINES_FIRST`, a group's
#: line is durable before its frames are written, and groups of single-message publishes have
#: none. Absent: a release before commit marks wrote the directory.
MARKS = "marks"
LINES_FIRST = "lines first"


def read_saved_state(path: Path) -> dict[str, Any]:
    """``broker.json`` of the data directory ``path`` (a fresh state when there is none);
    :class:`DataDirectoryError` when it is unreadable or of another format."""
    state: dict[str, Any] = {"format": FORMAT}
    meta = path / "broker.json"
    if meta.exists():
        try:
            state = read_json(meta)
        except (OSError, ValueError) as err:
            raise DataDirectoryError(f"{meta} is unreadable: {err}") from err
        if state.get("format") != FORMAT:
            raise DataDirectoryError(f"{meta} has format {state.get('format')!r}; this "
                                     f"broker reads format {FORMAT}")
    remove_stale_temporaries(meta)
    return state


def replay_journal(journal: CatalogLog, after: int, store: TopicStore, catalog: Catalog,
                   positions: Subscribers) -> int:
    """Apply the state journal's lines after ``after``; returns the broker index the last of
    them recorded.

    Its last lines may belong to groups whose frames did not all reach the disk (a power
    loss: the line was made durable, the frames were not): those groups were never
    acknowledged, so their lines are dropped and the frames of them that did reach the disk
    are cut back. Frames and the state recorded with them then agree.
    """
    def last_on_disk(topic_id: int) -> int:
        topic = store.get(topic_id)
        return topic.last_index if topic is not None else 0

    try:
        entries = journal.read(after)
        # Without fsync (--fsync interval|never, a cluster) a power loss may keep several
        # lines whose frames it took: each goes, the newest first.
        while entries and incomplete(entries[-1], last_on_disk):
            cut_group(store, entries.pop())
            journal.drop_last()
        for entry in entries:
            catalog.replay(entry.get("changes", {}))
            for topic, index, name, kind in entry.get("positions", []):
                positions.apply(PositionChange(topic, index, name, kind))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataDirectoryError(f"{journal.path} is unreadable: {err}") from err
    return int(entries[-1].get("index", 0)) if entries else 0


def cut_group(store: TopicStore, entry: dict[str, Any]) -> None:
    """Remove the frames of a group the journal records as interrupted."""
    first = int(entry["group"]["first"])
    for key in entry["group"]["last"]:
        topic = store.get(int(key))
        if topic is not None and topic.last_index >= first:
            _cut(store, topic, first - 1, "a group a crash interrupted")


def cut_uncommitted(store: TopicStore, committed: int) -> None:
    """Remove every frame above broker index ``committed`` (the last whole journal line's, or
    ``broker.json``'s): its group's commit mark never reached the disk, so it was never
    acknowledged. A group split across a segment roll goes from both segments."""
    for topic in store.all():
        if topic.last_index > committed:
            _cut(store, topic, committed, "a group whose commit mark a crash took")


def _cut(store: TopicStore, topic: Topic, after: int, what: str) -> None:
    removed = topic.cut_after(after)
    log.warning("topic %d: removed %d bytes of %s (after index %d; it was never "
                "acknowledged)", topic.id, removed, what, after)
    if not any(topic.path.iterdir()):  # it held nothing but that group
        store.remove(topic.id)
    else:
        store.reopen(topic)


def reconcile_streams(store: TopicStore, catalog: Catalog) -> None:
    """Make the named topics on disk match the catalog saved with them.

    A group is acknowledged only after ``broker.json`` (the catalog) is saved, so frames a
    named topic holds beyond its stream's tail were never acknowledged: they go, as do the
    directories of named topics the catalog does not know (a create or a delete that a crash
    interrupted).
    """
    for topic_id in [t for t in store.ids() if t >= NAMED_TOPIC_BASE]:
        name = catalog.name_of(topic_id)
        topic = store.get(topic_id)
        if name is None or topic is None:
            store.remove(topic_id)
            continue
        stream = catalog.streams[name]
        if topic.last_index > stream.tail[0]:
            topic.cut_after(stream.tail[0])
            store.reopen(topic)


def reconcile_deleted(store: TopicStore, table: TopicTable) -> None:
    """Delete the files of topics deleted by a command whose group a crash interrupted after
    its journal line: every frame they hold predates the deletion."""
    for topic in store.all():
        deleted_at = table.committed(topic.id).deleted_at
        if deleted_at is not None and 0 < topic.last_index <= deleted_at:
            log.warning("topic %d: removing its files, deleted at index %d", topic.id,
                        deleted_at)
            store.remove(topic.id)
