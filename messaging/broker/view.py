"""What the rooms above read of the broker: the one protocol of this boundary.

:class:`~messaging.broker.broker.Broker` satisfies it; the HTTP handlers (native API, consumers,
Durable Streams, readiness) depend on :class:`BrokerView` alone, so tests pass fakes through
it. It hands out only committed state: the read model
(:class:`~messaging.broker.state.CommittedState`), the topics' committed views, figures and
snapshots. Writes never go through here: they are commands through the log
(:class:`messaging.log.base.Log`), built by :mod:`messaging.broker.commands`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from messaging.aio import Notifier
from messaging.broker.metrics import BrokerMetrics
from messaging.broker.snapshot import SNAPSHOT_CONTENT_TYPE, SNAPSHOT_PATH, SnapshotStream
from messaging.broker.state import CommittedState
from messaging.broker.topic_settings import TopicEntry
from messaging.tiered.manifest import Manifest
from messaging.topic.view import TopicView

#: Figures and snapshots are read too: their types, for the rooms above.
__all__ = ["SNAPSHOT_CONTENT_TYPE", "SNAPSHOT_PATH", "BrokerMetrics", "BrokerView",
           "SnapshotStream"]


class BrokerView(Protocol):
    """The broker as the HTTP layer reads it: topics, subscribers, streams, figures."""

    @property
    def metrics(self) -> BrokerMetrics: ...
    @property
    def committed(self) -> CommittedState:
        """The read model: streams, topic settings and manifests, subscriber positions."""
        ...
    @property
    def subscriber_timeout(self) -> float:
        """Seconds a silent subscriber still holds retention back."""
        ...
    @property
    def streams_changed(self) -> Notifier:
        """Notified whenever the catalog changes."""
        ...
    def topic(self, topic_id: int) -> TopicView | None: ...
    def topics(self) -> Sequence[TopicView]: ...
    async def wait_for_topic(self, topic_id: int) -> TopicView | None:
        """The topic, once it exists."""
        ...
    def topic_info(self, topic: TopicView) -> dict[str, Any]:
        """A topic's row of ``GET /messaging/topics``."""
        ...
    def stream_name(self, topic_id: int) -> str | None:
        """The name of the stream a topic holds, if it holds one."""
        ...
    @property
    def max_topic_size(self) -> int:
        """The broker's max-topic-size (a topic's own setting overrides it)."""
        ...
    @property
    def retention_age(self) -> float | None:
        """The broker's retention-age in seconds (None: off; a topic's own overrides it)."""
        ...
    @property
    def max_segment_size(self) -> int:
        """The broker's max-segment-size (a topic's own setting overrides it)."""
        ...
    def settings(self, topic_id: int) -> TopicEntry:
        """A topic's own settings and its last deletion."""
        ...
    def manifest(self, topic_id: int) -> Manifest:
        """Which of a topic's segments are in the object store."""
        ...
    @property
    def object_store_url(self) -> str | None:
        """The object store's URL (None: the broker has none)."""
        ...
    def deleted_at(self, topic_id: int) -> int | None:
        """The broker index a topic was last deleted at (None: never)."""
        ...
    def subscribers(self, topic_id: int) -> dict[str, int]:
        """A topic's subscribers and the index each has heartbeated."""
        ...
    def diagnostics(self) -> dict[str, Any]: ...
