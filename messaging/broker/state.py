"""The committed read model: what every reader of the state machine sees, from any thread.

Readers (the HTTP handlers, snapshots, the offload uploader and sweep, consumer listings,
metrics) read the broker's state through :class:`CommittedState` only, never through the
writer's :class:`~messaging.broker.catalog.Catalog` or its staging overlays. It shows the
last committed group and nothing of the group being applied.

How it stays consistent without a lock on writer state: the writer thread publishes a
committed group by storing whole values, one reference at a time: a stream
(:class:`~messaging.broker.catalog.Stream`), a topic's settings
(:class:`~messaging.broker.topic_settings.TopicEntry`) and a topic's producer table are each
replaced, never changed in place once committed (copy-on-commit per entry), so a reader finds
each entry either as it was or as it is, never half-applied. Subscriber positions take their
own lock (:class:`~messaging.broker.subscribers.Subscribers`), which no writer holds across
I/O.
"""

from __future__ import annotations

from messaging.broker.catalog import (
    Catalog,
    Position,
    Stream,
    media_type,
    parse_token,
    token,
)
from messaging.broker.producers import Producer
from messaging.broker.subscribers import Subscriber, Subscribers
from messaging.broker.topic_settings import (
    KEYS,
    MAX_MESSAGE_SIZE,
    MAX_SEGMENT_SIZE,
    MAX_TOPIC_SIZE,
    RETENTION_AGE,
    TopicEntry,
    effective,
)
from messaging.tiered.manifest import Manifest

#: What readers use of the state's own types and words (streams and their offsets, topic
#: settings as shown), so that no reader imports the writer's modules.
__all__ = ["KEYS", "MAX_MESSAGE_SIZE", "MAX_SEGMENT_SIZE", "MAX_TOPIC_SIZE", "RETENTION_AGE",
           "CommittedState", "Position", "Stream", "TopicEntry", "effective", "expired",
           "media_type", "parse_token", "token"]


def expired(stream: Stream, now: float, last_used: float) -> bool:
    """Whether ``stream`` has expired at ``now`` (``last_used``: its last read or write on
    this node, for a sliding TTL)."""
    return Catalog.expired(stream, now, last_used)


class CommittedState:
    """Read-only lookups over the committed streams, topic settings, manifests, producers
    and subscriber positions (any thread)."""

    def __init__(self, catalog: Catalog, positions: Subscribers) -> None:
        self._catalog = catalog
        self._positions = positions

    # -- named streams ----------------------------------------------------------------------

    def stream(self, name: str) -> Stream | None:
        """The stream of that name (soft-deleted ones too), or None."""
        return self._catalog.streams.get(name)

    def streams(self) -> list[Stream]:
        """Every stream (soft-deleted ones too)."""
        return list(self._catalog.streams.values())

    def stream_name(self, topic_id: int) -> str | None:
        """The name of the stream a topic holds, None for a numeric topic."""
        return self._catalog.by_topic.get(topic_id)

    def lineage(self, stream: Stream) -> list[tuple[int, Position | None, Position]]:
        """The pieces a reader of ``stream`` goes through, oldest first (see
        :meth:`Catalog.lineage`)."""
        return self._catalog.lineage(stream)

    def freed_stream_topic(self, topic_id: int) -> bool:
        """Whether ``topic_id`` is a stream topic this catalog gave out and has freed since
        (its stream deleted or expired: the id never comes back)."""
        catalog = self._catalog
        return (catalog.first_topic <= topic_id < catalog.committed_next_topic
                and catalog.by_topic.get(topic_id) is None)

    # -- topics' settings, deletions and manifests ------------------------------------------

    def settings(self, topic_id: int) -> TopicEntry:
        """What the log decided about a topic: its own settings, its last deletion and its
        manifest."""
        return self._catalog.topic_settings.committed(topic_id)

    def deleted_at(self, topic_id: int) -> int | None:
        """The broker index a topic was last deleted at (None: never)."""
        return self.settings(topic_id).deleted_at

    def manifest(self, topic_id: int) -> Manifest:
        """Which of a topic's segments are in the object store."""
        return self.settings(topic_id).manifest

    def known_topics(self) -> list[int]:
        """The topics with an entry (settings, a deletion or a manifest)."""
        return list(self._catalog.topic_settings.entries)

    def kafka_topics(self) -> dict[str, dict[int, int]]:
        """The Kafka topics: name -> partition -> topic id (committed; do not change it)."""
        return self._catalog.topic_settings.kafka

    def producers(self, topic_id: int) -> dict[str, Producer]:
        """A numeric topic's idempotent producers."""
        return self._catalog.producers(topic_id)

    # -- subscriber (consumer) positions ----------------------------------------------------

    def subscribers(self, topic_id: int) -> dict[str, int]:
        """A topic's subscribers and the index each has heartbeated."""
        return self._positions.positions(topic_id)

    def subscriber_records(self) -> list[tuple[int, str, Subscriber]]:
        """Every position: topic, subscriber, its record (index, when last seen)."""
        return self._positions.subscribers()

    def subscriber_rows(self) -> list[tuple[int, str, int]]:
        """Every position as (topic, subscriber, index)."""
        return self._positions.rows()

    def last_seen(self, topic_id: int, subscriber_id: str) -> float | None:
        """When (``time.monotonic``) a subscriber last heartbeated, None if unknown."""
        return self._positions.last_seen(topic_id, subscriber_id)

    def retention_floor(self, topic_id: int, now: float | None = None) -> int:
        """The highest index retention may delete through: the smallest position a live
        subscriber heartbeated (unlimited with none)."""
        return self._positions.floor(topic_id, now)

    @property
    def subscriber_timeout(self) -> float:
        """Seconds a silent subscriber still holds retention back."""
        return self._positions.timeout
