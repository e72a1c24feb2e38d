"""Fan-out of new commits to the streams that have caught up, in one pass on the event loop.

A streaming GET that has sent everything committed so far parks here instead of waiting in a
task of its own. After every commit of its topic, :class:`FanOut` takes the new bytes from the
topic's in-memory tail (shared by every follower: prepared once, never copied per follower)
and writes them straight to each parked stream's socket. A stream leaves the fan-out, and its
task takes the ordinary path again, when the tail does not hold what it needs (it fell behind,
the segment rolled), when its socket has not drained (a slow reader is never buffered here),
when its connection closes, or when the topic closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from messaging.metrics import BrokerMetrics

#: Followers written to in one loop callback.
SLICE = 64


class FollowedTopic(Protocol):
    """What the fan-out needs of a topic."""

    @property
    def closed(self) -> bool: ...
    @property
    def committed_index(self) -> int: ...
    def listen(self, callback: Callable[[], None]) -> None: ...
    def unlisten(self, callback: Callable[[], None]) -> None: ...


class FollowingReader(Protocol):
    """What the fan-out needs of a parked stream's reader."""

    @property
    def topic(self) -> FollowedTopic: ...
    @property
    def delivered(self) -> int: ...
    @property
    def last_index(self) -> int: ...
    def read_tail(self) -> memoryview | None: ...


@dataclass(eq=False)
class Follower:
    """One parked stream: its reader, its socket, and the future its task awaits."""

    reader: FollowingReader
    transport: asyncio.Transport
    chunked: bool
    released: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    messages_sent: int = 0  # delivered count the metrics have already seen

    def release(self) -> None:
        """Hand the stream back to its task."""
        if not self.released.done():
            self.released.set_result(None)


class FanOut:
    """The parked followers of one topic."""

    def __init__(self, topic: FollowedTopic, metrics: BrokerMetrics) -> None:
        self.topic = topic
        self.metrics = metrics
        self.followers: set[Follower] = set()

    def park(self, follower: Follower) -> None:
        """Add a follower (listening to the topic from the first one on)."""
        if not self.followers:
            self.topic.listen(self.broadcast)
        self.followers.add(follower)

    def unpark(self, follower: Follower) -> None:
        """Remove a follower (and stop listening after the last one)."""
        self.followers.discard(follower)
        follower.release()
        if not self.followers:
            self.topic.unlisten(self.broadcast)

    def broadcast(self) -> None:
        """Write what the last commits added to every parked follower's socket.

        In slices of SLICE followers, each slice a callback of its own: a publish that
        arrives meanwhile is served between two slices instead of after every socket.
        """
        self._write_slice(list(self.followers))

    def _write_slice(self, followers: list[Follower]) -> None:
        topic = self.topic
        closed = topic.closed
        for follower in followers[:SLICE]:
            if follower not in self.followers:
                continue  # left meanwhile
            transport = follower.transport
            if closed or transport.is_closing() or transport.get_write_buffer_size():
                self.unpark(follower)  # the task decides: end, or go on at socket speed
                continue
            reader = follower.reader
            while (tail := reader.read_tail()) is not None:
                if follower.chunked:
                    transport.writelines((b"%x\r\n" % len(tail), tail, b"\r\n"))
                else:
                    transport.write(tail)
                self.metrics.bytes_streamed.inc(len(tail))
            self.metrics.messages_streamed.inc(reader.delivered - follower.messages_sent)
            follower.messages_sent = reader.delivered
            if reader.last_index < topic.committed_index:
                self.unpark(follower)  # behind the tail, or into a new segment: read files
        if len(followers) > SLICE:
            asyncio.get_running_loop().call_soon(self._write_slice, followers[SLICE:])


class FanOuts:
    """The fan-out of every topic that has parked followers (one per topic object)."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics
        self._by_topic: dict[FollowedTopic, FanOut] = {}

    async def follow(self, reader: FollowingReader, transport: asyncio.Transport,
                     chunked: bool) -> int:
        """Park a caught-up stream until it must take the ordinary path again.

        Returns how many messages the fan-out delivered meanwhile (for the caller's count).
        """
        topic = reader.topic
        fanout = self._by_topic.get(topic)
        if fanout is None:
            fanout = self._by_topic[topic] = FanOut(topic, self.metrics)
        follower = Follower(reader, transport, chunked, messages_sent=reader.delivered)
        before = reader.delivered
        fanout.park(follower)
        try:
            await follower.released
        finally:
            fanout.unpark(follower)
            if not fanout.followers:
                self._by_topic.pop(topic, None)
        return reader.delivered - before

    @property
    def parked(self) -> int:
        """How many streams are parked right now."""
        return sum(len(f.followers) for f in self._by_topic.values())
