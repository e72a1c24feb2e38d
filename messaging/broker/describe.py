"""What a broker says of its topics: a topic's row of the API, the diagnostics' topic list,
and the rows its metrics are made of. Read-only, over committed state and committed views
(any thread)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from messaging.broker.metrics import TopicRow
from messaging.broker.state import CommittedState
from messaging.tiered.view import Tiered, TieredTopic
from messaging.topic.store import TopicStore
from messaging.topic.topic import Topic
from messaging.topic.view import TopicView


def topic_info(topic: TopicView, state: CommittedState, store: TopicStore,
               tiered: Tiered | None) -> dict[str, Any]:
    """The JSON description of a topic used by the HTTP API (with its stream's name; with
    an object store, what of it is there)."""
    info: dict[str, Any] = {}
    name = state.stream_name(topic.id)
    if name is not None:
        info["name"] = name
    info |= {
        "id": topic.id,
        "first_index": topic.first_index,
        "last_index": topic.committed_index,
        "size": topic.size,
        "segments": topic.segment_count,
        "subscribers": state.subscribers(topic.id),
    }
    kafka = state.settings(topic.id).kafka
    if kafka is not None:
        info["kafka_topic"], info["kafka_partition"] = kafka
    if tiered is not None:
        manifest = state.manifest(topic.id)
        local = topic.local if isinstance(topic, TieredTopic) else store.get(topic.id)
        if local is not None:
            info["first_index"] = tiered.view(local).first_index
            info["local_first_index"] = local.first_index
        info["offloaded_size"] = manifest.size
        info["offloaded_segments"] = len(manifest.objects)
        info["offloaded_through"] = manifest.offloaded
    return info


def topics(local: Sequence[Topic], state: CommittedState, store: TopicStore,
           tiered: Tiered | None) -> dict[str, Any]:
    """The diagnostics' topics (rows with counters and health) and open files."""
    rows = []
    for topic in local:
        info = topic_info(topic, state, store, tiered)
        info["stats"] = topic.stats.copy()
        failure = topic.failure
        info["writable"] = failure is None
        info["followers"] = topic.waiting  # streams parked until its next commit
        if failure is not None:
            info["failure"] = str(failure)
        rows.append(info)
    return {"topics": rows, "open_files": store.open_files,
            "max_open_files": store.max_open_files}


def topic_rows(local: Sequence[Topic]) -> list[TopicRow]:
    """Every topic's figures and health, for the metrics."""
    return [TopicRow(t.id, t.stats.corrupt_frames, t.failure is None, t.size,
                     t.first_index, t.committed_index, t.segment_count)
            for t in local]


def subscriber_rows(state: CommittedState, store: TopicStore,
                    ) -> list[tuple[int, str, int, int]]:
    """Every position with its lag (topic, subscriber, index, messages behind), for the
    metrics."""
    rows = []
    for topic_id, subscriber_id, index in state.subscriber_rows():
        topic = store.get(topic_id)
        last = topic.committed_index if topic is not None else 0
        rows.append((topic_id, subscriber_id, index, max(last - index, 0)))
    return rows
