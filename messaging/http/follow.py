"""Following a topic over one HTTP response: the loop of a native ``GET /messaging/messages``.

A stream moves through three ways of getting its bytes, fastest last:

1. **Files**, at socket speed: chunks read on the room's read threads
   (:mod:`messaging.http.executors`), growing from STREAM_CHUNK_MIN to STREAM_CHUNK while each
   write leaves the socket drained and dropping back (with no read-ahead) when it does not, so a
   subscriber that stops reading pins at most about one STREAM_CHUNK.
2. **The topic's in-memory tail**, on the loop, for a follower a little behind: no read and no
   thread, so a follower that fell behind stays cheap and does not take a thread from others.
3. **The fan-out** (:mod:`messaging.http.fanout`): a follower that has caught up, with its
   socket drained, parks there; every new commit is written to its socket without waking its
   task, until it needs the files again.

It lives in the HTTP room because it writes an HTTP response (and, parked, HTTP chunks straight
to the socket); what it reads from, :class:`~messaging.topic.view.ReaderView` and the topic's
tail, is the topic room's.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from messaging.broker.view import BrokerMetrics
from messaging.http.executors import Executors
from messaging.http.fanout import FanOuts
from messaging.topic.view import ReaderView

#: Bytes a stream reads from disk per write: it starts at the minimum and doubles up to the
#: maximum while the socket keeps up.
STREAM_CHUNK_MIN = 16 << 10
STREAM_CHUNK = 64 << 10


class TopicStreamer:
    """Writes a topic's frames to HTTP responses: files, then the tail, then the fan-out."""

    def __init__(self, executors: Executors, metrics: BrokerMetrics) -> None:
        self.executors = executors
        self.metrics = metrics
        self.fanouts = FanOuts(metrics)

    async def first_chunk(self, reader: ReaderView) -> bytes:
        """The first chunk, read before the response is prepared (so that an error is still a
        proper status rather than a broken 200)."""
        return await self.executors.read(reader.read, STREAM_CHUNK_MIN)

    async def send(self, response: web.StreamResponse, reader: ReaderView,
                   chunk: bytes | memoryview, streaming: bool,
                   transport: asyncio.Transport | None) -> None:
        """Write ``chunk`` and everything after it; with ``streaming``, follow the topic until
        it closes or the reader reaches its end. A read in flight is always awaited, whatever
        happens to the response."""
        metrics = self.metrics
        topic = reader.topic
        sent = 0
        size = STREAM_CHUNK_MIN
        while True:
            if chunk:
                caught_up = reader.last_index >= topic.committed_index
                following = None if caught_up else reader.read_tail()
                ahead = (self.executors.read(reader.read, size)
                         if not caught_up and following is None and drained(transport)
                         else None)
                try:
                    await response.write(chunk)
                except BaseException:
                    if ahead is not None:
                        await asyncio.wait([ahead])  # never leave a read running behind us
                        if not ahead.cancelled():
                            ahead.exception()  # retrieved: its error does not matter now
                    raise
                metrics.bytes_streamed.inc(len(chunk))
                metrics.messages_streamed.inc(reader.delivered - sent)
                sent = reader.delivered
                if following is not None:
                    chunk = following
                elif ahead is not None:
                    chunk = await ahead
                elif caught_up:
                    chunk = b""
                    continue
                else:
                    chunk = await self.executors.read(reader.read, size)
                size = min(size * 2, STREAM_CHUNK) if drained(transport) else STREAM_CHUNK_MIN
                continue
            if reader.done or topic.closed or not streaming:
                return
            if (transport is not None and reader.end is None and reader.remaining is None
                    and reader.last_index >= topic.committed_index and drained(transport)):
                sent += await self.fanouts.follow(reader, transport, response.chunked)
                continue
            await topic.wait_for(reader.last_index)
            tail = reader.read_tail()
            chunk = tail if tail is not None else await self.executors.read(
                reader.read, size)


def drained(transport: asyncio.Transport | None) -> bool:
    """Whether everything written to the socket so far has been handed to the kernel."""
    return transport is None or transport.get_write_buffer_size() == 0
