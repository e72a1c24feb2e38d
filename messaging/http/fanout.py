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
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from messaging.broker.view import BrokerMetrics
from messaging.topic.segment import Segment
from messaging.topic.tail import Tail, TailChunk
from messaging.topic.view import ReaderView, TopicView

#: Followers written to in one loop callback.
SLICE = 64
#: A slice that kept the loop busy at least this long (s) is followed by a rest about as long
#: (a timer; the loop's timers count whole milliseconds) before the next slice or pass: with
#: many followers the fan-out takes about half of the loop, the loop really waits in between
#: (so the writer thread gets the GIL at once and publishes are answered), and commits that
#: come meanwhile reach the followers the pass has not reached yet in the same write.
REST_FROM = 0.0005


@dataclass(eq=False)
class Follower:
    """One parked stream: its reader, its socket, and the future its task awaits."""

    reader: ReaderView
    transport: asyncio.Transport
    chunked: bool
    released: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    def release(self) -> None:
        """Hand the stream back to its task."""
        if not self.released.done():
            self.released.set_result(None)


class _Prepared(NamedTuple):
    """The bytes every follower at one position of the tail is sent, prepared once."""

    framed: bytes  # as one HTTP chunk: size line, data, CRLF
    raw: bytes
    last: TailChunk  # the chunk the data ends in (the followers' state afterwards)
    visible_at: float  # when the oldest commit in it became visible


class FanOut:
    """The parked followers of one topic.

    One pass at a time: commits that arrive while a pass is under way are picked up by the
    followers it has not reached yet, and by one more pass over every follower after it, so
    under load a pass carries several commits in one write per socket.
    """

    def __init__(self, topic: TopicView, metrics: BrokerMetrics) -> None:
        self.topic = topic
        self.metrics = metrics
        self.followers: set[Follower] = set()
        self._busy = False  # a pass is under way (or due after a rest)
        self._again = False  # a commit came during the pass: one more pass after it

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

    @property
    def busy(self) -> bool:
        """Whether a pass is under way (or due after a rest)."""
        return self._busy

    def broadcast(self) -> None:
        """Write what the last commits added to every parked follower's socket.

        In slices of SLICE followers, each slice a callback of its own: a publish that
        arrives meanwhile is served between two slices instead of after every socket.
        """
        if self._busy:
            self._again = True
            return
        self._busy = True
        self._start()

    def _start(self) -> None:
        self._again = False
        self._write_slice(list(self.followers), 0)

    def _write_slice(self, followers: list[Follower], start: int) -> None:
        began = time.perf_counter()
        topic = self.topic
        parked = self.followers
        closed = topic.closed
        tail = topic.tail
        committed = topic.committed_index
        prepared: dict[tuple[Segment, int], _Prepared | None] = {}
        sent_bytes = sent_messages = 0
        stop = start + SLICE
        try:
            for follower in followers[start:stop]:
                if follower not in parked:
                    continue  # left meanwhile
                transport = follower.transport
                if closed or transport.is_closing() or transport.get_write_buffer_size():
                    self.unpark(follower)  # the task decides: end, or go on at socket speed
                    continue
                reader = follower.reader
                position = reader.tail_position()
                if position is None:
                    ready = None
                elif position in prepared:
                    ready = prepared[position]
                else:
                    ready = prepared[position] = _prepare(tail, *position)
                if ready is not None:
                    transport.write(ready.framed if follower.chunked else ready.raw)
                    sent_bytes += len(ready.raw)
                    sent_messages += reader.adopt_tail(ready.last)
                if reader.last_index < committed:
                    self.unpark(follower)  # behind the tail, or into a new segment: read files
        finally:
            self.metrics.bytes_streamed.inc(sent_bytes)
            self.metrics.messages_streamed.inc(sent_messages)
            done = time.perf_counter()
            if sent_messages:
                # Once per slice: the oldest commit any of its followers was sent, so the
                # figure bounds every delivery of the slice from above.
                oldest = min(ready.visible_at for ready in prepared.values() if ready)
                self.metrics.fanout_lag.observe(done - oldest)
            loop = asyncio.get_running_loop()
            spent = done - began
            rest = spent if spent >= REST_FROM else 0.0
            if stop < len(followers):
                loop.call_later(rest, self._write_slice, followers, stop)
            elif self._again and parked:
                loop.call_later(rest, self._start)
            else:
                self._busy = self._again = False


def _prepare(tail: Tail, segment: Segment, position: int) -> _Prepared | None:
    """The bytes after ``position`` in the tail, framed once for every follower there."""
    found = tail.after(segment, position)
    if found is None:
        return None
    parts, first, last = found
    raw = b"".join(parts)
    return _Prepared(b"%x\r\n%b\r\n" % (len(raw), raw), raw, last, first.visible_at)


class FanOuts:
    """The fan-out of every topic that has parked followers (one per topic object)."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics
        self._by_topic: dict[TopicView, FanOut] = {}

    async def follow(self, reader: ReaderView, transport: asyncio.Transport,
                     chunked: bool) -> int:
        """Park a caught-up stream until it must take the ordinary path again.

        Returns how many messages the fan-out delivered meanwhile (for the caller's count).
        """
        topic = reader.topic
        fanout = self._by_topic.get(topic)
        if fanout is None:
            fanout = self._by_topic[topic] = FanOut(topic, self.metrics)
        follower = Follower(reader, transport, chunked)
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
