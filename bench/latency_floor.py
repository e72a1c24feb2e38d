"""The floor of a single-threaded Python server on this disk, for bench_latency.py: a minimal
uvloop server that does what Redis does with ``appendfsync always`` and nothing more, the
LocalLog-style hand-off to a writer thread, and the lean clients that time the server.

Run as a script, it is the server (one process, stopped by its PID)::

    python bench/latency_floor.py PUBLISH_PORT SUBSCRIBE_PORT FILE --mode inline|thread
                                  [--prealloc BYTES]

Wire format (all integers big-endian)::

    publisher → server   +--------+-----------------+
                         | length | payload ...     |   length: u32
                         +--------+-----------------+
    server → publisher   +-------+                        index: u64, once the message is
                         | index |                        durable
                         +-------+
    server → subscriber  one frame of our format (messaging.frames: 26 B header + payload)

Each message becomes the frame our segments store (126 B for 100 B), is written to ``FILE``
and fdatasynced; then its publisher gets the index and every subscriber connection gets the
frame (publishers first, as the broker answers them before waking followers). ``inline``
writes and fdatasyncs on the event loop, as Redis does: the package never may (STYLE.md), but
this is the measuring stick. ``thread`` hands the frames to a writer thread the way
``messaging.log.local.LocalLog`` does (:class:`Handoff`): our design without HTTP.
``--prealloc`` fills ``FILE`` with that many zero bytes (fsynced once) before it listens and
overwrites them in place; past their end it grows the file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.disk import fill
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
from messaging.frames import BatchDecoder, encode

LENGTH = struct.Struct(">I")  # a publisher's message: its payload's length
ACK = struct.Struct(">Q")  # the server's answer: the index of the durable message
MODES = ("inline", "thread")
CONNECT_SECONDS = 30.0

Item = TypeVar("Item")


class Handoff(Generic[Item]):
    """LocalLog's hand-off to its writer thread, without the broker behind it.

    The loop appends ``(record, item)`` to a deque and sets a ``threading.Event`` only while
    the writer sleeps; the writer takes everything queued as one group, calls ``write`` with
    the group's records (the disk work, or nothing), and hands the group's items back with one
    ``loop.call_soon_threadsafe(settle, items, error)``, then at once takes the next group.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, write: Callable[[list[bytes]], None],
                 settle: Callable[[list[Item], BaseException | None], None]) -> None:
        self.loop = loop
        self.write = write
        self.settle = settle
        self.groups = 0
        # Appended on the loop, taken on the writer thread: deque operations are atomic.
        self._pending: deque[tuple[bytes, Item]] = deque()
        self._work = threading.Event()
        self._sleeping = False  # as LocalLog: re-checked after it is set, so no wake-up is lost
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="handoff-writer", daemon=True)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def submit(self, record: bytes, item: Item) -> None:
        """Queue ``record``; ``item`` comes back through ``settle`` once it is written."""
        self._pending.append((record, item))
        if self._sleeping:  # a busy writer finds it anyway
            self._work.set()

    async def close(self) -> None:
        """Let the writer finish what is queued, then join it (on a thread, not the loop)."""
        self._closing = True
        self._work.set()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, 30.0)

    def _run(self) -> None:
        while True:
            self._sleeping = True
            if not self._pending and not self._closing:
                self._work.wait()
            self._sleeping = False
            self._work.clear()
            while self._pending:
                group = [self._pending.popleft() for _ in range(len(self._pending))]
                error: BaseException | None = None
                try:
                    self.write([record for record, _ in group])
                except Exception as err:  # the group's waiters hear about it
                    error = err
                self.groups += 1
                with contextlib.suppress(RuntimeError):  # a closed loop is gone
                    self.loop.call_soon_threadsafe(self.settle, [item for _, item in group],
                                                   error)
            if self._closing and not self._pending:
                return


class LogFile:
    """The server's one log file: appended (``O_APPEND``, as segments are) or, preallocated,
    overwritten at the next offset; every ``append`` ends with an fdatasync."""

    def __init__(self, path: Path, prealloc: int = 0) -> None:
        self.offset = 0
        self.preallocated = prealloc > 0
        if self.preallocated:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fill(self.fd, prealloc)
        else:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def append(self, records: list[bytes]) -> None:
        """Write ``records`` after what is written and fdatasync (blocking)."""
        data = b"".join(records)
        written = (os.pwrite(self.fd, data, self.offset) if self.preallocated
                   else os.write(self.fd, data))
        if written != len(data):
            raise OSError(f"short write: {written} of {len(data)} bytes")
        self.offset += written
        os.fdatasync(self.fd)

    def close(self) -> None:
        """Close the file."""
        os.close(self.fd)


Pending = tuple[asyncio.Transport, int, bytes]  # publisher, index, frame


class FloorServer:
    """Publishers in, one log file, subscribers out; ``inline`` or ``thread`` durability."""

    def __init__(self, log: LogFile, mode: str) -> None:
        self.log = log
        self.index = 0
        self.subscribers: set[asyncio.Transport] = set()
        self.handoff: Handoff[Pending] | None = None
        if mode == "thread":
            self.handoff = Handoff(asyncio.get_running_loop(), log.append, self.settle)
            self.handoff.start()

    def publish(self, publisher: asyncio.Transport, payloads: list[bytes]) -> None:
        """Frame, make durable and deliver the whole messages one read brought."""
        group: list[Pending] = []
        for payload in payloads:
            self.index += 1
            group.append((publisher, self.index, encode(1, 1, payload, self.index)))
        if self.handoff is not None:
            for pending in group:
                self.handoff.submit(pending[2], pending)
            return
        error: BaseException | None = None
        try:
            self.log.append([frame for _, _, frame in group])  # on the loop: Redis's way
        except OSError as err:
            error = err
        self.settle(group, error)

    def settle(self, group: list[Pending], error: BaseException | None) -> None:
        """Answer the publishers, then send the frames to every subscriber (on the loop)."""
        if error is not None:
            print(f"write failed: {error}", file=sys.stderr, flush=True)
            for publisher, _, _ in group:
                publisher.close()
            return
        for publisher, index, _ in group:
            publisher.write(ACK.pack(index))
        frames = b"".join(frame for _, _, frame in group)
        for subscriber in self.subscribers:
            subscriber.write(frames)

    async def close(self) -> None:
        """Stop the writer thread, if there is one, once it has written what is queued."""
        if self.handoff is not None:
            await self.handoff.close()


class PublisherConnection(asyncio.Protocol):
    """Length-prefixed messages in; each read's whole messages go to the server together."""

    def __init__(self, server: FloorServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        pos, payloads = 0, []
        while len(buf) - pos >= LENGTH.size:
            (length,) = LENGTH.unpack_from(buf, pos)
            end = pos + LENGTH.size + length
            if end > len(buf):
                break
            payloads.append(buf[pos + LENGTH.size:end])
            pos = end
        self._buf = buf[pos:]
        if payloads and self.transport is not None:
            self.server.publish(self.transport, payloads)


class SubscriberConnection(asyncio.Protocol):
    """A connection that receives every frame made durable while it is open."""

    def __init__(self, server: FloorServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.server.subscribers.add(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.server.subscribers.discard(self.transport)


async def serve(publish_port: int, subscribe_port: int, log: LogFile, mode: str) -> None:
    """Listen on both ports of 127.0.0.1, say ``ready``, serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: stop.done() or stop.set_result(None))
    server = FloorServer(log, mode)
    listeners = [
        await loop.create_server(lambda: PublisherConnection(server), "127.0.0.1", publish_port),
        await loop.create_server(lambda: SubscriberConnection(server), "127.0.0.1",
                                 subscribe_port)]
    print("ready", flush=True)
    try:
        await stop
    finally:
        for listener in listeners:
            listener.close()
        for subscriber in list(server.subscribers):
            subscriber.close()
        await server.close()


def main() -> None:
    """The server process: prepare the file, listen, serve until SIGTERM."""
    from messaging.cli.main import event_loop_factory

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("publish_port", type=int)
    p.add_argument("subscribe_port", type=int)
    p.add_argument("file", type=Path)
    p.add_argument("--mode", choices=MODES, default="inline")
    p.add_argument("--prealloc", type=int, default=0, help="zero bytes to preallocate")
    args = p.parse_args()
    log = LogFile(args.file, args.prealloc)  # before the loop runs: preallocating blocks
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(serve(args.publish_port, args.subscribe_port, log, args.mode))
    finally:
        log.close()


# -- the clients ---------------------------------------------------------------------------------

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


if __name__ == "__main__":
    main()
