"""Subscriber positions (what each subscriber heartbeated it has processed, per topic) and the
retention floors they set.

A position only moves forward; a heartbeat with a lower index just says the subscriber is
alive. A subscriber silent for longer than the timeout stops holding data back (it keeps its
position). Thread-safe: the writer thread records, any thread reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

#: What a retention floor is when no live subscriber holds a topic back.
NO_FLOOR = 2**64 - 1

Heartbeat = tuple[int, int, str]  # topic, index, subscriber id
Undo = dict[tuple[int, str], "Subscriber | None"]  # what record_all changed


@dataclass(slots=True)
class Subscriber:
    """A subscriber's heartbeated progress in one topic."""

    index: int
    seen: float = field(default_factory=time.monotonic)


class Subscribers:
    """Every subscriber's position, by topic."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._by_topic: dict[int, dict[str, Subscriber]] = {}
        self._lock = threading.Lock()

    def record(self, topic: int, index: int, url: str) -> None:
        """Subscriber ``url`` has processed ``topic`` through ``index``."""
        with self._lock:
            subs = self._by_topic.setdefault(topic, {})
            current = subs.get(url)
            if current is None or index >= current.index:
                subs[url] = Subscriber(index)
            else:
                current.seen = time.monotonic()

    def record_all(self, heartbeats: Iterable[Heartbeat]) -> Undo:
        """Record several heartbeats; returns what :meth:`undo` needs to take them back."""
        heartbeats = list(heartbeats)
        with self._lock:
            before = {(t, u): self._by_topic.get(t, {}).get(u) for t, _i, u in heartbeats}
        for topic, index, url in heartbeats:
            self.record(topic, index, url)
        return before

    def undo(self, before: Undo) -> None:
        """Put back what :meth:`record_all` changed (its group failed to be saved)."""
        with self._lock:
            for (topic, url), subscriber in before.items():
                subs = self._by_topic.setdefault(topic, {})
                if subscriber is None:
                    subs.pop(url, None)
                else:
                    subs[url] = subscriber

    def positions(self, topic: int) -> dict[str, int]:
        """Subscriber id → heartbeated index, for one topic."""
        with self._lock:
            return {url: s.index for url, s in self._by_topic.get(topic, {}).items()}

    def last_seen(self, topic: int, url: str) -> float | None:
        """When (``time.monotonic``) a subscriber last heartbeated, or None if unknown."""
        with self._lock:
            subscriber = self._by_topic.get(topic, {}).get(url)
            return subscriber.seen if subscriber is not None else None

    def floor(self, topic: int, now: float | None = None) -> int:
        """The highest index retention may delete through: the smallest live position."""
        now = time.monotonic() if now is None else now
        with self._lock:
            live = [s.index for s in self._by_topic.get(topic, {}).values()
                    if now - s.seen <= self.timeout]
        return min(live) if live else NO_FLOOR

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
        restored = {int(topic): {url: Subscriber(int(index)) for url, index in urls.items()}
                    for topic, urls in saved.items()}
        with self._lock:
            self._by_topic = restored
