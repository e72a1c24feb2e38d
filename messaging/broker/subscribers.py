"""Subscriber positions (what each subscriber heartbeated it has processed, per topic) and the
retention floors they set.

A subscriber is what the API calls a consumer: a name (the heartbeat's ``url`` parameter,
``subscriber_id`` here) whose heartbeated index is its committed position per topic. A
position only moves forward; a heartbeat with a lower index just says the subscriber is
alive. Only an explicit reset (:data:`RESET`) moves it anywhere, and a delete
(:data:`DELETE`) forgets it. A subscriber silent for longer than the timeout stops holding
data back (it keeps its position). Thread-safe: the writer thread records, any thread reads.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from messaging.errors import CorruptFrameError
from messaging.frames import INTERNAL_TYPE, encode

#: What a retention floor is when no live subscriber holds a topic back.
NO_FLOOR = 2**64 - 1

#: Kinds of :class:`PositionChange`: a heartbeat (forward only), a reset (to any index), a
#: delete (forget the subscriber).
HEARTBEAT = "heartbeat"
RESET = "reset"
DELETE = "delete"

#: Internal command: JSON ``{"op": "reset"|"delete", "name": ..., "index": ..., "all": ...}``;
#: the frame's topic field names the topic (``"all": true``: every topic, for a delete).
CONSUMER_OP = INTERNAL_TYPE | 3

Heartbeat = tuple[int, int, str]  # topic, index, subscriber id
Undo = dict[tuple[int, str], "Subscriber | None"]  # what record_all changed


@dataclass(frozen=True, slots=True)
class PositionChange:
    """One change to a subscriber's position, as a command in the log records it.

    ``topic`` None (a delete only) means every topic the subscriber has a position in.
    """

    topic: int | None
    index: int
    name: str
    kind: str = HEARTBEAT


@dataclass(slots=True)
class Subscriber:
    """A subscriber's heartbeated progress in one topic.

    ``seen`` (``time.monotonic``) decides the retention timeout; ``seen_at`` (``time.time``)
    is the same moment for people. Neither is saved: a restart makes both "now".
    """

    index: int
    seen: float = field(default_factory=time.monotonic)
    seen_at: float = field(default_factory=time.time)


class Subscribers:
    """Every subscriber's position, by topic."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._by_topic: dict[int, dict[str, Subscriber]] = {}
        self._lock = threading.Lock()

    def record(self, topic: int, index: int, subscriber_id: str) -> None:
        """Subscriber ``subscriber_id`` (the heartbeat's ``url`` parameter) has processed
        ``topic`` through ``index``."""
        with self._lock:
            subs = self._by_topic.setdefault(topic, {})
            current = subs.get(subscriber_id)
            if current is None or index >= current.index:
                subs[subscriber_id] = Subscriber(index)
            else:
                # Alive: a fresh timeout, the same place.
                subs[subscriber_id] = Subscriber(current.index)

    def apply(self, change: PositionChange) -> None:
        """Apply one heartbeat, reset or delete (see :class:`PositionChange`)."""
        if change.kind == HEARTBEAT and change.topic is not None:
            self.record(change.topic, change.index, change.name)
            return
        with self._lock:
            if change.kind == RESET and change.topic is not None:
                self._by_topic.setdefault(change.topic, {})[change.name] = Subscriber(
                    change.index)
            elif change.kind == DELETE:
                for topic in self._topics_of(change):
                    subs = self._by_topic[topic]
                    subs.pop(change.name, None)
                    if not subs:
                        del self._by_topic[topic]

    def _topics_of(self, change: PositionChange) -> list[int]:
        """The topics a change touches where the subscriber has a position (lock held)."""
        topics = self._by_topic if change.topic is None else [change.topic]
        return [t for t in topics if change.name in self._by_topic.get(t, {})]

    def record_all(self, changes: Iterable[Heartbeat | PositionChange]) -> Undo:
        """Apply several changes in order (a tuple is a heartbeat); returns what :meth:`undo`
        needs to take them back."""
        before: Undo = {}
        for item in changes:
            change = item if isinstance(item, PositionChange) else PositionChange(*item)
            with self._lock:
                keys = ([(change.topic, change.name)] if change.topic is not None
                        else [(t, change.name) for t in self._topics_of(change)])
                for key in keys:
                    if key not in before:
                        before[key] = self._by_topic.get(key[0], {}).get(key[1])
            self.apply(change)
        return before

    def undo(self, before: Undo) -> None:
        """Put back what :meth:`record_all` changed (its group failed to be saved)."""
        with self._lock:
            for (topic, subscriber_id), subscriber in before.items():
                subs = self._by_topic.setdefault(topic, {})
                if subscriber is None:
                    subs.pop(subscriber_id, None)
                    if not subs:
                        del self._by_topic[topic]
                else:
                    subs[subscriber_id] = subscriber

    def positions(self, topic: int) -> dict[str, int]:
        """Subscriber id → heartbeated index, for one topic."""
        with self._lock:
            return {who: s.index for who, s in self._by_topic.get(topic, {}).items()}

    def last_seen(self, topic: int, subscriber_id: str) -> float | None:
        """When (``time.monotonic``) a subscriber last heartbeated, or None if unknown."""
        with self._lock:
            subscriber = self._by_topic.get(topic, {}).get(subscriber_id)
            return subscriber.seen if subscriber is not None else None

    def floor(self, topic: int, now: float | None = None) -> int:
        """The highest index retention may delete through: the smallest live position."""
        now = time.monotonic() if now is None else now
        with self._lock:
            live = [s.index for s in self._by_topic.get(topic, {}).values()
                    if now - s.seen <= self.timeout]
        return min(live) if live else NO_FLOOR

    def subscribers(self) -> list[tuple[int, str, Subscriber]]:
        """(topic, subscriber id, a copy of its record) for every subscriber, by topic."""
        with self._lock:
            return [(t, u, Subscriber(s.index, s.seen, s.seen_at))
                    for t, subs in sorted(self._by_topic.items())
                    for u, s in sorted(subs.items())]

    def rows(self) -> list[tuple[int, str, int]]:
        """(topic, subscriber id, index) for every subscriber."""
        with self._lock:
            return [(t, u, s.index) for t, subs in sorted(self._by_topic.items())
                    for u, s in subs.items()]

    def saved(self) -> dict[str, dict[str, int]]:
        """The JSON form kept in ``broker.json`` and in snapshots."""
        with self._lock:
            return {str(t): {u: s.index for u, s in subs.items()}
                    for t, subs in self._by_topic.items()}

    def restore(self, saved: dict[str, dict[str, int]]) -> None:
        """Replace every position with ``saved`` (from :meth:`saved`).

        A restart gives every subscriber a fresh timeout: it may be reconnecting right now.
        """
        restored = {int(topic): {who: Subscriber(int(index)) for who, index in ids.items()}
                    for topic, ids in saved.items()}
        with self._lock:
            self._by_topic = restored


def consumer_command(kind: str, topic: int | None, name: str, index: int = 0) -> bytes:
    """The internal frame that resets (``kind`` RESET) or deletes (DELETE) a position.

    ``topic`` None deletes the consumer's position in every topic.
    """
    if kind not in (RESET, DELETE) or (kind == RESET and topic is None):
        raise ValueError(f"no consumer command {kind!r} for topic {topic}")
    op: dict[str, Any] = {"op": kind, "name": name, "index": index}
    if topic is None:
        op["all"] = True
    return encode(CONSUMER_OP, topic or 0, json.dumps(op, separators=(",", ":")).encode())


def parse_consumer_command(topic: int, data: bytes) -> PositionChange:
    """The position change a :data:`CONSUMER_OP` frame records."""
    try:
        op = json.loads(data)
        kind, name, index = op["op"], op["name"], op.get("index", 0)
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptFrameError(f"consumer command is not valid JSON: {err}") from err
    if kind not in (RESET, DELETE) or not isinstance(name, str) or not isinstance(index, int):
        raise CorruptFrameError(f"invalid consumer command {op!r}")
    return PositionChange(None if op.get("all") else topic, index, name, kind)
