"""The floor server's wire format and the lean client that times publish → subscriber
through it (the server itself: :mod:`bench.experiments.latency_budget.floor_server`).

Wire format (all integers big-endian)::

    publisher → server   +--------+-----------------+
                         | length | payload ...     |   length: u32
                         +--------+-----------------+
    server → publisher   +-------+                        index: u64, once the message is
                         | index |                        durable
                         +-------+
    server → subscriber  one frame of our format (messaging.frames: 26 B header + payload)
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import cast

from bench.harness.figures import Figure, latencies
from bench.harness.lean_clients import (
    PUBLISHERS,
    RequestReply,
    Subscriber,
    close_all,
    connect,
    publish_paced,
)
from bench.harness.loops import DRAIN_SECONDS
from bench.harness.payloads import PAYLOAD, latency_of, stamped
from messaging.frames import BatchDecoder

LENGTH = struct.Struct(">I")  # a publisher's message: its payload's length
ACK = struct.Struct(">Q")  # the server's answer: the index of the durable message
MODES = ("inline", "thread")
CONNECT_SECONDS = 30.0


class FrameStream(Subscriber):
    """A subscriber connection: decodes frames as they arrive and times each message."""

    def __init__(self, total: int, delays: list[float]) -> None:
        super().__init__()
        self.total = total
        self.delays = delays
        self.decoder = BatchDecoder(after=0)
        self.count = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        try:
            batches = self.decoder.feed(data)
        except Exception as err:  # a damaged stream ends the run with its reason
            self._finish(err)
            return
        for batch in batches:
            messages = batch.messages()
            self.count += len(messages)
            self.delays.extend(latency_of(m.data, now) for m in messages)
        if self.count >= self.total:
            self._finish(None)


def acknowledgement(buf: bytes) -> tuple[int, bytes] | None:
    """The index the server answered at the start of ``buf``, and what follows."""
    if len(buf) < ACK.size:
        return None
    return ACK.unpack_from(buf)[0], buf[ACK.size:]


async def floor_latency(publish_port: int, subscribe_port: int, rate: int,
                        seconds: float) -> Figure:
    """Publish → subscriber latency through the floor server: one subscriber connection,
    length-prefixed 100 B messages at ``rate``/s over a pool of publisher connections (the
    same pool and pacing the peer benchmark's lean clients use)."""
    total = int(rate * seconds)
    delays: list[float] = []
    stream: FrameStream | None = None
    pool: list[RequestReply] = []
    try:
        async with asyncio.timeout(CONNECT_SECONDS):
            stream = await connect("127.0.0.1", subscribe_port,
                                   lambda: FrameStream(total, delays))
            pool = [await connect("127.0.0.1", publish_port,
                                  lambda: RequestReply(acknowledgement))
                    for _ in range(PUBLISHERS)]
        await asyncio.sleep(0.2)
        sent = await publish_paced(pool, rate, seconds,
                                   lambda k: LENGTH.pack(len(PAYLOAD)) + stamped(k),
                                   lambda index: isinstance(index, int) and index > 0)
        await asyncio.wait([stream.done], timeout=DRAIN_SECONDS)
    finally:
        close_all([stream.transport if stream is not None else None]
                  + [p.transport for p in pool])
    if stream.done.done() and stream.done.exception() is not None:
        raise stream.done.exception()  # type: ignore[misc]
    figure = latencies(delays, sent, stream.count)
    figure.extra["all_delivered"] = stream.count == total
    return figure
